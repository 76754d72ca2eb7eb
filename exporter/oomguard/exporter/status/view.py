"""The joined view an SRE looks at first: per GPU its memory beside the reservation, trend and time to full; per
target its state, KV cache, queue, budget, last OOM and restart; the sources' health; the pages whose conditions
hold now.

Built from an exporter's exposition (its /metrics text), the same input whether the status page renders it in the
exporter or `oomguard top` reads it from a URL: one view, two renderers (page.py, top.py). What it judges
("which pages hold now") it judges with the thresholds it is handed (common/thresholds.py: the bundle's, the numbers
the shipped rules are made of, which the composition root reads), on one reading: conditions, not alerts (a rule's
`for:` and Prometheus's evaluation are not here).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from oomguard.common.thresholds import Thresholds
from oomguard.common.time_scale import TimeScale
from oomguard.exporter.exposition.gpu import used_ratio

Sample = tuple[str, dict[str, str], float]
RowOf = Callable[[dict[str, str]], Any]  # a series' labels -> the row it fills
Setter = Callable[[RowOf, dict[str, str], float], None]
MAX_GPUS = 64  # the worst shown: a cluster's exporter holds thousands; the page and the terminal stay readable
MAX_TARGETS = 64
NO_THRESHOLDS = "none given: no pages judged"  # a runtime built without the bundle's thresholds


@dataclass
class GpuRow:
    node: str
    gpu: str  # its label: an index, or "<parent>/<GPU instance>" for a MIG instance
    total_bytes: float | None = None
    used_bytes: float | None = None
    reserved_bytes: float | None = None  # the engines' reservation on it (gpu_memory_utilization x total)
    beyond_bytes: float | None = None  # use beyond the reservation (what may grow: what runs out)
    headroom_used: float | None = None  # beyond / (total - reserved): what the memory pages judge
    trend: str = ""  # steady, sawtooth, climbing, spike, saturated; "" while unknown
    seconds_to_full: float | None = None
    targets: list[str] = field(default_factory=list)
    spark: list[float] = field(default_factory=list)  # used / total over the last minutes, oldest first

    @property
    def used_ratio(self) -> float | None:
        if self.used_bytes is None or not self.total_bytes:
            return None
        return used_ratio(self.used_bytes, self.total_bytes)

    @property
    def name(self) -> str:
        return f"{self.gpu}@{self.node}" if self.node else self.gpu

    def segments(self) -> tuple[float, float, float]:
        """(reserved, beyond, free) as shares of the GPU, for the bar: without a reservation, all used is
        `beyond` (nothing says which of it is held on purpose)."""
        total = self.total_bytes or 0.0
        if total <= 0 or self.used_bytes is None:
            return 0.0, 0.0, 1.0
        reserved = min(self.reserved_bytes or 0.0, total)
        beyond = self.beyond_bytes if self.beyond_bytes is not None else max(0.0, self.used_bytes - reserved)
        beyond = min(beyond, total - reserved)
        return reserved / total, beyond / total, max(0.0, 1 - (reserved + beyond) / total)


@dataclass
class TargetRow:
    name: str
    engine: str = ""
    url: str = ""
    pod: str = ""  # namespace/pod of a discovered target
    state: str = ""  # up, loading, down
    kv_cache: float | None = None
    waiting: float | None = None
    running: float | None = None
    preemptions: float | None = None
    budget_bytes: float | None = None
    used_bytes: float | None = None  # its worst GPU's
    last_oom_at: float | None = None
    last_oom_kind: str = ""
    ooms: float = 0.0
    restarts: float = 0.0
    last_restart_at: float | None = None
    startup_seconds: float | None = None
    probe_grace_seconds: float | None = None
    gpus: list[str] = field(default_factory=list)


@dataclass
class Holding:
    """A shipped alert whose condition holds on this reading."""

    alert: str
    severity: str
    subject: str  # the GPU or the target
    why: str


@dataclass
class StatusView:
    taken_at: float
    gpus: list[GpuRow]
    targets: list[TargetRow]
    sources: dict[str, bool]
    holding: list[Holding]
    hidden_gpus: int = 0
    hidden_targets: int = 0
    thresholds: str = ""  # where the thresholds come from

    def to_json(self) -> dict[str, object]:
        return asdict(self)


OOM_KINDS = ("cuda_oom", "startup_memory", "container_oom_killed", "cgroup_oom_kill")


def parse(text: str) -> list[Sample]:
    """The samples of the families the view reads (a cluster's exposition is megabytes, most of it other families:
    those lines are passed over before the parser); raises ValueError on text that is not the Prometheus format.

    Lines end at a line feed alone, as the format's do: a label value may hold CR, NEL or U+2028 raw, where
    `str.splitlines()` would end a line (and a model's name took the page down)."""
    lines = text.split("\n")
    wanted = [line for line in lines if line and line[0] != "#" and _name(line) in READ]
    if not wanted and text.strip() and not any(line.startswith("#") for line in lines):
        wanted = lines  # not an exposition at all: the parser says why
    body = "\n".join(wanted) + "\n"
    return [(s.name, dict(s.labels), float(s.value)) for f in text_string_to_metric_families(body) for s in f.samples]


def _name(line: str) -> str:
    end = len(line)
    for mark in ("{", " "):
        at = line.find(mark)
        if 0 <= at < end:
            end = at
    return line[:end]


def build(
    samples: Iterable[Sample],
    *,
    now: float | None = None,
    history: dict[tuple[str, str], list[float]] | None = None,
    thresholds: Thresholds | None,
) -> StatusView:
    """The view of one reading, its pages judged with `thresholds` (None: none judged, as in a runtime built without
    them). `history`: (node, gpu) -> used / total over the last minutes, for the sparklines."""
    gpus: dict[tuple[str, str], GpuRow] = {}
    targets: dict[str, TargetRow] = {}
    sources: dict[str, bool] = {}

    def gpu(labels: dict[str, str]) -> GpuRow:
        key = (labels.get("node", ""), labels.get("gpu", ""))
        return gpus.setdefault(key, GpuRow(*key))

    def target(labels: dict[str, str]) -> TargetRow:
        name = labels.get("target", "")
        row = targets.setdefault(name, TargetRow(name))
        if labels.get("pod") and not row.pod:
            row.pod = f"{labels.get('namespace', '')}/{labels['pod']}"
        return row

    for name, labels, value in samples:
        if math.isnan(value):
            continue
        if name in _GPU_FIELDS:
            _GPU_FIELDS[name](gpu, labels, value)
        elif name in _TARGET_FIELDS:
            _TARGET_FIELDS[name](target, labels, value)
        elif name == "oomguard_source_success":
            sources[labels.get("source", "")] = value == 1
    for row in targets.values():
        for g in row.gpus:
            key = tuple(g.split("@", 1)[::-1]) if "@" in g else ("", g)
            if key in gpus:
                gpus[key].targets.append(row.name)
    for key, row in gpus.items():
        row.spark = list((history or {}).get(key, ()))
    gpu_rows = sorted((g for g in gpus.values() if g.total_bytes), key=_gpu_pressure, reverse=True)
    target_rows = sorted(targets.values(), key=lambda t: (t.state == "up", t.name))
    view = StatusView(
        taken_at=now if now is not None else time.time(),
        gpus=gpu_rows[:MAX_GPUS],
        targets=target_rows[:MAX_TARGETS],
        sources=dict(sorted(sources.items())),
        holding=[],
        hidden_gpus=max(0, len(gpu_rows) - MAX_GPUS),
        hidden_targets=max(0, len(target_rows) - MAX_TARGETS),
        thresholds=thresholds.where if thresholds is not None else NO_THRESHOLDS,
    )
    if thresholds is not None:
        view.holding = holding(gpu_rows, list(targets.values()), view.taken_at, thresholds)
    return view


def _gpu_pressure(row: GpuRow) -> float:
    """What sorts the worst first: the headroom used where a reservation is known, else used / total."""
    return row.headroom_used if row.headroom_used is not None else (row.used_ratio or 0.0)


def holding(gpus: list[GpuRow], targets: list[TargetRow], now: float, th: Thresholds) -> list[Holding]:
    """The shipped alerts' conditions that hold on this reading, pages first."""
    out: list[Holding] = []
    page = {p.key: p for p in th.pages}
    critical, soon = page["gpu_memory_critical"], page["exhausted_soon"]
    # The thresholds' durations on the clock the readings run on (the rules' own: the bundle's time scale).
    clock = TimeScale(th.time_scale)
    exhausted_soon = clock.real(th.exhausted_soon_seconds)
    for g in gpus:
        # As the rules judge them: a GPU the trend gives a time to full is ExhaustedSoon's (on its headroom, or with
        # min_total_ratio of its total used); Critical holds on one that climbs no further.
        if g.seconds_to_full is not None:
            judged = g.headroom_used is not None or (g.used_ratio or 0.0) >= th.exhausted_soon_min_total
            if g.seconds_to_full < exhausted_soon and judged:
                out.append(Holding(soon.name, soon.severity, f"GPU {g.name}",
                                   f"full in {duration(g.seconds_to_full)} at this pace "
                                   f"(pages under {duration(exhausted_soon)})"))  # fmt: skip
        elif g.headroom_used is not None and g.headroom_used > th.headroom_critical:
            out.append(Holding(critical.name, critical.severity, f"GPU {g.name}",
                               f"{g.headroom_used:.0%} of the headroom the reservation leaves is used "
                               f"(pages at {th.headroom_critical:.0%})"))  # fmt: skip
        elif g.headroom_used is None and (ratio := g.used_ratio) is not None and ratio > th.used_critical:
            out.append(Holding(critical.name, critical.severity, f"GPU {g.name}",
                               f"{ratio:.1%} of the GPU used, no reservation known "
                               f"(pages at {th.used_critical:.0%})"))  # fmt: skip
    oom, storm = page["oom_event"], page["restart_storm"]
    window = clock.real(th.oom_window_seconds)
    for t in targets:
        if t.last_oom_at is not None and now - t.last_oom_at <= window:
            out.append(Holding(oom.name, oom.severity, t.name,
                               f"{t.last_oom_kind} {duration(now - t.last_oom_at)} ago"))  # fmt: skip
        storm_window = clock.real(th.restart_storm_window_seconds)
        if t.restarts >= th.restart_storm_count and t.last_restart_at is not None \
                and now - t.last_restart_at <= storm_window:  # fmt: skip
            out.append(Holding(storm.name, storm.severity, t.name,
                               f"{t.restarts:.0f} restarts in all, the last {duration(now - t.last_restart_at)} ago "
                               f"(the rule counts {th.restart_storm_count} within its window: one reading has only "
                               "the last one's time)"))  # fmt: skip
    return sorted(out, key=lambda h: (h.severity != "critical", h.alert, h.subject))


def gpu_level(gpu: GpuRow, held: list[Holding]) -> str:
    """How the page colours a GPU's memory figures: as what holds on it (`holding`), the rules' judgement, not a
    share of its own: "bad" while a critical alert's condition holds on it, "warn" while another's does or past half
    its headroom, else "ok". A page holding beside a green figure, or red with nothing paging, said two things."""
    severities = {h.severity for h in held if h.subject == f"GPU {gpu.name}"}
    if "critical" in severities:
        return "bad"
    if severities or (gpu.headroom_used if gpu.headroom_used is not None else 0.0) >= 0.5:
        return "warn"
    return "ok"


def duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _set(attr: str) -> Setter:
    def setter(row_of: RowOf, labels: dict[str, str], value: float) -> None:
        setattr(row_of(labels), attr, value)

    return setter


def _trend(row_of: RowOf, labels: dict[str, str], value: float) -> None:
    if value == 1:
        row_of(labels).trend = labels.get("state", "")


def _target_info(row_of: RowOf, labels: dict[str, str], value: float) -> None:
    row = row_of(labels)
    row.engine, row.url = labels.get("engine", ""), labels.get("url", "")


def _target_state(row_of: RowOf, labels: dict[str, str], value: float) -> None:
    if value == 1:
        row_of(labels).state = labels.get("state", "")


def _target_gpu(row_of: RowOf, labels: dict[str, str], value: float) -> None:
    node, gpu = labels.get("node", ""), labels.get("gpu", "")
    row_of(labels).gpus.append(f"{gpu}@{node}" if node else gpu)


def _sum(attr: str) -> Setter:
    # per-model series of one target add up
    def setter(row_of: RowOf, labels: dict[str, str], value: float) -> None:
        row = row_of(labels)
        setattr(row, attr, (getattr(row, attr) or 0.0) + value)

    return setter


def _max(attr: str) -> Setter:
    def setter(row_of: RowOf, labels: dict[str, str], value: float) -> None:
        row = row_of(labels)
        setattr(row, attr, max(getattr(row, attr) or 0.0, value))

    return setter


def _events(row_of: RowOf, labels: dict[str, str], value: float) -> None:
    if labels.get("kind") in OOM_KINDS:
        row_of(labels).ooms += value


def _last_event(row_of: RowOf, labels: dict[str, str], value: float) -> None:
    row = row_of(labels)
    if labels.get("kind") in OOM_KINDS and (row.last_oom_at is None or value > row.last_oom_at):
        row.last_oom_at, row.last_oom_kind = value, labels.get("kind", "")


_GPU_FIELDS = {
    "oomguard_gpu_memory_total_bytes": _set("total_bytes"),
    "oomguard_gpu_memory_used_bytes": _set("used_bytes"),
    "oomguard_gpu_memory_engine_reserved_bytes": _set("reserved_bytes"),
    "oomguard_gpu_memory_unreserved_used_bytes": _set("beyond_bytes"),
    "oomguard_gpu_memory_headroom_used_ratio": _set("headroom_used"),
    "oomguard_gpu_memory_trend_state": _trend,
    "oomguard_gpu_memory_seconds_to_full": _set("seconds_to_full"),
}
_TARGET_FIELDS = {
    "oomguard_target_info": _target_info,
    "oomguard_target_state": _target_state,
    "oomguard_target_gpu_info": _target_gpu,
    "oomguard_engine_kv_cache_usage_ratio": _max("kv_cache"),
    "oomguard_engine_requests_waiting": _sum("waiting"),
    "oomguard_engine_requests_running": _sum("running"),
    "oomguard_engine_preemptions_total": _sum("preemptions"),
    "oomguard_target_memory_budget_bytes": _set("budget_bytes"),
    "oomguard_target_gpu_memory_used_bytes": _set("used_bytes"),
    "oomguard_target_events_total": _events,
    "oomguard_target_last_event_timestamp_seconds": _last_event,
    "oomguard_target_restarts_total": _set("restarts"),
    "oomguard_target_last_restart_timestamp_seconds": _set("last_restart_at"),
    "oomguard_target_startup_seconds": _set("startup_seconds"),
    "oomguard_target_probe_grace_seconds": _set("probe_grace_seconds"),
}
READ = frozenset({*_GPU_FIELDS, *_TARGET_FIELDS, "oomguard_source_success"})
