"""The thresholds that judge "does a page hold": the bundle configuration's (bundle/bundle_config.py), the numbers the
shipped rules are made of, read by diagnose and the status page.

One source of truth: no threshold the rules have is written again in diagnose or the status page. `oomguard
generate --config FILE` renders the rules from a bundle configuration; `oomguard diagnose --bundle-config FILE`
reads the same file, so a team that pages at 60 % of the headroom has diagnose judge the top at 60 % too.
Without one, both take the shipped defaults (bundle/defaults.yaml).

What diagnose takes from it:

- memory at the top: `gpu_memory_critical` (`headroom_threshold` of the headroom an engine's reservation leaves,
  `threshold` of a GPU with no reservation known): the state GpuMemoryCritical pages on;
- the pages whose conditions one reading of an exporter judges now (`Pages`): GpuMemoryCritical,
  TargetMemoryOverBudget (`over_budget.margin_ratio`), GpuMemoryExhaustedSoon (`exhausted_soon.seconds`,
  `.min_total_ratio`), OomEvent
  (`oom_event.window`), RestartStorm (`restart_storm.count`, `.window`), each with its severity;
- a saturated KV cache (`kv_cache_saturated.threshold`) and a queue (`queue_backlog.threshold`);
- the two-knob check (capacity.py): `concurrency_over_kv_cache`'s min_running, min_kv_usage, quantile,
  margin_ratio, reservation_threshold;
- the report's memory lines: `gpu_memory_high.threshold` and `gpu_memory_critical.threshold`;
- the clock (`time_scale`) where `--time-scale` is not given, and the probe delay
  (`startup_slower_than_probe.probe_initial_delay_seconds`) where `--probe-delay` is not.

diagnose's own judgements (a climb within a history, another process's growth, the recommendations' formulas) are
not the rules' and stay in evidence.py and recommend.py.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from oomguard.bundle.bundle_config import BundleConfig, load_bundle_config, seconds
from oomguard.common.time_scale import TimeScale

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
_PAGES = {
    "gpu_memory_critical": "GpuMemoryCritical",
    "over_budget": "TargetMemoryOverBudget",
    "exhausted_soon": "GpuMemoryExhaustedSoon",
    "oom_event": "OomEvent",
    "restart_storm": "RestartStorm",
}
CRITICAL_KEY, OVER_BUDGET_KEY, EXHAUSTED_SOON_KEY, OOM_EVENT_KEY, RESTART_STORM_KEY = _PAGES


@dataclass(frozen=True)
class Thresholds:
    source: str  # where they were read: DEFAULTS or the file's path
    time_scale: float  # the bundle's clock: simulated seconds per real second (1 in production)
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

    @classmethod
    def of(cls, config: BundleConfig, source: str = DEFAULTS) -> Thresholds:
        a = config.alerts
        c = a.concurrency_over_kv_cache
        prefix = config.prefix
        severities = {key: getattr(a, key).severity for key in _PAGES}
        return cls(
            source=source,
            time_scale=config.time_scale,
            probe_delay_seconds=float(a.startup_slower_than_probe.probe_initial_delay_seconds),
            headroom_critical=a.gpu_memory_critical.headroom_threshold,
            used_critical=a.gpu_memory_critical.threshold,
            used_high=a.gpu_memory_high.threshold,
            over_budget_margin=a.over_budget.margin_ratio,
            exhausted_soon_seconds=a.exhausted_soon.seconds,
            exhausted_soon_min_total=a.exhausted_soon.min_total_ratio,
            oom_window_seconds=float(seconds(a.oom_event.window, "alerts.oom_event.window")),
            restart_storm_count=a.restart_storm.count,
            restart_storm_window_seconds=float(seconds(a.restart_storm.window, "alerts.restart_storm.window")),
            kv_saturated=a.kv_cache_saturated.threshold,
            queue_backlog=float(a.queue_backlog.threshold),
            min_running=float(c.min_running),
            min_kv_usage=c.min_kv_usage,
            quantile=c.quantile,
            margin=c.margin_ratio,
            reservation_high=c.reservation_threshold,
            pages=tuple(Page(key, prefix + name, severities[key]) for key, name in _PAGES.items()),
        )

    @property
    def clock(self) -> TimeScale:
        """The clock the thresholds judge on: a drill's compressed one, or life's."""
        return TimeScale(self.time_scale)

    def page(self, key: str) -> Page:
        return next(p for p in self.pages if p.key == key)

    @property
    def where(self) -> str:
        """Where they come from, for the output: "the bundle's defaults" or "bundle configuration FILE"."""
        return self.source if self.source == DEFAULTS else f"bundle configuration {self.source}"


@functools.cache
def default_thresholds() -> Thresholds:
    """The shipped defaults' (bundle/defaults.yaml), read once."""
    return Thresholds.of(load_bundle_config())


def load_thresholds(path: Path | str | None = None) -> Thresholds:
    """The thresholds of the bundle configuration at `path` (merged over the defaults, as `oomguard generate
    --config` merges it), or the defaults'; raises oomguard.exporter.config.ConfigError for a file that is not one."""
    if path is None:
        return default_thresholds()
    return Thresholds.of(load_bundle_config(Path(path)), str(path))
