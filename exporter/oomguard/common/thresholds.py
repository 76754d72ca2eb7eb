"""The thresholds that judge "does a page hold", as plain data: the numbers the shipped rules are made of, which the
bundle reads from its configuration (bundle/thresholds.py) and diagnose and the status page judge with.

One source of truth: no threshold the rules have is written again in diagnose or the status page. The exporter's
status page is handed its thresholds by whoever builds it (cli.py, the simulation's runtime: the bundle's defaults),
so the exporter reads no bundle configuration itself.

Each page declared once (`DECLARATIONS`): per alert condition that pages (or that one reading judges), what it
compares, on which basis, against which of the bundle's thresholds, with which `for:`/`keep_firing_for:`, on which
clock. The rules' template renders each declared alert's thresholds and hysteresis through its declaration
(bundle/generate.py: `threshold`, `hysteresis`); the status page (exporter/status/view.py) and diagnose
(diagnose/evidence.py) judge "does it hold now" with the predicates at the end (`gpu_page`, `over_budget`,
`oom_event`, `restart_storm`), on the same declarations: three readers, one judgement.

The clock: thresholds and windows are written in the scenario's seconds (the bundle's, life's in production); what is
measured (a time to full, the age of an event) is in real seconds and is said in the scenario's by the clock the
readings ran on (`TimeScale.simulated`) before it is judged. The rules judge the same on their side: their
durations rendered in real seconds (`TimeScale.real`) on the bundle's clock.

One reading judges a condition, not an alert: a rule's `for:`, its `keep_firing_for:` and Prometheus' evaluation
are not in one reading. A page one reading cannot judge says why (`one_reading`).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULTS = "the bundle's defaults"


@dataclass(frozen=True)
class Page:
    """A shipped alert whose condition one reading can judge: its name, its severity, its threshold in words."""

    key: str  # its key under alerts: in the bundle configuration
    name: str  # the alert's name (the bundle's prefix and the rule's)
    severity: str

    @property
    def pages(self) -> bool:
        """A page, as the bundle routes it: severity critical."""
        return self.severity == "critical"


# Each page declared once (the module's second part): what the rules' template, the status page and diagnose read.
HYSTERESIS = ("for", "keep_firing_for")  # a memory page's: held so long, and held so long once it stops


@dataclass(frozen=True)
class PageDeclaration:
    key: str  # its key under alerts: in the bundle configuration
    name: str  # the alert's name after the bundle's prefix
    subject: str  # what it is judged on: a GPU, a target, a node, the exporter
    figure: str  # the figure it compares, in words
    thresholds: dict[str, str]  # basis -> the key under alerts.<key> of the threshold that basis is compared with
    hysteresis: tuple[str, ...] = ()  # the rule's for: / keep_firing_for:, keys under alerts.<key>
    time_to_full: bool = False  # stands on the trend's time to full (a GPU that has one is judged by it)
    one_reading: str = ""  # why one reading (the status page, diagnose --exporter) cannot judge it; "" where it can

    @property
    def judged_now(self) -> bool:
        return not self.one_reading


CRITICAL = PageDeclaration(
    "gpu_memory_critical", "GpuMemoryCritical", "gpu",
    "the headroom the reservation leaves in use (basis headroom), else used / total (basis total), on a GPU the trend "
    "gives no time to full, not falling",
    {"headroom": "headroom_threshold", "total": "threshold"}, HYSTERESIS,
)  # fmt: skip
OVER_BUDGET = PageDeclaration(
    "over_budget", "TargetMemoryOverBudget", "target",
    "a target's memory beyond its engine's budget, as a share of its GPUs' total",
    {"total": "margin_ratio"}, HYSTERESIS,
)  # fmt: skip
EXHAUSTED_SOON = PageDeclaration(
    "exhausted_soon", "GpuMemoryExhaustedSoon", "gpu",
    "the trend's time to full, on a GPU judged on its headroom or with min_total_ratio of its total used",
    {"time_to_full": "seconds", "total": "min_total_ratio"}, HYSTERESIS, time_to_full=True,
)  # fmt: skip
OOM_EVENT = PageDeclaration(
    "oom_event", "OomEvent", "target", "an engine's OOM in the log within the window", {"window": "window"}
)  # fmt: skip
RESTART_STORM = PageDeclaration(
    "restart_storm", "RestartStorm", "target", "a target's restarts within the window",
    {"count": "count", "window": "window"},
)  # fmt: skip
EXPORTER_DOWN = PageDeclaration(
    "exporter_down", "ExporterDown", "exporter", "Prometheus' scrape of the exporter failing", {}, ("for",),
    one_reading="an exporter that answers is up: only Prometheus sees it down",
)  # fmt: skip
GPU_LOST = PageDeclaration(
    "gpu_lost", "GpuLost", "gpu", "a GPU that stopped answering its source", {}, ("for",),
    one_reading="judged on its `for:` alone: the status page shows the source's health, not this page",
)  # fmt: skip
DCGM_NODE_CONFLICT = PageDeclaration(
    "dcgm_node_conflict", "DcgmNodeConflict", "node", "the dcgm-exporter pods trusted for one node", {}, ("for",),
    one_reading="a cluster exporter's discovery, which neither the status page nor diagnose reads",
)  # fmt: skip

# Every paging alert of the shipped rules (severity critical), and the ticket one reading judges beside them.
DECLARATIONS = (CRITICAL, OVER_BUDGET, EXHAUSTED_SOON, OOM_EVENT, RESTART_STORM, EXPORTER_DOWN, GPU_LOST,
                DCGM_NODE_CONFLICT)  # fmt: skip
BY_KEY = {d.key: d for d in DECLARATIONS}
# The alerts one reading judges, by their key under alerts: and their name after the bundle's prefix.
PAGES = {d.key: d.name for d in DECLARATIONS if d.judged_now}
CRITICAL_KEY, OVER_BUDGET_KEY, EXHAUSTED_SOON_KEY, OOM_EVENT_KEY, RESTART_STORM_KEY = PAGES


@dataclass(frozen=True)
class Thresholds:
    source: str  # where they were read: DEFAULTS or the file's path
    time_scale: float  # the bundle's clock (TimeScale(time_scale)): simulated seconds per real second (1 in production)
    probe_delay_seconds: float  # startup_slower_than_probe.probe_initial_delay_seconds
    # memory
    headroom_critical: float  # gpu_memory_critical.headroom_threshold: the top of a GPU an engine reserves
    used_critical: float  # gpu_memory_critical.threshold: the top of one with no reservation known
    used_high: float  # gpu_memory_high.threshold: the report's first memory line
    over_budget_margin: float  # over_budget.margin_ratio: beyond the budget, as a share of the GPU
    exhausted_soon_seconds: float  # exhausted_soon.seconds: time to full below this...
    exhausted_soon_min_total: float  # ...judged on a GPU's total once exhausted_soon.min_total_ratio is used
    # events
    oom_window_seconds: float  # oom_event.window
    restart_storm_count: int  # restart_storm.count...
    restart_storm_window_seconds: float  # ...within restart_storm.window
    # the engine
    kv_saturated: float  # kv_cache_saturated.threshold: KV cache use above it is saturation
    queue_backlog: float  # queue_backlog.threshold: more requests waiting than this is a queue
    # the two-knob check (capacity.py), concurrency_over_kv_cache's
    min_running: float
    min_kv_usage: float
    quantile: float
    margin: float
    reservation_high: float
    pages: tuple[Page, ...]

    def page(self, key: str) -> Page:
        """The page of `key` (PAGES, its declaration's), with its name and severity in this configuration."""
        return next(p for p in self.pages if p.key == key)

    @property
    def where(self) -> str:
        """Where they come from, for the output: "the bundle's defaults" or "bundle configuration FILE"."""
        return self.source if self.source == DEFAULTS else f"bundle configuration {self.source}"


# The declarations' judgement of one reading: the status page's and diagnose's.
@dataclass(frozen=True)
class GpuNow:
    """One GPU in one reading, as the rules read it: NaN or absent figures are None."""

    headroom_used: float | None  # oomguard_gpu_memory_headroom_used_ratio, where a reservation is known
    used_ratio: float | None  # oomguard_gpu_memory_used_ratio
    seconds_to_full: float | None  # the trend's, in the scenario's seconds (clock.simulated of what /metrics has)


@dataclass(frozen=True)
class Met:
    """A declared condition that holds: on which basis, the figure and the threshold it is above (or below)."""

    declaration: PageDeclaration
    basis: str
    value: float
    threshold: float


def critical_basis(gpu: GpuNow, th: Thresholds) -> tuple[str, float | None, float]:
    """(basis, figure, threshold) GpuMemoryCritical judges a GPU on: its headroom where a reservation is known."""
    if gpu.headroom_used is not None:
        return "headroom", gpu.headroom_used, th.headroom_critical
    return "total", gpu.used_ratio, th.used_critical


def gpu_page(gpu: GpuNow, th: Thresholds) -> Met | None:
    """The page that holds on a GPU now, as the rules judge it: one the trend gives a time to full is ExhaustedSoon's
    (below its seconds, on its headroom or with min_total_ratio of its total used); Critical holds (above its
    threshold) on one that climbs no further."""
    if gpu.seconds_to_full is not None:
        judged = gpu.headroom_used is not None or (gpu.used_ratio or 0.0) >= th.exhausted_soon_min_total
        if judged and gpu.seconds_to_full < th.exhausted_soon_seconds:
            return Met(EXHAUSTED_SOON, "time_to_full", gpu.seconds_to_full, th.exhausted_soon_seconds)
        return None
    basis, value, threshold = critical_basis(gpu, th)
    if value is not None and value > threshold:
        return Met(CRITICAL, basis, value, threshold)
    return None


def over_budget(ratio: float | None, th: Thresholds) -> Met | None:
    """A target's memory beyond its budget, as a share of its GPUs' total, above the margin."""
    if ratio is not None and ratio > th.over_budget_margin:
        return Met(OVER_BUDGET, "total", ratio, th.over_budget_margin)
    return None


def oom_event(age: float | None, th: Thresholds) -> Met | None:
    """An OOM `age` scenario seconds ago (None: at a time not known, which may be recent) within the window."""
    if age is None or age <= th.oom_window_seconds:
        return Met(OOM_EVENT, "window", age if age is not None else 0.0, th.oom_window_seconds)
    return None


def restart_storm(restarts: float, age: float | None, th: Thresholds) -> Met | None:
    """At least the storm's count of restarts, the last `age` scenario seconds ago (None: not known, may be recent)
    within the window. One reading has the count since the exporter started, not the window's."""
    if restarts >= th.restart_storm_count and (age is None or age <= th.restart_storm_window_seconds):
        return Met(RESTART_STORM, "count", restarts, th.restart_storm_count)
    return None
