"""The thresholds that judge "does a page hold", as plain data: the numbers the shipped rules are made of, which the
bundle reads from its configuration (bundle/thresholds.py) and diagnose and the status page judge with.

One source of truth: no threshold the rules have is written again in diagnose or the status page. The exporter's
status page is handed its thresholds by whoever builds it (cli.py, the simulation's runtime: the bundle's defaults),
so the exporter reads no bundle configuration itself.
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


# The alerts one reading judges, by their key under alerts: and their name after the bundle's prefix (alerts.yaml.j2).
PAGES = {
    "gpu_memory_critical": "GpuMemoryCritical",
    "over_budget": "TargetMemoryOverBudget",
    "exhausted_soon": "GpuMemoryExhaustedSoon",
    "oom_event": "OomEvent",
    "restart_storm": "RestartStorm",
}
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
        return next(p for p in self.pages if p.key == key)

    @property
    def where(self) -> str:
        """Where they come from, for the output: "the bundle's defaults" or "bundle configuration FILE"."""
        return self.source if self.source == DEFAULTS else f"bundle configuration {self.source}"
