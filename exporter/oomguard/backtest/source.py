"""A history read from a Prometheus: a query per figure (a preset's, or the user's mapping), range queries over the
window in chunks, each chunk's answers put together into steps. docs/backtest.md, "Prometheus" and "Mapping".

Presets: `dcgm` (dcgm-exporter's framebuffer figures, 4.9's in bytes else 4.8's in MiB, by Hostname or hostname and
gpu, with vLLM's own metrics by pod where the pods are scraped), `nvidia_gpu_exporter` (nvidia_smi_memory_*_bytes,
by instance and uuid) and `oomguard` (oomguard's own series, its targets and its OOM events). A mapping file
overrides any of a preset's keys.

Everything the server controls is bounded: each request by `timeout` (connecting, and the whole answer read by a
deadline), each answer by MAX_ANSWER_BYTES and MAX_SERIES, the window by MAX_STEPS. A refusal (HTTP 403, 500), a
timeout or an answer that is not Prometheus' is a BacktestError naming the server, what it said and the fix.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from oomguard.backtest import BacktestError
from oomguard.backtest.history import (
    ENGINE_FIGURES,
    ENGINE_SETTINGS,
    RATIO_FIGURES,
    EngineRow,
    GpuRow,
    Problems,
    Step,
    number,
)
from oomguard.backtest.ooms import Oom
from oomguard.backtest.parallel import PARALLEL_FROM_STEPS
from oomguard.backtest.regular import check_regular
from oomguard.common.excerpt import excerpt
from oomguard.common.kinds import LOG_OOM_KINDS
from oomguard.exporter.config import ConfigError, StrictModel, explain, read_yaml

MAX_ANSWER_BYTES = 64 * 1024**2  # one chunk's answer to one query
MAX_SERIES = 20_000  # series in one answer: a fleet of thousands of GPUs
MAX_STEPS = 5_000_000  # a window of 2.5 years at 15 s
CHUNK_POINTS = 1_440  # points per series in one range query (6 hours at 15 s): Prometheus allows 11,000
MAX_MAPPING_BYTES = 1024**2
READ_BLOCK = 64 * 1024


class Figure(StrictModel):
    """A figure's query; its value the sample's, or with `label` the value of that label (vLLM's
    gpu_memory_utilization is a label of vllm:cache_config_info)."""

    query: str = Field(min_length=1)
    label: str | None = None


QueryOrFigure = str | Figure | None


class GpuMapping(StrictModel):
    node_label: tuple[str, ...] = ()  # the first of these a series has (non-empty) names its node
    gpu_label: tuple[str, ...] = ("gpu",)  # likewise its GPU
    target_labels: tuple[str, ...] = ()  # joined with "/", the engine using the GPU ("" : none)
    used_bytes: QueryOrFigure = None
    free_bytes: QueryOrFigure = None
    total_bytes: QueryOrFigure = None
    reserved_bytes: QueryOrFigure = None
    engine_used_bytes: QueryOrFigure = None


class EngineMapping(StrictModel):
    target_labels: tuple[str, ...] = ()  # joined with "/": the engine, as the GPUs' target_labels name it
    kv_cache_usage: QueryOrFigure = None
    waiting: QueryOrFigure = None
    running: QueryOrFigure = None
    preemptions_total: QueryOrFigure = None
    gpu_memory_utilization: QueryOrFigure = None
    max_num_seqs: QueryOrFigure = None  # its concurrency cap as started: no engine's /metrics has it


class TargetsMapping(StrictModel):
    """Series that say which engine is on which GPU (oomguard_target_gpu_info), where the GPUs' series do not."""

    query: str = Field(min_length=1)
    node_label: tuple[str, ...] = ()
    gpu_label: tuple[str, ...] = ("gpu",)
    target_labels: tuple[str, ...] = ()


class OomsMapping(StrictModel):
    """A counter of OOMs: each increase is one, at the time of the sample that shows it."""

    query: str = Field(min_length=1)
    target_labels: tuple[str, ...] = ()
    node_label: tuple[str, ...] = ()
    gpu_label: tuple[str, ...] = ()


class Mapping(StrictModel):
    preset: str = ""
    gpu: GpuMapping = GpuMapping()
    engine: EngineMapping = EngineMapping()
    gpu_targets: TargetsMapping | None = None
    ooms: OomsMapping | None = None


_VLLM_POD = "namespace, pod"


def _dcgm_bytes(new: str, old: str) -> str:
    """dcgm-exporter 4.9's byte family where a node's exporter writes it, else 4.8's in MiB (docs/kubernetes.md,
    "dcgm-exporter 4.9 and later"): a fleet half upgraded is read whole, a node whose CSV lists both in bytes. The old
    series gets `hostname` from `Hostname` (renamed in PR #655) so that both match on the exporter and the GPU; the
    driver-version label, renamed in 4.9 and changed by every driver upgrade, is in no match."""
    old_named = f'label_replace({old}, "hostname", "$1", "Hostname", "(.+)")'
    return f"{new} or on (hostname, instance, gpu, GPU_I_ID) {old_named} * 1048576"


PRESETS: dict[str, dict[str, Any]] = {
    "dcgm": {
        "gpu": {
            "node_label": ["Hostname", "hostname", "instance"],
            "gpu_label": ["gpu"],
            # Scraped by a ServiceMonitor (honor_labels false), the GPU's pod is exported_pod; see docs/backtest.md.
            "target_labels": ["exported_namespace", "exported_pod"],
            "used_bytes": _dcgm_bytes("DCGM_FI_DEV_FB_USED_BYTES", "DCGM_FI_DEV_FB_USED"),
            "free_bytes": _dcgm_bytes("DCGM_FI_DEV_FB_FREE_BYTES", "DCGM_FI_DEV_FB_FREE"),
            "reserved_bytes": _dcgm_bytes("DCGM_FI_DEV_FB_RESERVED_BYTES", "DCGM_FI_DEV_FB_RESERVED"),
            # 4.9 and later: the total in bytes; without it (4.8), used + free + reserved.
            "total_bytes": "DCGM_FI_DEV_FB_CAPACITY_BYTES",
        },
        "engine": {
            "target_labels": ["namespace", "pod"],
            "kv_cache_usage": f"max by ({_VLLM_POD}) (vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc)",
            "waiting": f"sum by ({_VLLM_POD}) (vllm:num_requests_waiting)",
            "running": f"sum by ({_VLLM_POD}) (vllm:num_requests_running)",
            "preemptions_total": f"sum by ({_VLLM_POD}) (vllm:num_preemptions_total)",
            "gpu_memory_utilization": {"query": "vllm:cache_config_info", "label": "gpu_memory_utilization"},
        },
    },
    "nvidia_gpu_exporter": {
        "gpu": {
            "node_label": ["instance"],
            "gpu_label": ["uuid"],
            "used_bytes": "nvidia_smi_memory_used_bytes",
            "total_bytes": "nvidia_smi_memory_total_bytes",
        },
    },
    "oomguard": {
        "gpu": {
            "node_label": ["node", "instance"],
            "gpu_label": ["gpu"],
            "used_bytes": "oomguard_gpu_memory_used_bytes",
            "total_bytes": "oomguard_gpu_memory_total_bytes",
            "reserved_bytes": "oomguard_gpu_memory_reserved_bytes",
        },
        "gpu_targets": {
            "query": "oomguard_target_gpu_info",
            "node_label": ["node", "instance"],
            "gpu_label": ["gpu"],
            "target_labels": ["instance", "target"],
        },
        "engine": {
            "target_labels": ["instance", "target"],
            "kv_cache_usage": "max by (instance, target) (oomguard_engine_kv_cache_usage_ratio)",
            "waiting": "sum by (instance, target) (oomguard_engine_requests_waiting)",
            "running": "sum by (instance, target) (oomguard_engine_requests_running)",
            "preemptions_total": "sum by (instance, target) (oomguard_engine_preemptions_total)",
            "gpu_memory_utilization": "max by (instance, target) (oomguard_engine_gpu_memory_utilization_ratio)",
        },
        "ooms": {
            "query": f'sum by (instance, target) (oomguard_target_events_total{{kind=~"{"|".join(LOG_OOM_KINDS)}"}})',
            "target_labels": ["instance", "target"],
        },
    },
}


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(out.get(key), dict) and isinstance(value, dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_mapping(preset: str, path: Path | None) -> Mapping:
    """The preset's queries, with the mapping file's (if any) over them; the file may name its own preset."""
    override: dict[str, Any] = {}
    if path is not None:
        check_regular(path, "mapping", MAX_MAPPING_BYTES)  # a FIFO or /dev/zero: refused before it is read
        loaded = read_yaml(path, "backtest mapping")
        if loaded is not None and not isinstance(loaded, dict):
            raise BacktestError(f"{path}: the top level must be a mapping (keys gpu:, engine:, gpu_targets:, ooms:)")
        override = loaded or {}
        preset = str(override.get("preset") or preset)
    if preset not in PRESETS:
        raise BacktestError(f"preset {excerpt(preset)!r}: one of {', '.join(PRESETS)}")
    raw = _merge({**PRESETS[preset], "preset": preset}, override)
    try:
        mapping = Mapping.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(explain(exc, str(path or preset), Mapping, "backtest mapping")) from None
    if mapping.gpu.used_bytes is None and (mapping.gpu.free_bytes is None or mapping.gpu.total_bytes is None):
        raise BacktestError(
            f"{path or preset}: the mapping reads no GPU memory: give gpu.used_bytes (and total or free)"
        )
    return mapping


# -- HTTP -------------------------------------------------------------------------------------------------------
def get(url: str, timeout: float, what: str, fix: str, limit: int | None = None) -> bytes:
    """The body at `url`, read by a deadline of `timeout` seconds (a server that drips its answer is cut there, not
    at each read's timeout) and within `limit` bytes (MAX_ANSWER_BYTES)."""
    limit = MAX_ANSWER_BYTES if limit is None else limit
    deadline = time.monotonic() + timeout
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            chunks, size = [], 0
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError
                chunk = response.read1(READ_BLOCK)  # what has come, not a whole block: the deadline is checked
                if not chunk:
                    break
                size += len(chunk)
                if size > limit:
                    raise BacktestError(
                        f"{what} answered more than {limit:,} bytes for one query; narrow the mapping's queries "
                        "(fewer series) or the window"
                    )
                chunks.append(chunk)
            return b"".join(chunks)
    except urllib.error.HTTPError as exc:
        detail = ""
        with contextlib.suppress(OSError, TimeoutError):
            detail = exc.read(2000).decode("utf-8", "replace").strip()
        with contextlib.suppress(ValueError, AttributeError):
            detail = json.loads(detail).get("error", detail)
        hint = {
            401: "it asks for credentials: put them in the URL (https://user:pass@host) or use a proxy that adds them",
            403: "it refuses this client: check the URL and the credentials",
        }.get(exc.code, fix)
        raise BacktestError(
            f"{what} answered HTTP {exc.code} {exc.reason}: {excerpt(str(detail), 300)}; {hint}"
        ) from None
    except TimeoutError:
        raise BacktestError(_late(what, timeout)) from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise BacktestError(_late(what, timeout)) from None
        raise BacktestError(
            f"cannot reach {what}: {getattr(exc.reason, 'strerror', None) or exc.reason}; {fix}"
        ) from None
    except (OSError, ValueError) as exc:
        raise BacktestError(f"cannot reach {what}: {exc}; {fix}") from None


def _late(what: str, timeout: float) -> str:
    return f"{what} did not answer within {timeout:g}s; check that it is not overloaded, or pass a longer --timeout"


class PrometheusHistory:
    """The steps of a window of a Prometheus' history, chunk by chunk."""

    def __init__(self, url: str, mapping: Mapping, *, start: float, end: float, step: float, timeout: float) -> None:
        if not url.startswith(("http://", "https://")):
            raise BacktestError(f"--prometheus {excerpt(url)!r}: give its base URL, e.g. http://prometheus:9090")
        if end <= start:
            raise BacktestError("--end is not after --start: give the window to backtest")
        if step < 1:
            raise BacktestError("--step: at least 1s (Prometheus keeps samples to the millisecond, scrapes by seconds)")
        if (end - start) / step > MAX_STEPS:
            raise BacktestError(
                f"{(end - start) / step:,.0f} steps in the window, over {MAX_STEPS:,}: "
                "a longer --step or a shorter window"
            )
        if timeout <= 0:
            raise BacktestError("--timeout: above 0")
        self.base = url.rstrip("/")
        self.mapping = mapping
        self.start, self.end, self.step, self.timeout = start, end, step, timeout
        self.problems = Problems()
        self.large = (end - start) / step >= PARALLEL_FROM_STEPS
        self.what = f"Prometheus at {self.base}"
        self.fix = "check --prometheus (the server's base URL, e.g. http://prometheus:9090) and that it runs"

    def read_share(self, step: Step) -> float | None:
        """How much of the window is read once `step` is, 0-1."""
        span = self.end - self.start
        return min(1.0, max(0.0, (step.t - self.start) / span)) if span > 0 else None

    def describe(self) -> str:
        return f"{self.base} ({self.mapping.preset} preset)"

    def range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        params = urllib.parse.urlencode(
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{self.step:g}"}
        )
        body = get(f"{self.base}/api/v1/query_range?{params}", self.timeout, self.what, self.fix)
        try:
            answer = json.loads(body)
            if answer.get("status") != "success":
                raise BacktestError(f"{self.what} refused {excerpt(expr)!r}: {excerpt(str(answer.get('error')), 300)}")
            result = answer["data"]["result"]
            if len(result) > MAX_SERIES:
                raise BacktestError(
                    f"{self.what} answered {len(result):,} series for {excerpt(expr)!r}, over {MAX_SERIES:,}: narrow "
                    'the query (a mapping with a selector: docs/backtest.md, "Mapping")'
                )
            for series in result:
                if not isinstance(series["metric"], dict) or not isinstance(series["values"], list):
                    raise TypeError
                # [time, "value"] pairs, the time a number in the window: checked here, so that nothing the server
                # sends reaches the replay as anything else.
                series["values"] = [_pair(pair, start, end, self.step) for pair in series["values"]]
            return result
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise BacktestError(
                f"{self.what} did not answer as a Prometheus HTTP API does (/api/v1/query_range); is --prometheus the "
                "Prometheus server itself, not Grafana or an exporter?"
            ) from None

    # -- steps ----------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Step]:
        chunk = self.step * CHUNK_POINTS
        at = self.start
        while at <= self.end:
            until = min(self.end, at + chunk - self.step)
            yield from self._chunk(at, until)
            at = until + self.step

    def _chunk(self, start: float, end: float) -> Iterator[Step]:
        g, e = self.mapping.gpu, self.mapping.engine
        gpus: dict[float, dict[tuple[str, str], GpuRow]] = {}
        for field in ("used_bytes", "free_bytes", "total_bytes", "reserved_bytes", "engine_used_bytes"):
            figure = getattr(g, field)
            for labels, t, value in self._values(figure, start, end, field):
                node, gpu = _first(labels, g.node_label), _first(labels, g.gpu_label)
                if not gpu:
                    continue
                row = gpus.setdefault(t, {}).get((node, gpu))
                if row is None:
                    row = gpus[t][(node, gpu)] = GpuRow(node=node, gpu=gpu)
                target = _joined(labels, g.target_labels)
                if field == "engine_used_bytes":
                    row.add_target(target, value)  # each engine's own (a series each)
                    continue
                # A GPU shared by several pods is a series each, with the same figures (dcgm-exporter's).
                setattr(row, field.removesuffix("_bytes"), value)
                row.add_target(target)
        if self.mapping.gpu_targets is not None:
            m = self.mapping.gpu_targets
            for labels, t, _ in self._values(m.query, start, end, "gpu_targets"):
                row = gpus.get(t, {}).get((_first(labels, m.node_label), _first(labels, m.gpu_label)))
                if row is not None:
                    row.add_target(_joined(labels, m.target_labels))
        engines: dict[float, dict[str, EngineRow]] = {}
        for name in (*ENGINE_FIGURES, *ENGINE_SETTINGS):
            for labels, t, value in self._values(getattr(e, name), start, end, name):
                target = _joined(labels, e.target_labels)
                if not target:
                    continue
                if name in RATIO_FIGURES and value > 1:
                    self.problems.reject(name)
                    continue
                engine = engines.setdefault(t, {}).setdefault(target, EngineRow(target))
                setattr(engine, name, value)
        for t in sorted(set(gpus) | set(engines)):
            rows = list(gpus.get(t, {}).values())
            known = {target for row in rows for target in row.targets}
            # An engine's figures count where its GPUs are known (the join needs them); others are said once.
            step_engines = {k: v for k, v in engines.get(t, {}).items() if k in known}
            for target in known:
                if target not in step_engines:
                    step_engines[target] = EngineRow(target)
            yield Step(t, rows, step_engines)

    def _values(
        self, figure: QueryOrFigure, start: float, end: float, what: str
    ) -> Iterator[tuple[dict, float, float]]:
        if figure is None:
            return
        query, label = (figure, None) if isinstance(figure, str) else (figure.query, figure.label)
        for series in self.range(query, start, end):
            labels = series["metric"]
            for t, raw in series["values"]:
                value = number(labels.get(label) if label else raw)
                if value is None:
                    if label is None and raw not in ("NaN", "+Inf", "-Inf"):
                        self.problems.reject(what)
                    continue
                yield labels, t, value

    # -- OOMs -----------------------------------------------------------------------------------------
    def ooms(self) -> list[Oom]:
        """OOMs from the mapping's counter (oomguard's own OOM events with the oomguard preset): each increase."""
        m = self.mapping.ooms
        if m is None:
            return []
        previous: dict[tuple[tuple[str, str], ...], float] = {}
        out = []
        chunk = self.step * CHUNK_POINTS
        at = self.start
        while at <= self.end:
            until = min(self.end, at + chunk - self.step)
            for series in self.range(m.query, at, until):
                labels = series["metric"]
                key = tuple(sorted(labels.items()))
                for t, raw in series["values"]:
                    value = number(raw)
                    if value is None:
                        continue
                    before = previous.get(key)
                    previous[key] = value
                    # The first sample of a counter is no increase; a drop is a reset: what it shows since is new.
                    if before is not None and value != before:
                        rise = value - before if value > before else value
                        for _ in range(min(math.ceil(rise), 100)):
                            out.append(Oom(
                                float(t), gpu=_first(labels, m.gpu_label), node=_first(labels, m.node_label),
                                target=_joined(labels, m.target_labels), source="Prometheus: " + excerpt(m.query, 80),
                            ))  # fmt: skip
            at = until + self.step
        out.sort(key=lambda o: o.t)
        return out


def _pair(pair: Any, start: float, end: float, step: float) -> tuple[float, Any]:
    """One [time, "value"] of a range query's answer, its time a finite number within the window asked for (a
    step's slack either side); anything else a TypeError (the answer is not Prometheus')."""
    if not isinstance(pair, list | tuple) or len(pair) != 2 or isinstance(pair[0], bool):
        raise TypeError
    t = pair[0]
    if not isinstance(t, int | float) or not math.isfinite(t) or not start - step <= t <= end + step:
        raise TypeError
    return round(float(t), 3), pair[1]


def _first(labels: dict[str, str], names: tuple[str, ...]) -> str:
    for name in names:
        value = labels.get(name)
        if value:
            return excerpt(str(value), 120)
    return ""


def _joined(labels: dict[str, str], names: tuple[str, ...]) -> str:
    if not names:
        return ""
    values = [str(labels.get(name, "")) for name in names]
    return excerpt("/".join(values), 240) if values[-1] else ""
