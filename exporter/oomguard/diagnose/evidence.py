"""The facts of one target (or one GPU), and the evidence items in the postmortem's order.

1. the memory trend; 2. the engine log for OOMs; 3. the concurrency and memory configuration;
4. the probe timing against the startup time. Facts are plain figures the verdict and the
recommendations read; evidence items are what the report prints, each with its figure and time.

Times are Unix seconds as Prometheus stamped them; durations in `Facts` are seconds of the scenario's clock
(`TimeScale.simulated`: the same on a real history), and thresholds in seconds are judged on real time
(`TimeScale.real`).

The thresholds the shipped rules have (memory at the top, a saturated KV cache, a queue, the pages' conditions, the
two-knob check) are the bundle configuration's (thresholds.py), carried in `Facts.thresholds`; those below are
diagnose's own judgements, which no rule makes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from oomguard.bundle.thresholds import (
    CRITICAL_KEY,
    EXHAUSTED_SOON_KEY,
    OOM_EVENT_KEY,
    OVER_BUDGET_KEY,
    RESTART_STORM_KEY,
    Page,
    Thresholds,
    default_thresholds,
)
from oomguard.common import kinds
from oomguard.common import thresholds as pages
from oomguard.common.time_scale import REAL, TimeScale
from oomguard.diagnose import capacity
from oomguard.diagnose.capacity import Check, Setting
from oomguard.diagnose.query import Data, Series

QUESTIONS = {
    1: "memory trend",
    2: "engine log: OOMs",
    3: "concurrency and memory configuration",
    4: "probe timing vs startup",
}
OOM_KINDS = (kinds.CUDA_OOM, kinds.CGROUP_OOM_KILL)
# The memory pages: a reading where one of their conditions holds has memory in trouble.
MEMORY_PAGES = (CRITICAL_KEY, OVER_BUDGET_KEY, EXHAUSTED_SOON_KEY)
FOREIGN_GROWTH = 0.05  # another process grew by this share of the GPU...
WITHIN_RESERVATION = 0.02  # ...while the engine stayed within its reservation but this share
CLIMB_MIN_RISE = 0.03  # docs/trend.md's climb_min_rise_ratio
CLIMB_MAX_FALLBACK = 0.02  # docs/trend.md's tolerance_ratio
CLIMB_MIN_SECONDS = 600.0  # simulated seconds: judged as TimeScale.real(CLIMB_MIN_SECONDS)
RESTART_DROP = 0.3  # a fall of this share of the GPU between two points is a process exiting

# The per-GPU join (join.py's join_gpu), written where an engine's reservation on the GPU is known. Where it is
# missing (an older exporter's history, a GPU whose join could not be written), step 1 is derived from the
# target-level series instead, with the same arithmetic, and the confidence lowered.
JOIN_SERIES = (
    "oomguard_gpu_memory_engine_reserved_bytes",
    "oomguard_gpu_memory_engine_used_bytes",
    "oomguard_gpu_memory_engine_over_reservation_bytes",
    "oomguard_gpu_memory_other_used_bytes",
    "oomguard_gpu_memory_unreserved_used_bytes",
    "oomguard_gpu_memory_headroom_used_ratio",
)
BUDGET = "oomguard_target_memory_budget_bytes"
OWN = "oomguard_target_process_gpu_memory_bytes"
OVER_BUDGET = "oomguard_target_memory_over_budget_bytes"
UTILIZATION = "oomguard_engine_gpu_memory_utilization_ratio"
# What step 1's memory figures were judged on (Facts.memory_evidence):
GPU_JOIN = "gpu_join"  # the per-GPU join
TARGET_LEVEL = "target_level"  # the fallback: the target's budget and its own processes' memory
GPU_USED = "gpu_used"  # no reservation known: used / total alone, as the exporter judges such a GPU
# The confidence where the fallback stood in for the join: the same arithmetic on coarser series (one budget per
# target, its processes summed over its GPUs); lower still where its own processes' memory is unknown too, and
# the engine cannot be told apart from other processes.
FALLBACK_FACTOR = 0.9
UNATTRIBUTED_FACTOR = 0.8


Points = list[tuple[float, float]]


@dataclass
class Item:
    step: int  # 1-4, the postmortem's question
    finding: str
    value: float | None = None
    unit: str = ""
    at: float | None = None  # unix time the figure refers to

    def json(self) -> dict:
        return {
            "step": self.step,
            "question": QUESTIONS[self.step],
            "finding": self.finding,
            "value": None if self.value is None or not math.isfinite(self.value) else round(self.value, 6),
            "unit": self.unit,
            "at": self.at,
        }


@dataclass
class Facts:
    target: str | None
    instance: str | None
    gpus: list[str]
    history: bool
    start: float
    end: float
    # 1. memory
    memory: Points = field(default_factory=list)  # worst GPU's used/total
    worst_gpu: str | None = None  # the GPU judged: the highest used / total
    per_gpu: dict[str, Points] = field(default_factory=dict)
    # Each GPU's share of the headroom its engines' reservation leaves in use, where the exporter wrote it (the join)
    # and, on the worst GPU without the join, as the fallback derives it: what GpuMemoryCritical judges it on.
    per_gpu_headroom: dict[str, Points] = field(default_factory=dict)
    exported_headroom: set[str] = field(default_factory=set)  # the GPUs whose headroom the exporter wrote
    total_bytes: float | None = None
    reserved_ratio: float | None = None  # the engines' reservation / total on the worst GPU
    # Use beyond the reservation / total, and the share of the headroom in use: the largest over a history, the
    # value now from one reading (no peak is known then).
    unreserved_peak_ratio: float | None = None
    headroom_used_peak: float | None = None
    other_growth_ratio: float | None = None  # other processes' growth / total
    other_peak_ratio: float | None = None
    engine_over_reservation_peak_ratio: float | None = None
    over_budget_peak_bytes: float | None = None
    over_budget_now_ratio: float | None = None  # over budget now / the target's worst GPU's total (the rule's)
    # The exporter's time to full on the target's GPUs now (the last point), the soonest; simulated seconds.
    seconds_to_full: float | None = None
    per_gpu_seconds_to_full: dict[str, float] = field(default_factory=dict)  # each GPU's, where it has one
    trend_states: dict[str, float] = field(default_factory=dict)  # state -> first time seen (1)
    # (rise ratio, simulated seconds, start time) of a climb that never fell
    climb: tuple[float, float, float] | None = None
    # 2. events
    events: dict[str, list[float]] = field(default_factory=dict)  # kind -> times
    last_event_at: dict[str, float] = field(default_factory=dict)  # kind -> its last event's time, as exported
    event_counts: dict[str, float] = field(default_factory=dict)
    restarts: list[float] = field(default_factory=list)
    restart_count: float = 0.0
    restarts_since_start: float = 0.0  # the counter's value (since the exporter started), for one reading's pages
    last_restart_at: float | None = None  # oomguard_target_last_restart_timestamp_seconds
    # 3. engine
    kv: Points = field(default_factory=list)
    waiting: Points = field(default_factory=list)
    running: Points = field(default_factory=list)
    preemptions: float = 0.0
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: float | None = None
    engine: str | None = None  # oomguard_target_info's engine label
    settings: dict[str, Setting] = field(default_factory=dict)  # oomguard_engine_setting, by setting
    max_num_seqs_given: int | None = None  # diagnose's --max-num-seqs, where no series says it
    # 4. startup
    startup_seconds: float | None = None  # simulated seconds (the exporter measures it on the real clock)
    up_fraction: float | None = None
    ever_up: bool | None = None
    states: Points = field(default_factory=list)  # 1 up, 0 loading/down
    clock: TimeScale = REAL  # the clock the history was recorded on (a drill's is compressed)
    # What the diagnosis read: GPU_JOIN, TARGET_LEVEL or GPU_USED (None without memory series); the series found
    # for this target or GPU, and those step 1 looked for and did not find.
    memory_evidence: str | None = None
    evidence_used: set[str] = field(default_factory=set)
    evidence_missing: list[str] = field(default_factory=list)
    thresholds: Thresholds = field(default_factory=default_thresholds)  # the bundle configuration's

    # Derived figures the verdict and recommendations share.
    @property
    def has_memory(self) -> bool:
        return bool(self.memory)

    @property
    def has_engine(self) -> bool:
        return bool(self.kv or self.waiting or self.running)

    @property
    def peak(self) -> tuple[float, float] | None:
        return max(self.memory, key=lambda p: p[1]) if self.memory else None

    @property
    def kv_peak(self) -> float | None:
        return max((v for _, v in self.kv), default=None)

    @property
    def waiting_peak(self) -> float | None:
        return max((v for _, v in self.waiting), default=None)

    @property
    def kv_saturated(self) -> bool:
        """KV cache use at or above the bundle's kv_cache_saturated threshold."""
        return (self.kv_peak or 0.0) >= self.thresholds.kv_saturated

    @property
    def backlog(self) -> bool:
        """More requests waiting than the bundle's queue_backlog threshold, or requests preempted."""
        return (self.waiting_peak or 0.0) > self.thresholds.queue_backlog or self.preemptions > 0

    @property
    def ooms(self) -> float:
        return sum(self.event_counts.get(k, 0.0) for k in OOM_KINDS)

    @property
    def oom_times(self) -> list[float]:
        return sorted(t for k in OOM_KINDS for t in self.events.get(k, []))

    @property
    def running_at_saturation(self) -> float | None:
        """Median running requests while the KV cache was saturated (else at the KV cache's peak)."""
        running = dict(self.running)
        if not running or not self.kv:
            return None
        saturated = [running[t] for t, v in self.kv if v >= self.thresholds.kv_saturated and t in running]
        if saturated:
            return statistics.median(saturated)
        t_peak = max(self.kv, key=lambda p: p[1])[0]
        return running.get(t_peak)

    @property
    def kv_at_saturation(self) -> float | None:
        values = [v for _, v in self.kv if v >= self.thresholds.kv_saturated]
        return statistics.median(values) if values else self.kv_peak

    def judged(self, gpu: str) -> tuple[Points, float, str]:
        """What GpuMemoryCritical judges a GPU on: (its points, the threshold, what they are). The share of the
        headroom its engines' reservation leaves in use where that is known (vLLM at 0.95 shows 95.6 % used all day:
        that is its reservation, not the top), else used / total."""
        t = self.thresholds
        headroom = self.per_gpu_headroom.get(gpu)
        if headroom:
            return headroom, t.headroom_critical, "of the headroom the reservation leaves in use"
        return self.per_gpu.get(gpu, []), t.used_critical, "of the GPU in use, no reservation known"

    @property
    def memory_top(self) -> bool:
        """Memory at the top: above GpuMemoryCritical's threshold on one of the GPUs (the bundle's
        gpu_memory_critical: headroom_threshold where a reservation is known, else threshold), at any point of a
        history, or now in one reading: the state the shipped rules page on."""
        for gpu in self.per_gpu:
            points, threshold, _ = self.judged(gpu)
            if any(v > threshold for _, v in points):
                return True
        return False

    @property
    def paging(self) -> list[tuple[Page, str]]:
        """The shipped alerts (thresholds.py's pages) whose conditions hold in one reading of an exporter, each with
        the figures that meet it; [] for a history, whose verdict is the window's. As the rules judge them:
        GpuMemoryCritical above its threshold on a GPU the trend gives no time to full (one that climbs is
        GpuMemoryExhaustedSoon's to judge; its `for:` and "not falling" are not known from one reading),
        TargetMemoryOverBudget above its margin, GpuMemoryExhaustedSoon below its time to full on a GPU judged on its
        headroom or with at least its min_total_ratio used, OomEvent with an OOM within its window, and RestartStorm
        may hold with at least its count of restarts since the exporter started, the last within its window (one
        reading cannot count those of the window alone)."""
        if self.history:
            return []
        t, out = self.thresholds, []
        for gpu in sorted(self.per_gpu):
            met = pages.gpu_page(self._now(gpu), t)
            if met is not None and met.declaration is pages.CRITICAL:
                what = ("of the headroom the reservation leaves in use" if met.basis == "headroom"
                        else "of the GPU in use, no reservation known")  # fmt: skip
                out.append((t.page(CRITICAL_KEY), f"GPU {gpu}: {_pct(met.value)} {what}, above {_pct(met.threshold)}"))
                break
        if pages.over_budget(self.over_budget_now_ratio, t):
            out.append((t.page(OVER_BUDGET_KEY), f"{_pct(self.over_budget_now_ratio or 0.0)} of the GPU beyond the "
                        f"engine's budget, above {_pct(t.over_budget_margin)}"))  # fmt: skip
        for gpu, to_full in sorted(self.per_gpu_seconds_to_full.items(), key=lambda item: item[1]):
            if pages.gpu_page(self._now(gpu), t) is not None:
                out.append((t.page(EXHAUSTED_SOON_KEY), f"GPU {gpu}: full in {_duration(to_full)} at the current "
                                                    f"pace, under {_duration(t.exhausted_soon_seconds)}"))  # fmt: skip
                break
        for kind in kinds.LOG_OOM_KINDS:
            last = self.last_event_at.get(kind)
            if self.event_counts.get(kind) and pages.oom_event(self._age(last), t):
                when = "at an unknown time" if last is None else f"within {_duration(t.oom_window_seconds)}"
                out.append((t.page(OOM_EVENT_KEY), f"{kind} {when}"))
                break
        # An exporter without the restart's timestamp (an older one): its time is not known, so it may be recent.
        if pages.restart_storm(self.restarts_since_start, self._age(self.last_restart_at), t):
            window = _duration(t.restart_storm_window_seconds)
            out.append((t.page(RESTART_STORM_KEY), f"may hold: {self.restarts_since_start:g} restarts since the "
                        f"exporter started, the last within {window} (it pages at {t.restart_storm_count} within "
                        "it)"))  # fmt: skip
        return out

    def _now(self, gpu: str) -> pages.GpuNow:
        """A GPU in one reading, as the rules read it: the headroom where the exporter wrote it, its used / total,
        the trend's time to full (in the scenario's seconds)."""
        headroom = self.per_gpu_headroom.get(gpu) if gpu in self.exported_headroom else None
        used = self.per_gpu.get(gpu)
        return pages.GpuNow(headroom[-1][1] if headroom else None, used[-1][1] if used else None,
                            self.per_gpu_seconds_to_full.get(gpu))  # fmt: skip

    def _age(self, at: float | None) -> float | None:
        """How long before the reading `at` was, in the scenario's seconds (None: not known)."""
        return None if at is None else self.clock.simulated(self.end - at)

    @property
    def memory_paging(self) -> list[tuple[Page, str]]:
        """The memory pages among `paging`: those the bundle routes as pages (severity critical; TargetMemoryOverBudget
        is a ticket in the shipped bundle)."""
        return [(page, why) for page, why in self.paging if page.key in MEMORY_PAGES and page.pages]

    @property
    def other_rise_ratio(self) -> float:
        """Other processes' share of the GPU as the verdict weighs it: their growth over a history; what they hold
        now from one reading, which has no growth to see."""
        return (self.other_growth_ratio if self.history else self.other_peak_ratio) or 0.0

    @property
    def foreign_growth(self) -> bool:
        return (
            self.other_rise_ratio >= FOREIGN_GROWTH
            and (self.engine_over_reservation_peak_ratio or 0.0) <= WITHIN_RESERVATION
        )

    @property
    def climbing(self) -> bool:
        return "climbing" in self.trend_states or self.climb is not None

    @property
    def evidence_factor(self) -> float:
        """What the confidence is multiplied by for the evidence step 1 stood on (1 on the join)."""
        if self.memory_evidence != TARGET_LEVEL:
            return 1.0
        return UNATTRIBUTED_FACTOR if OWN in self.evidence_missing else FALLBACK_FACTOR

    @property
    def capacity_points(self) -> Points:
        """(time, running / KV use) where enough requests run to size the cache (capacity.py)."""
        t = self.thresholds
        return capacity.capacity_points(self.running, self.kv, t.min_running, t.min_kv_usage)

    @property
    def capacity_check(self) -> Check:
        """The engine's concurrency cap against the requests its KV cache held (capacity.py)."""
        # An engine oomguard knows of but without a cap of this kind (llama.cpp, Triton): no name to ask for.
        unnamed = ("", None) if self.engine else ("max_num_seqs", None)
        cap_name, reservation_name = capacity.ENGINE_KNOBS.get(self.engine or "", unnamed)
        cap = capacity.pick(self.settings, capacity.CONCURRENCY_SETTINGS, cap_name)
        if cap is None and self.max_num_seqs_given:
            cap = Setting(cap_name or "max_num_seqs", float(self.max_num_seqs_given), "--max-num-seqs")
        if cap is not None:
            cap_name = cap.name
        reservation = capacity.pick(self.settings, capacity.RESERVATION_SETTINGS, reservation_name)
        if reservation is None and self.gpu_memory_utilization is not None:
            # The engine's own /metrics (vLLM's cache_config_info, SGLang's server info): no origin to tell.
            reservation = Setting(reservation_name or "gpu_memory_utilization", self.gpu_memory_utilization, "")
        t = self.thresholds
        return Check(capacity.capacity(self.capacity_points, self.history, t.quantile), len(self.capacity_points),
                     cap, cap_name, reservation, self.preemptions, t.margin, t.reservation_high)  # fmt: skip


# ---- series arithmetic -------------------------------------------------------------------------


def merge(series: list[Series], how: str = "max") -> Points:
    """One point per timestamp over several series (max, sum or mean)."""
    by_time: dict[float, list[float]] = {}
    for s in series:
        for t, v in s.points:
            if not math.isnan(v):
                by_time.setdefault(t, []).append(v)
    reduce = {"max": max, "sum": sum, "mean": statistics.fmean}[how]
    return [(t, float(reduce(vs))) for t, vs in sorted(by_time.items())]


def increases(points: Points, start: float, include_first: bool = False) -> tuple[float, list[float]]:
    """A counter's increase and the times it rose; a fall is a reset (the exporter restarted)."""
    total, times = 0.0, []
    previous = None
    for t, v in points:
        if previous is None:
            if include_first and v > 0:
                total += v
                times.append(t)
        else:
            delta = v - previous if v >= previous else v
            if delta > 0:
                total += delta
                times.append(t)
        previous = v
    return total, times


def _lives(memory: Points) -> list[Points]:
    """The series cut at each restart (a fall of 30 % of the GPU between two points)."""
    lives, begin = [], 0
    for i in range(1, len(memory)):
        if memory[i - 1][1] - memory[i][1] >= RESTART_DROP:
            lives.append(memory[begin:i])
            begin = i
    lives.append(memory[begin:])
    return lives


def _climb(memory: Points, clock: TimeScale = REAL) -> tuple[float, float, float] | None:
    """The largest climb of one life: >= 3 % over >= 10 (simulated) min, never falling back more than 2 %.

    Returns (rise, its length in simulated seconds, its start time)."""
    found = []
    for life in _lives(memory):
        if len(life) < 8:
            continue
        # Skip the loading ramp: the climb starts where the life first reaches its serving level.
        top = max(v for _, v in life)
        start = next(i for i, (_, v) in enumerate(life) if v >= 0.5 * top)
        climb = _climb_of(life[start + 1 :], clock.real(CLIMB_MIN_SECONDS))
        if climb:
            rise, seconds, since = climb
            found.append((rise, clock.simulated(seconds), since))
    return max(found, default=None)


def _climb_of(life: Points, min_seconds: float = CLIMB_MIN_SECONDS) -> tuple[float, float, float] | None:
    """(rise, real seconds, start time) of a climb over `min_seconds` (real) or more, or None."""
    if len(life) < 8 or life[-1][0] - life[0][0] < min_seconds:
        return None
    values = [v for _, v in life]
    edge = max(3, len(values) // 10)
    rise = statistics.median(values[-edge:]) - statistics.median(values[:edge])
    running_max, fallback = values[0], 0.0
    for v in values:
        running_max = max(running_max, v)
        fallback = max(fallback, running_max - v)
    half = values[len(values) // 2 :]
    if rise >= CLIMB_MIN_RISE and fallback <= CLIMB_MAX_FALLBACK and half[-1] - half[0] >= CLIMB_MIN_RISE / 2:
        return rise, life[-1][0] - life[0][0], life[0][0]
    return None


def _first_time(points: Points, test) -> float | None:
    return next((t for t, v in points if test(v)), None)


def _ratio(points: Points, total: float | None) -> Points:
    return [(t, v / total) for t, v in points] if total else []


def _attribute(facts: Facts, reserved: Points, unreserved: Points, headroom: Points, other: Points,
               over: Points) -> None:  # fmt: skip
    """Step 1's figures from the engines' reservation and the use beyond it (bytes; headroom a ratio)."""
    total = facts.total_bytes
    if total:
        # More than the whole GPU is no reading (an unsigned figure wrapped, a broken source): never a recommendation.
        unreserved, over, other = ([p for p in points if p[1] <= total] for points in (unreserved, over, other))
    if reserved and total:
        facts.reserved_ratio = max(v for _, v in reserved) / total
    if unreserved and total:
        facts.unreserved_peak_ratio = max(v for _, v in unreserved) / total
    if headroom:
        facts.headroom_used_peak = max(v for _, v in headroom)
        if facts.worst_gpu is not None:
            facts.per_gpu_headroom[facts.worst_gpu] = headroom
    others = _ratio(other, total)
    if others:
        peak_i = max(range(len(others)), key=lambda i: others[i][1])
        facts.other_peak_ratio = others[peak_i][1]
        facts.other_growth_ratio = others[peak_i][1] - min(v for _, v in others[: peak_i + 1])
    beyond = _ratio(over, total)
    if beyond:
        facts.engine_over_reservation_peak_ratio = max(v for _, v in beyond)


def _fallback(facts: Facts, select: Callable[..., list[Series]], on: dict[str, str], used_ratio: Points) -> None:
    """The per-GPU join derived from the target-level series, as join.py's join_gpu computes it, for a target whose
    worst GPU has no join series: its budget (else gpu_memory_utilization x total) is the reservation, its own
    processes' memory (oomguard_target_process_gpu_memory_bytes) the engine's use, the rest of the GPU's use the
    others'. Without its own processes' memory, everything above the reservation may grow (join_gpu's else)."""
    total = facts.total_bytes
    if not total or total <= 0:
        return
    reserved = dict(merge(select(BUDGET, **on)))
    if not reserved:
        reserved = {t: v * total for t, v in merge(select(UTILIZATION, **on))}
    if not reserved:
        return  # no reservation known: no join was due, used / total is the judgement (GPU_USED)
    own = dict(merge(select(OWN, **on)))
    if len(facts.gpus) > 1 and own:
        # Own memory is summed over the target's GPUs; over-budget is its largest per GPU: own on that GPU.
        over_budget = dict(merge(select(OVER_BUDGET, **on)))
        own = {t: reserved[t] + over_budget[t] for t in own if t in reserved and t in over_budget}
    used = {t: v * total for t, v in used_ratio}
    unreserved, headroom, other, over = [], [], [], []
    for t, mine_reserved in sorted(reserved.items()):
        if t not in used:
            continue
        mine = own.get(t)
        if mine is not None:
            beyond, others = max(0.0, mine - mine_reserved), max(0.0, used[t] - mine)
            over.append((t, beyond))
            other.append((t, others))
            free = beyond + others
        else:
            free = max(0.0, used[t] - mine_reserved)
        room = total - mine_reserved
        unreserved.append((t, free))
        headroom.append((t, free / room if room > 0 else float(free > 0)))
    facts.memory_evidence = TARGET_LEVEL
    facts.evidence_missing = [*JOIN_SERIES, *(name for name in (BUDGET, OWN) if name not in facts.evidence_used)]
    _attribute(facts, sorted(reserved.items()), unreserved, headroom, other, over)


# ---- gathering ---------------------------------------------------------------------------------


def gpu_id(labels: dict[str, str]) -> str:
    """A GPU as a diagnosis names it: its index, and its node where the series carry one (`0@node-a`): in the cluster
    mode one exporter holds many nodes' GPU 0."""
    node = labels.get("node", "")
    return f"{labels['gpu']}@{node}" if node else labels["gpu"]


def gpu_labels(gpu: str) -> dict[str, str]:
    """The labels of a GPU named by `gpu_id`."""
    index, _, node = gpu.partition("@")
    return {"gpu": index, "node": node} if node else {"gpu": index}


class _Reader:
    """The series of one diagnosis's data, each name found recorded in its facts' `evidence_used`."""

    def __init__(self, data: Data, facts: Facts, where: dict[str, str]) -> None:
        self.data, self.facts, self.where = data, facts, where

    def select(self, name: str, **labels: str) -> list[Series]:
        found = self.data.select(name, **labels)
        if any(s.values() for s in found):
            self.facts.evidence_used.add(name)
        return found

    def gpu(self, name: str, gpu: str) -> list[Series]:
        return self.select(name, **gpu_labels(gpu), **self.where)

    def merged(self, name: str, how: str = "max", **labels: str) -> Points:
        return merge(self.select(name, **labels), how)


def gather(
    data: Data,
    instance: str | None,
    target: str | None,
    gpus: list[str],
    clock: TimeScale = REAL,
    thresholds: Thresholds | None = None,
) -> Facts:
    """The facts of one target (its GPUs) or, with `target` None, of one GPU, read on `clock`, to be judged on
    `thresholds` (the bundle configuration's; its defaults' when None)."""
    facts = Facts(target, instance, gpus, data.history, data.start, data.end, clock=clock,
                  thresholds=thresholds or default_thresholds())  # fmt: skip
    where = {"instance": instance} if instance is not None else {}
    read = _Reader(data, facts, where)
    # 1. memory, per GPU then the worst GPU's
    _memory_per_gpu(facts, read)
    _headroom_per_gpu(facts, read)
    _time_to_full(facts, read)
    if facts.worst_gpu is not None:
        _worst_gpu_join(facts, read, facts.worst_gpu)
    _trend_states(facts, read)
    if data.history:
        facts.climb = _climb(facts.memory, clock)
    if target is None:
        return facts
    on = {"target": target, **where}
    _over_budget(facts, read, on)
    # 2. events from the engine's log and the kernel, restarts
    _events(facts, read, on)
    _restarts(facts, read, on)
    # 3. the engine's concurrency and configuration
    _engine_load(facts, read, on)
    if facts.memory_evidence == GPU_USED and facts.worst_gpu is not None:
        _fallback(facts, read.select, on, facts.per_gpu[facts.worst_gpu])
    if facts.reserved_ratio is None and facts.gpu_memory_utilization is not None:
        facts.reserved_ratio = facts.gpu_memory_utilization
    _engine_settings(facts, read, on)
    # 4. startup and state
    _startup_and_state(facts, read, on)
    return facts


def _memory_per_gpu(facts: Facts, read: _Reader) -> None:
    """Each GPU's used / total (from the bytes where the ratio is not written), their max, and the worst GPU: the
    highest peak."""
    worst_gpu, worst_peak = None, -1.0
    for gpu in facts.gpus:
        ratio = merge(read.gpu("oomguard_gpu_memory_used_ratio", gpu))
        if not ratio:
            used = dict(merge(read.gpu("oomguard_gpu_memory_used_bytes", gpu)))
            total = dict(merge(read.gpu("oomguard_gpu_memory_total_bytes", gpu)))
            ratio = [(t, used[t] / total[t]) for t in sorted(used) if total.get(t)]
        if ratio:
            facts.per_gpu[gpu] = ratio
            peak = max(v for _, v in ratio)
            if peak > worst_peak:
                worst_gpu, worst_peak = gpu, peak
    if facts.per_gpu:
        facts.memory = merge([Series("", {}, pts) for pts in facts.per_gpu.values()])
    facts.worst_gpu = worst_gpu


def _headroom_per_gpu(facts: Facts, read: _Reader) -> None:
    """The share of the headroom in use, on each GPU the exporter wrote it for."""
    for gpu in facts.per_gpu:
        headroom = merge(read.gpu("oomguard_gpu_memory_headroom_used_ratio", gpu))
        if headroom:
            facts.per_gpu_headroom[gpu] = headroom
            facts.exported_headroom.add(gpu)


def _time_to_full(facts: Facts, read: _Reader) -> None:
    """The exporter's time to full (it has one only while it calls a climb or a spike): the soonest of the GPUs
    now."""
    for gpu in facts.gpus:
        points = merge(read.gpu("oomguard_gpu_memory_seconds_to_full", gpu))
        if points and math.isfinite(points[-1][1]) and points[-1][1] >= 0:
            facts.per_gpu_seconds_to_full[gpu] = facts.clock.simulated(points[-1][1])
    if facts.per_gpu_seconds_to_full:
        facts.seconds_to_full = min(facts.per_gpu_seconds_to_full.values())


def _worst_gpu_join(facts: Facts, read: _Reader, worst_gpu: str) -> None:
    """The worst GPU's total and step 1's figures from its per-GPU join (GPU_JOIN), else GPU_USED until the
    fallback finds a reservation."""
    totals = [v for _, v in merge(read.gpu("oomguard_gpu_memory_total_bytes", worst_gpu))]
    facts.total_bytes = totals[-1] if totals else None
    joined = {name: merge(read.gpu(name, worst_gpu)) for name in JOIN_SERIES}
    if any(joined.values()):
        facts.memory_evidence = GPU_JOIN
        # An unattributed join (an engine whose pids NVML does not list) has no engine_used, over, other.
        facts.evidence_missing = [name for name in JOIN_SERIES if not joined[name]]
        reserved, _, over, other, unreserved, headroom = (joined[name] for name in JOIN_SERIES)
        _attribute(facts, reserved, unreserved, headroom, other, over)
    else:
        facts.memory_evidence = GPU_USED  # until the fallback finds a reservation (gather)


def _trend_states(facts: Facts, read: _Reader) -> None:
    """Each trend state the GPUs (and the target) were in, with the first time it was seen."""
    trend = [s for g in facts.gpus for s in read.gpu("oomguard_gpu_memory_trend_state", g)]
    if facts.target is not None:
        trend += read.select("oomguard_target_memory_trend_state", target=facts.target, memory="gpu", **read.where)
    for s in trend:
        first = _first_time(s.points, lambda v: v >= 1)
        state = s.labels.get("state", "")
        if first is not None and (state not in facts.trend_states or first < facts.trend_states[state]):
            facts.trend_states[state] = first


def _over_budget(facts: Facts, read: _Reader, on: dict[str, str]) -> None:
    """The target's peak over its budget, and TargetMemoryOverBudget's ratio: over budget / the target's worst
    GPU's total, now."""
    over_budget = read.merged("oomguard_target_memory_over_budget_bytes", **on)
    if not over_budget:
        return
    facts.over_budget_peak_bytes = max(v for _, v in over_budget)
    target_total = [v for _, v in read.merged("oomguard_target_gpu_memory_total_bytes", **on) if v > 0]
    total = target_total[-1] if target_total else facts.total_bytes
    if total and over_budget[-1][1] <= total:
        facts.over_budget_now_ratio = over_budget[-1][1] / total


def _events(facts: Facts, read: _Reader, on: dict[str, str]) -> None:
    """Each kind of event's count and times from its counter, corrected by its last event's timestamp."""
    data = read.data
    for kind in kinds.TARGET_EVENT_KINDS:
        counter = read.merged("oomguard_target_events_total", "sum", kind=kind, **on)
        count, times = increases(counter, data.start, include_first=not data.history)
        last = read.merged("oomguard_target_last_event_timestamp_seconds", kind=kind, **on)
        last_at = max((v for _, v in last), default=0.0)
        if data.history and count == 0 and data.start <= last_at <= data.end:
            # The counter's first increment is invisible to a difference; the timestamp is not.
            count, times = 1.0, [last_at]
        if times and last_at and data.start <= last_at <= data.end and last_at < times[-1]:
            times[-1] = last_at  # the exact time of the last one
        if counter or last:
            facts.event_counts[kind] = count
            facts.events[kind] = times
        if last_at:
            facts.last_event_at[kind] = last_at


def _restarts(facts: Facts, read: _Reader, on: dict[str, str]) -> None:
    data = read.data
    restarts = read.merged("oomguard_target_restarts_total", "sum", **on)
    facts.restart_count, facts.restarts = increases(restarts, data.start, include_first=not data.history)
    facts.restarts_since_start = restarts[-1][1] if restarts else 0.0
    last_restart = [v for _, v in read.merged("oomguard_target_last_restart_timestamp_seconds", **on) if v > 0]
    facts.last_restart_at = max(last_restart) if last_restart else None


def _engine_load(facts: Facts, read: _Reader, on: dict[str, str]) -> None:
    """The engine's KV cache, queue, running requests, preemptions and memory settings from its /metrics."""
    data = read.data
    facts.kv = read.merged("oomguard_engine_kv_cache_usage_ratio", "mean", **on)
    facts.waiting = read.merged("oomguard_engine_requests_waiting", "sum", **on)
    facts.running = read.merged("oomguard_engine_requests_running", "sum", **on)
    preempt = read.merged("oomguard_engine_preemptions_total", "sum", **on)
    facts.preemptions = increases(preempt, data.start, include_first=not data.history)[0]
    util = [v for _, v in read.merged("oomguard_engine_gpu_memory_utilization_ratio", **on)]
    facts.gpu_memory_utilization = util[-1] if util else None
    kv_bytes = [v for _, v in read.merged("oomguard_engine_kv_cache_memory_bytes", **on)]
    facts.kv_cache_memory_bytes = kv_bytes[-1] if kv_bytes else None


def _engine_settings(facts: Facts, read: _Reader, on: dict[str, str]) -> None:
    """The engine's name and its settings as started (oomguard_engine_setting), each its last positive value."""
    info = read.select("oomguard_target_info", **on)
    facts.engine = next((s.labels["engine"] for s in info if s.labels.get("engine")), None)
    for s in read.select("oomguard_engine_setting", **on):
        name, values = s.labels.get("setting"), [v for v in s.values() if math.isfinite(v) and v > 0]
        if name and values:
            facts.settings[name] = Setting(name, values[-1], s.labels.get("origin", ""))
            facts.engine = facts.engine or s.labels.get("engine") or None


def _startup_and_state(facts: Facts, read: _Reader, on: dict[str, str]) -> None:
    startup = [v for _, v in read.merged("oomguard_target_startup_seconds", **on)]
    facts.startup_seconds = facts.clock.simulated(max(startup)) if startup else None
    up = read.merged("oomguard_target_state", state="up", **on)
    if up:
        facts.states = up
        facts.up_fraction = sum(v for _, v in up) / len(up)
        facts.ever_up = any(v >= 1 for _, v in up)


# ---- evidence, in the postmortem's order -------------------------------------------------------


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _duration(seconds: float) -> str:
    """30 min, 90 s, 1.5 h: a duration in words, to the unit that reads best."""
    if seconds >= 5400:
        return f"{seconds / 3600:g} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def setting_text(s: Setting) -> str:
    """`max_num_seqs 256 (flag)`: the value and where it was read."""
    origin = {"flag": "its command line", "default": "the engine's default", "--max-num-seqs": "--max-num-seqs"}
    where = origin.get(s.origin, "its metrics" if not s.origin else s.origin)
    return f"{s.name} {s.value:g} ({where})"


def _capacity_items(facts: Facts) -> list[Item]:
    """Step 3's two-knob check: the concurrency cap against the requests the KV cache held (capacity.py)."""
    check, t = facts.capacity_check, facts.thresholds
    items = []
    if check.capacity is None:
        items.append(Item(3, f"the KV cache's capacity in requests is not known: {check.samples} point(s) with "
                             f">= {t.min_running:g} requests running and >= {_pct(t.min_kv_usage)} of "
                             f"the cache in use (at least {capacity.MIN_SAMPLES} needed)"))  # fmt: skip
    else:
        items.append(Item(3, f"the KV cache held at most {check.capacity:.1f} requests of the observed size "
                             f"(running / KV cache use, its {t.quantile:g} quantile over {check.samples} "
                             f"point(s) with >= {t.min_running:g} running)", check.capacity,
                          "requests"))  # fmt: skip
    if check.cap is None and not check.cap_name:
        items.append(
            Item(
                3,
                f"{facts.engine} has no concurrency cap of the kind compared here (max_num_seqs, "
                "max_running_requests; llama.cpp's parallel splits its context between its slots)",
            )
        )
        return items
    if check.cap is None:
        flag = capacity.FLAGS.get(check.cap_name, f"--{check.cap_name.replace('_', '-')}")
        items.append(Item(3, f"{check.cap_name} unknown: no oomguard_engine_setting series for it. oomguard reads "
                             f"it from a local engine's command line: start the engine with {flag} set (a default that "
                             "depends on the version or the GPU is not guessed), or pass --max-num-seqs to "
                             "diagnose"))  # fmt: skip
        return items
    ratio = check.ratio
    if ratio is None:
        items.append(Item(3, f"{setting_text(check.cap)}: not compared, the KV cache's capacity is not known",
                          check.cap.value, "requests"))  # fmt: skip
        return items
    reservation = "reservation unknown"
    if check.reservation is not None:
        word = ">=" if check.reservation_high else "<"
        reservation = (f"{check.reservation.name} {check.reservation.value:g} {word} {t.reservation_high:g}: "
                       + ("the cache cannot grow, the cap must come down" if check.reservation_high
                          else "room to grow the cache, up to 15 % headroom"))  # fmt: skip
    if check.over and not check.flagged:
        text = (f"{setting_text(check.cap)} is {ratio:.1f}x the requests the KV cache holds now: one reading "
                "judges nothing, a history does (--prometheus)")  # fmt: skip
    elif check.over:
        corroborated = (f"{check.preemptions:g} preemption(s) confirm it" if check.preemptions
                        else "no preemption yet: the load has not reached it")  # fmt: skip
        text = (
            f"{setting_text(check.cap)} admits {ratio:.1f}x the requests the KV cache held (over "
            f"{1 + t.margin:g}x): more concurrency than the cache holds; {reservation}; {corroborated}"
        )
    else:
        text = (
            f"{setting_text(check.cap)} is {ratio:.1f}x the requests the KV cache held: within "
            f"{1 + t.margin:g}x, the cap fits the cache"
        )
    items.append(Item(3, text, ratio, "ratio"))
    return items


def _fallback_text(facts: Facts) -> str:
    """What step 1 stood on where the per-GPU join was missing, and what that costs the confidence."""
    join = ", ".join(name for name in facts.evidence_missing if name in JOIN_SERIES)
    budget = BUDGET if BUDGET in facts.evidence_used else f"{UTILIZATION} x the GPU's total ({BUDGET} missing)"
    text = f"no per-GPU join series ({join}) on the worst GPU: the reservation is the target's budget, {budget}"
    if OWN in facts.evidence_missing:
        text += (f"; {OWN} missing too: whose memory is whose is unknown, so all use above the reservation counts "
                 "as headroom in use, and other processes are not told apart from the engine")  # fmt: skip
    else:
        text += f"; the engine's own use is {OWN}, the rest of the GPU's use the other processes'"
    return text + f"; confidence x{facts.evidence_factor:g}"


def _pages_item(facts: Facts) -> Item:
    """One reading: which of the shipped pages' conditions hold now (thresholds.py), and on whose thresholds."""
    t = facts.thresholds
    paging = facts.paging
    where = f"thresholds from {t.where}"
    if not paging:
        return Item(1, f"now, no shipped page's condition holds ({t.page(CRITICAL_KEY).name} above "
                       f"{_pct(t.headroom_critical)} of the headroom, {_pct(t.used_critical)} of a GPU with no "
                       f"reservation; {where})")  # fmt: skip
    held = "; ".join(f"{page.name} ({page.severity}): {why}" for page, why in paging)
    return Item(1, f"now, as the shipped rules judge it: {held} ({where})", float(len(paging)), "conditions")


def evidence(facts: Facts, probe_delay: float, probe_source: str) -> list[Item]:
    """The evidence items in the postmortem's order: 1. memory, 2. OOMs and restarts, 3. the engine's concurrency
    and configuration, 4. the probe against the startup."""
    return [
        *_memory_items(facts),
        *_event_items(facts),
        *_engine_items(facts),
        *_startup_items(facts, probe_delay, probe_source),
    ]


def _memory_items(facts: Facts) -> list[Item]:
    """Step 1: the memory trend."""
    items: list[Item] = []
    if not facts.memory:
        items.append(Item(1, "no GPU memory series for this target: is NVML enabled and the GPU known?"))
        return items
    t_peak, peak = facts.peak  # type: ignore[misc]
    if facts.history:
        items.append(Item(1, f"GPU memory peak {_pct(peak)} of the worst GPU (from {_pct(facts.memory[0][1])})",
                          peak, "ratio", t_peak))  # fmt: skip
    else:
        items.append(Item(1, f"GPU memory now {_pct(peak)} of the worst GPU", peak, "ratio", t_peak))
    if facts.reserved_ratio is not None:
        items.append(_reservation_item(facts, t_peak))
    if facts.memory_evidence == TARGET_LEVEL:
        items.append(Item(1, _fallback_text(facts), facts.evidence_factor, "factor"))
    items += _other_processes_items(facts)
    items += _trend_items(facts)
    return items


def _reservation_item(facts: Facts, t_peak: float) -> Item:
    """The engines' reservation on the worst GPU, and the use beyond it."""
    # Over a history the largest; from one reading the value now, which is no peak.
    beyond = facts.unreserved_peak_ratio
    text = f"the engines reserve {_pct(facts.reserved_ratio)} of the GPU"
    if beyond is not None:
        text += (f"; peak use beyond the reservation {_pct(beyond)} of the GPU" if facts.history
                 else f"; use beyond the reservation now {_pct(beyond)} of the GPU")  # fmt: skip
    if facts.headroom_used_peak is not None:
        text += f", {_pct(facts.headroom_used_peak)} of the headroom it leaves"
    return Item(1, text, beyond, "ratio", t_peak)


def _other_processes_items(facts: Facts) -> list[Item]:
    """Other processes on the GPU: their growth over a history, what they hold now in one reading."""
    items: list[Item] = []
    if facts.history and facts.other_growth_ratio is not None and facts.other_growth_ratio >= 0.01:
        items.append(Item(1, f"other processes on the GPU grew by {_pct(facts.other_growth_ratio)} of it "
                             f"(to {_pct(facts.other_peak_ratio or 0)}); the engine's own use beyond its "
                             f"reservation peaked at {_pct(facts.engine_over_reservation_peak_ratio or 0)}",
                          facts.other_growth_ratio, "ratio"))  # fmt: skip
    elif not facts.history and facts.other_peak_ratio is not None and facts.other_peak_ratio >= 0.01:
        items.append(Item(1, f"other processes on the GPU hold {_pct(facts.other_peak_ratio)} of it now; the "
                             "engine's own use beyond its reservation is "
                             f"{_pct(facts.engine_over_reservation_peak_ratio or 0)}", facts.other_peak_ratio,
                          "ratio"))  # fmt: skip
    return items


def _trend_items(facts: Facts) -> list[Item]:
    """The exporter's trend states and time to full, the climb, and in one reading the pages that hold now."""
    items: list[Item] = []
    if not facts.history:
        now = ", ".join(sorted(facts.trend_states)) or "unknown"
        items.append(Item(1, f"the exporter's trend state now: {now}"))
        if facts.seconds_to_full is not None:
            items.append(Item(1, f"the exporter's time to full now: {_duration(facts.seconds_to_full)}",
                              facts.seconds_to_full, "seconds"))  # fmt: skip
    for state in ("spike", "climbing", "saturated"):
        if facts.history and state in facts.trend_states:
            items.append(Item(1, f"the exporter's trend state was {state}", None, "", facts.trend_states[state]))
    if facts.climb:
        rise, seconds, since = facts.climb
        items.append(Item(1, f"memory rose {_pct(rise)} over {seconds / 60:.0f} min and never fell back "
                             f"more than {_pct(CLIMB_MAX_FALLBACK)}", rise, "ratio", since))  # fmt: skip
    if not facts.history:
        items.append(
            Item(
                1,
                "one reading, no history (--exporter): the trend is the exporter's own state; the "
                "present is judged on the figures now, as the shipped rules judge them",
            )
        )
        items.append(_pages_item(facts))
    return items


def _event_items(facts: Facts) -> list[Item]:
    """Step 2: the OOMs and other events of the engine's log and the kernel, and the restarts."""
    items: list[Item] = []
    if facts.target is not None:
        if facts.event_counts:
            for kind in kinds.TARGET_EVENT_KINDS:
                if kind in facts.event_counts:
                    times = facts.events.get(kind, [])
                    count = facts.event_counts[kind]
                    items.append(Item(2, f"{kind}: {count:g} event(s)" + (" in the window" if facts.history else
                                                                          " since the exporter started"),
                                      count, "events", times[0] if times else None))  # fmt: skip
        else:
            items.append(Item(2, "no event series: the target has no log source configured, OOMs are not seen"))
        items.append(Item(2, f"restarts: {facts.restart_count:g}", facts.restart_count, "restarts",
                          facts.restarts[0] if facts.restarts else None))  # fmt: skip
    return items


def _engine_items(facts: Facts) -> list[Item]:
    """Step 3: the engine's KV cache, queue and running requests, its memory setting and the two-knob check."""
    items: list[Item] = []
    if facts.has_engine:
        kv_peak = facts.kv_peak
        if kv_peak is not None:
            t = max(facts.kv, key=lambda p: p[1])[0]
            word = "peaked at" if facts.history else "now"
            items.append(Item(3, f"KV cache use {word} {_pct(kv_peak)}", kv_peak, "ratio", t))
        if facts.waiting:
            t, w = max(facts.waiting, key=lambda p: p[1])
            items.append(Item(3, f"waiting requests {'peaked at' if facts.history else 'now'} {w:g}", w, "requests", t))
        if facts.running:
            n = facts.running_at_saturation
            most = "peaked at" if facts.history else "now"
            text = (f"running requests at saturation: {n:g}" if facts.kv_saturated and n is not None
                    else f"running requests {most} {max(v for _, v in facts.running):g}")  # fmt: skip
            items.append(Item(3, text, n if facts.kv_saturated else max(v for _, v in facts.running), "requests"))
        items.append(Item(3, f"preemptions: {facts.preemptions:g}", facts.preemptions, "preemptions"))
    elif facts.target is not None:
        items.append(Item(3, "no engine series (KV cache, queue): the engine's /metrics was not read"))
    if facts.gpu_memory_utilization is not None:
        items.append(Item(3, f"gpu_memory_utilization {facts.gpu_memory_utilization:g}",
                          facts.gpu_memory_utilization, "ratio"))  # fmt: skip
    if facts.has_engine:
        items += _capacity_items(facts)
    return items


def _startup_items(facts: Facts, probe_delay: float, probe_source: str) -> list[Item]:
    """Step 4: the measured startup against the probe's delay, and the time up."""
    items: list[Item] = []
    if facts.target is not None:
        if facts.startup_seconds is not None:
            slower = facts.startup_seconds > probe_delay
            clock = facts.clock
            real = (f" ({clock.real(facts.startup_seconds):.1f}s real at {clock.factor:g}x)"
                    if clock.compressed else "")  # fmt: skip
            items.append(Item(4, f"measured startup {facts.startup_seconds:.0f}s{real} "
                                 f"{'>' if slower else '<='} probe delay {probe_delay:g}s ({probe_source})",
                              facts.startup_seconds, "seconds"))  # fmt: skip
        else:
            items.append(Item(4, f"no startup measured; probe delay {probe_delay:g}s ({probe_source})"))
        if facts.up_fraction is not None:
            state = (
                f"up {_pct(facts.up_fraction)} of the window"
                if facts.history
                else f"state now: {'up' if facts.ever_up else 'not up'}"
            )
            items.append(Item(4, state, facts.up_fraction, "ratio"))
    return items
