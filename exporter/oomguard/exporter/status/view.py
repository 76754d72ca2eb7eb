"""The joined view an SRE looks at first: per GPU its memory beside the reservation, trend and time to full; per
target its state, KV cache, queue, budget, last OOM and restart; the sources' health; the pages whose conditions
hold now.

Built from one collection's snapshot (model.Snapshot), the model /metrics is rendered from, with the same figures
and names /metrics shows (the joins of join.py, used / total as exposition/gpu.py writes it, names with their
control characters as visible escapes); web.py builds it once a snapshot for `/` and `/status.json`, which `oomguard
top` reads: one view, two renderers (page.py, top.py). What it judges ("which pages hold now") it judges with the
thresholds it is handed (common/thresholds.py: the bundle's, the numbers the shipped rules are made of, which the
composition root reads), on one reading: conditions, not alerts (a rule's `for:` and Prometheus's evaluation are
not here).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from oomguard.common import thresholds as pages
from oomguard.common.thresholds import Page, Thresholds
from oomguard.common.time_scale import TimeScale
from oomguard.common.visible import ACTING, escape
from oomguard.exporter.exposition.gpu import used_ratio
from oomguard.exporter.model import (
    GPU_SOURCES,
    TARGET_STATES,
    TREND_STATES,
    Counts,
    GpuKey,
    Snapshot,
    TargetMemory,
    TargetReading,
)

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


def build(
    snapshot: Snapshot,
    *,
    history: dict[tuple[str, str], list[float]] | None = None,
    thresholds: Thresholds | None,
    clock: TimeScale | None = None,
) -> StatusView:
    """The view of one collection, its pages judged with `thresholds` (None: none judged, as in a runtime built
    without them) on `clock`, the one its readings ran on (the runtime's: a simulation's is faster; None: the
    thresholds' own). `history`: (node, gpu) -> used / total over the last minutes, for the sparklines."""
    gpus = _gpu_rows(snapshot)
    targets = _target_rows(snapshot)
    sources = {_named(name): bool(result.success) for name, result in snapshot.sources.items()}
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
        taken_at=snapshot.collected_at,
        gpus=gpu_rows[:MAX_GPUS],
        targets=target_rows[:MAX_TARGETS],
        sources=dict(sorted(sources.items())),
        holding=[],
        hidden_gpus=max(0, len(gpu_rows) - MAX_GPUS),
        hidden_targets=max(0, len(target_rows) - MAX_TARGETS),
        thresholds=thresholds.where if thresholds is not None else NO_THRESHOLDS,
    )
    if thresholds is not None:
        view.holding = holding(gpu_rows, list(targets.values()), view.taken_at, thresholds, clock)
    return view


def _named(value: str) -> str:
    """A name (a target's, a pod's, a node's, a GPU's, a source's) as /metrics shows it and Prometheus reads it back:
    its control characters, line separators and bidi controls written as visible escapes (exposition/encoder.py),
    a line feed kept (the text format's own escape)."""
    if value.isprintable():
        return value
    return ACTING.sub(lambda match: match[0] if match[0] == "\n" else escape(match[0]), value)


def _figure(value: float | None) -> float | None:
    """A figure the page shows: none where the reading has none, or NaN (which /metrics writes and no page shows)."""
    return None if value is None or math.isnan(value) else float(value)


def _gpu_rows(snapshot: Snapshot) -> dict[GpuKey, GpuRow]:
    """Each GPU's row, by its named (node, gpu), in the order the GPU source read them: its memory where a GPU source
    ran (as /metrics has it), the engines' reservation on it, its trend while trends are sampled."""
    rows: dict[GpuKey, GpuRow] = {}

    def row(key: GpuKey) -> GpuRow:
        named = (_named(key[0]), _named(key[1]))
        return rows.setdefault(named, GpuRow(*named))

    readings = snapshot.gpus
    if readings is not None and any(source in snapshot.sources for source in GPU_SOURCES):
        for gpu in readings.gpus:
            _set(row(gpu.key), total_bytes=gpu.total_bytes, used_bytes=gpu.used_bytes)
    for key, joined in snapshot.gpu_memory.items():
        _set(row(key), reserved_bytes=joined.reserved_bytes, beyond_bytes=joined.unreserved_used_bytes,
             headroom_used=joined.headroom_used_ratio)  # fmt: skip
    if snapshot.trend_samples_total is not None:
        for key, reading in snapshot.trends.items():
            if key.kind == "gpu":
                gpu_row = row((key.node, key.name))
                if reading.trend.state in TREND_STATES:
                    gpu_row.trend = reading.trend.state
                _set(gpu_row, seconds_to_full=reading.trend.seconds_to_full)
    return rows


def _target_rows(snapshot: Snapshot) -> dict[str, TargetRow]:
    """Each target's row, by its named name."""
    rows: dict[str, TargetRow] = {}
    kinds_of: dict[str, set[str]] = {}  # target -> the event kinds its sources can see (counted from 0)
    for health in snapshot.event_sources:
        kinds_of.setdefault(health.target, set()).update(health.kinds)
    pods = {t.name: t.pod for t in snapshot.targets if t.pod}  # a name's series carry its last pod's labels
    for target in snapshot.targets:
        row = rows.setdefault(_named(target.name), TargetRow(_named(target.name)))
        pod = pods.get(target.name)
        if pod is not None and pod.name and not row.pod:
            row.pod = f"{_named(pod.namespace)}/{_named(pod.name)}"
        row.engine, row.url = _named(target.engine), _named(target.url)
        if target.state in TARGET_STATES:
            row.state = target.state
        _engine_figures(row, target)
        _memory(row, snapshot.memory.get(target.name))
        _events(row, snapshot.events.get(target.name) or Counts(), kinds_of.get(target.name, set()))
        row.restarts = float(target.restarts_total)
        _set(row, last_restart_at=target.last_restart_at, startup_seconds=target.startup_seconds,
             probe_grace_seconds=target.pod.probe_grace_seconds if target.pod else None)  # fmt: skip
    return rows


def _engine_figures(row: TargetRow, target: TargetReading) -> None:
    """What the engine says of its queue and KV cache: summed over its served models, the fullest KV cache. A target
    whose leader another exporter reads has none here (model.PodRef), as in /metrics."""
    reading = target.engine_reading
    if reading is None or (target.pod is not None and target.pod.leader_elsewhere):
        return
    for model in reading.models:
        if (kv := _figure(model.kv_cache_usage_ratio)) is not None:
            row.kv_cache = max(row.kv_cache or 0.0, kv)
        for attr, value in (("waiting", model.requests_waiting), ("running", model.requests_running),
                            ("preemptions", model.preemptions_total)):  # fmt: skip
            if (figure := _figure(value)) is not None:
                setattr(row, attr, (getattr(row, attr) or 0.0) + figure)


def _memory(row: TargetRow, memory: TargetMemory | None) -> None:
    """The target's GPUs, and its worst GPU's use against its budget where that GPU is measured."""
    if memory is None:
        return
    row.gpus.extend(f"{_named(gpu)}@{_named(node)}" if node else _named(gpu) for node, gpu in memory.gpus)
    if memory.used_bytes is not None and memory.total_bytes:
        _set(row, used_bytes=memory.used_bytes, budget_bytes=memory.budget_bytes)


def _events(row: TargetRow, counts: Counts, kinds: set[str]) -> None:
    """Its OOMs, of every kind, and the last one's time and kind (the first kind by name at a tie)."""
    for kind in sorted(kinds | counts.total.keys()):
        if kind not in OOM_KINDS:
            continue
        row.ooms += float(counts.total.get(kind, 0))
        at = _figure(counts.last.get(kind))
        if at is not None and (row.last_oom_at is None or at > row.last_oom_at):
            row.last_oom_at, row.last_oom_kind = at, kind


def _set(row: GpuRow | TargetRow, **figures: float | None) -> None:
    """Each figure the reading has (a NaN is none: the row keeps what it had)."""
    for attr, value in figures.items():
        if (figure := _figure(value)) is not None:
            setattr(row, attr, figure)


def _gpu_pressure(row: GpuRow) -> float:
    """What sorts the worst first: the headroom used where a reservation is known, else used / total."""
    return row.headroom_used if row.headroom_used is not None else (row.used_ratio or 0.0)


def holding(
    gpus: list[GpuRow], targets: list[TargetRow], now: float, th: Thresholds, clock: TimeScale | None = None
) -> list[Holding]:
    """The shipped alerts' conditions that hold on this reading, pages first, as their declarations judge them
    (common/thresholds.py, which the rules' template renders too): what was measured (a time to full, an event's age,
    real seconds) said on `clock`, the one the readings ran on (the runtime's; None: the thresholds' own, the clock
    of the rules rendered from them), before it is judged against the thresholds, written in the scenario's
    seconds."""
    out: list[Holding] = []
    clock = clock if clock is not None else TimeScale(th.time_scale)
    for g in gpus:
        to_full = clock.simulated(g.seconds_to_full) if g.seconds_to_full is not None else None
        met = pages.gpu_page(pages.GpuNow(g.headroom_used, g.used_ratio, to_full), th)
        if met is not None:
            out.append(_gpu_holding(th.page(met.declaration.key), g, met, clock))
    oom, storm = th.page(pages.OOM_EVENT.key), th.page(pages.RESTART_STORM.key)
    for t in targets:
        if t.last_oom_at is not None and pages.oom_event(clock.simulated(now - t.last_oom_at), th):
            out.append(Holding(oom.name, oom.severity, t.name,
                               f"{t.last_oom_kind} {duration(now - t.last_oom_at)} ago"))  # fmt: skip
        if t.last_restart_at is not None and pages.restart_storm(t.restarts, clock.simulated(now - t.last_restart_at),
                                                                 th):  # fmt: skip
            out.append(Holding(storm.name, storm.severity, t.name,
                               f"{t.restarts:.0f} restarts in all, the last {duration(now - t.last_restart_at)} ago "
                               f"(the rule counts {th.restart_storm_count} within its window: one reading has only "
                               "the last one's time)"))  # fmt: skip
    return sorted(out, key=lambda h: (h.severity != "critical", h.alert, h.subject))


def _gpu_holding(page: Page, g: GpuRow, met: pages.Met, clock: TimeScale) -> Holding:
    """A GPU's page, in the words the page shows (durations in real seconds, as its figures are)."""
    if met.declaration is pages.EXHAUSTED_SOON:
        why = (f"full in {duration(g.seconds_to_full or 0.0)} at this pace "
               f"(pages under {duration(clock.real(met.threshold))})")  # fmt: skip
    elif met.basis == "headroom":
        why = f"{met.value:.0%} of the headroom the reservation leaves is used (pages at {met.threshold:.0%})"
    else:
        why = f"{met.value:.1%} of the GPU used, no reservation known (pages at {met.threshold:.0%})"
    return Holding(page.name, page.severity, f"GPU {g.name}", why)


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
