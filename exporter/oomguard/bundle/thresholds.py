"""The thresholds that judge "does a page hold" (common/thresholds.py) read from the bundle configuration
(bundle/bundle_config.py): the numbers the shipped rules are made of, read by diagnose and the status page.

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
from pathlib import Path

from oomguard.bundle.bundle_config import BundleConfig, load_bundle_config, seconds
from oomguard.common.thresholds import (
    CRITICAL_KEY,
    DEFAULTS,
    EXHAUSTED_SOON_KEY,
    OOM_EVENT_KEY,
    OVER_BUDGET_KEY,
    PAGES,
    RESTART_STORM_KEY,
    Page,
    Thresholds,
)

# The data (common/thresholds.py) named here too: diagnose reads the bundle's
# thresholds and their words in one place.
__all__ = [
    "CRITICAL_KEY", "DEFAULTS", "EXHAUSTED_SOON_KEY", "OOM_EVENT_KEY", "OVER_BUDGET_KEY", "RESTART_STORM_KEY", "Page",
    "Thresholds", "default_thresholds", "load_thresholds", "thresholds_of",
]  # fmt: skip


def thresholds_of(config: BundleConfig, source: str = DEFAULTS) -> Thresholds:
    """The thresholds a bundle configuration's rules are made of."""
    a = config.alerts
    c = a.concurrency_over_kv_cache
    prefix = config.prefix
    severities = {key: getattr(a, key).severity for key in PAGES}
    return Thresholds(
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
        pages=tuple(Page(key, prefix + name, severities[key]) for key, name in PAGES.items()),
    )


@functools.cache
def default_thresholds() -> Thresholds:
    """The shipped defaults' (bundle/defaults.yaml), read once."""
    return thresholds_of(load_bundle_config())


def load_thresholds(path: Path | str | None = None) -> Thresholds:
    """The thresholds of the bundle configuration at `path` (merged over the defaults, as `oomguard generate
    --config` merges it), or the defaults'; raises oomguard.exporter.config.ConfigError for a file that is not one."""
    if path is None:
        return default_thresholds()
    return thresholds_of(load_bundle_config(Path(path)), str(path))
