"""Read oomguard's own raw series, from a Prometheus HTTP API (history) or one exporter's /metrics (now).

Blocking urllib on purpose: `oomguard diagnose` is a plain synchronous command, never on an event loop.
Every failure becomes a `DiagnoseError` whose message names the problem and the fix (exit status 2).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

# The exporter's raw series the diagnosis reads; never the bundle's recording rules.
METRICS = (
    "oomguard_gpu_memory_used_bytes",
    "oomguard_gpu_memory_total_bytes",
    "oomguard_gpu_memory_used_ratio",
    "oomguard_gpu_memory_engine_reserved_bytes",
    "oomguard_gpu_memory_engine_used_bytes",
    "oomguard_gpu_memory_unreserved_used_bytes",
    "oomguard_gpu_memory_headroom_used_ratio",
    "oomguard_gpu_memory_other_used_bytes",
    "oomguard_gpu_memory_engine_over_reservation_bytes",
    "oomguard_gpu_memory_trend_state",
    # The present as the shipped pages judge it (thresholds.py): GpuMemoryExhaustedSoon, TargetMemoryOverBudget's
    # ratio, RestartStorm's last restart.
    "oomguard_gpu_memory_seconds_to_full",
    "oomguard_target_gpu_memory_total_bytes",
    "oomguard_target_last_restart_timestamp_seconds",
    "oomguard_target_info",
    "oomguard_target_gpu_info",
    "oomguard_engine_kv_cache_usage_ratio",
    "oomguard_engine_requests_waiting",
    "oomguard_engine_requests_running",
    "oomguard_engine_preemptions_total",
    "oomguard_engine_gpu_memory_utilization_ratio",
    "oomguard_engine_kv_cache_memory_bytes",
    "oomguard_engine_setting",
    "oomguard_target_events_total",
    "oomguard_target_last_event_timestamp_seconds",
    "oomguard_target_restarts_total",
    "oomguard_target_startup_seconds",
    "oomguard_target_state",
    "oomguard_target_memory_trend_state",
    "oomguard_target_memory_over_budget_bytes",
    # Where the per-GPU join is missing, step 1 is judged on these (evidence.py's fallback).
    "oomguard_target_memory_budget_bytes",
    "oomguard_target_process_gpu_memory_bytes",
)
# At most this many points per series: Prometheus refuses more than 11,000.
MAX_POINTS = 1000


class DiagnoseError(Exception):
    """The diagnosis could not run; the message says what failed and how to fix it."""


@dataclass
class Series:
    name: str
    labels: dict[str, str]
    points: list[tuple[float, float]] = field(default_factory=list)  # (unix time, value), time ascending

    def values(self) -> list[float]:
        return [v for _, v in self.points if not math.isnan(v)]


@dataclass
class Data:
    """Everything read: the series, the window, and whether it is a history or one reading."""

    series: list[Series]
    start: float
    end: float
    history: bool
    source: str  # "prometheus URL" or "exporter URL"

    def select(self, name: str, **labels: str) -> list[Series]:
        return [s for s in self.series if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


# A range query of one target over a day is a few MB; an answer larger than this is not one to parse whole.
MAX_ANSWER_BYTES = 256 * 1024 * 1024


def _get(url: str, timeout: float, what: str, fix: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read(MAX_ANSWER_BYTES + 1)
            if len(body) > MAX_ANSWER_BYTES:
                raise DiagnoseError(f"{what} answered more than {MAX_ANSWER_BYTES:,} bytes; {fix} (a shorter --window)")
            return body
    except urllib.error.HTTPError as exc:
        detail = exc.read(500).decode("utf-8", "replace").strip()
        with contextlib.suppress(ValueError, AttributeError):
            detail = json.loads(detail).get("error", detail)
        raise DiagnoseError(f"{what} answered HTTP {exc.code} {exc.reason}: {detail[:300]}; {fix}") from None
    except TimeoutError:
        raise DiagnoseError(
            f"{what} did not answer within {timeout:g}s; check that it is not overloaded, "
            "or pass a shorter --window or a longer --timeout"
        ) from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            raise DiagnoseError(
                f"{what} did not answer within {timeout:g}s; check that it is not overloaded, "
                "or pass a shorter --window or a longer --timeout"
            ) from None
        raise DiagnoseError(f"cannot reach {what}: {getattr(reason, 'strerror', None) or reason}; {fix}") from None
    except OSError as exc:
        raise DiagnoseError(f"cannot reach {what}: {exc}; {fix}") from None


def _selector(instance: str | None) -> str:
    names = "|".join(METRICS)
    matchers = [f'__name__=~"{names}"']
    if instance:
        matchers.append(f'instance="{instance}"')
    return "{" + ",".join(matchers) + "}"


def query_step(start: float, end: float, time_scale: float = 1.0) -> float:
    """The query's step in real seconds: (end - start) / MAX_POINTS rounded up to whole seconds of the scenario's
    clock, at least one (on a drill's clock `time_scale` times faster, one simulated second is 1 / time_scale),
    and to whole milliseconds, Prometheus' resolution."""
    simulated = max(1.0, math.ceil(round((end - start) * time_scale / MAX_POINTS, 9)))
    return math.ceil(round(simulated / time_scale * 1000, 6)) / 1000


def fetch_prometheus(
    url: str,
    *,
    start: float,
    end: float,
    instance: str | None = None,
    timeout: float = 10.0,
    time_scale: float = 1.0,
) -> Data:
    """One query_range for every raw series over [start, end] (Unix seconds, as Prometheus stores them)."""
    base = url.rstrip("/")
    step = query_step(start, end, time_scale)
    params = urllib.parse.urlencode(
        {"query": _selector(instance), "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    )
    what = f"Prometheus at {base}"
    fix = "check --prometheus (the server's base URL, e.g. http://prometheus:9090) and that it is running"
    body = _get(f"{base}/api/v1/query_range?{params}", timeout, what, fix)
    try:
        answer = json.loads(body)
        if answer.get("status") != "success":
            raise DiagnoseError(f"{what} refused the query: {answer.get('error', answer)}")
        result = answer["data"]["result"]
        series = []
        for item in result:
            labels = dict(item["metric"])
            name = labels.pop("__name__")
            if not all(isinstance(text, str) for text in (name, *labels, *labels.values())):
                raise TypeError("a metric name or label that is not a string")
            points = [(_time(t), _value(v)) for t, v in item["values"]]
            series.append(Series(name, labels, points))
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError):
        raise DiagnoseError(
            f"{what} did not answer as a Prometheus HTTP API does (/api/v1/query_range); "
            "is --prometheus the Prometheus server itself, not Grafana or an exporter?"
        ) from None
    return Data(series, start, end, history=True, source=f"prometheus {base}")


def _time(value: object) -> float:
    """A sample's time: a finite number of Unix seconds."""
    t = float(value)  # type: ignore[arg-type]
    if not math.isfinite(t):
        raise ValueError(f"time {value!r}")
    return t


def _value(value: object) -> float:
    """A sample's value; ±Inf is no reading, as NaN is (the diagnosis skips NaN, and cannot reason on infinity)."""
    v = float(value)  # type: ignore[arg-type]
    return v if math.isfinite(v) else math.nan


def fetch_exporter(url: str, *, timeout: float = 10.0, now: float | None = None) -> Data:
    """One reading of one exporter's /metrics: no history, every series a single point at `now`."""
    base = url.rstrip("/")
    metrics_url = base if base.endswith("/metrics") else f"{base}/metrics"
    what = f"the exporter at {metrics_url}"
    fix = "check --exporter (oomguard's address, e.g. http://host:9847) and that oomguard serve runs"
    text = _get(metrics_url, timeout, what, fix).decode("utf-8", "replace")
    instance = urllib.parse.urlsplit(metrics_url).netloc
    try:
        return exporter_data(text, instance=instance, now=now, source=f"exporter {metrics_url}")
    except ValueError as exc:
        raise DiagnoseError(f"{what} did not answer in the Prometheus text format ({exc}); is it oomguard?") from None


def exporter_data(text: str, *, instance: str, now: float | None = None, source: str = "") -> Data:
    """One exporter's exposition `text`, read once at `now` (default the time now), its series labelled with
    `instance` as Prometheus would; raises ValueError for a text that is not the Prometheus text format."""
    now = time.time() if now is None else now
    wanted = set(METRICS)
    series: list[Series] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                labels = dict(sample.labels) | {"instance": instance}
                series.append(Series(sample.name, labels, [(now, _value(sample.value))]))
    return Data(series, now, now, history=False, source=source or f"exporter {instance}")
