"""The simulation's clock applied to the exporter's settings: `serve --simulate` and the drill run a scenario
`time_scale` times faster than life, and every duration the exporter judges runs on that clock too
(`common/time_scale.py`, `TimeScale`: the one place that knows how a duration is scaled).

Judged durations are thresholds and windows: the trend's sample interval, windows and minimum climb, an
incident's quiet spell and re-arm time, how long after a start its startup line still belongs to it, the
back-off after a failed fetch. At 10x a two-minute window is 12 real seconds, so the quick start shows a climb
and its time to full minutes (simulated) before the first OOM, as a real host would. Measured durations and
timestamps stay in real seconds (the slopes, the time to full, a startup): Prometheus stamps its samples with
the real clock, and the drill's rules are scaled to match (bundle `time_scale`).
"""

from __future__ import annotations

from dataclasses import replace

from oomguard.common.time_scale import TimeScale
from oomguard.exporter.config import Config
from oomguard.exporter.model import TrendSettings


def events_on_clock(config: Config, clock: TimeScale) -> Config:
    """The config with its event timings on the simulation's clock (unchanged on life's)."""
    if not clock.compressed:
        return config
    events = config.events
    # A quiet spell or re-arm shorter than two reads of the sources would split one death.
    floor = 2 * events.poll_interval_seconds
    scaled = events.model_copy(update={
        "quiet_seconds": clock.real(events.quiet_seconds, floor),
        "rearm_seconds": clock.real(events.rearm_seconds, floor),
    })  # fmt: skip
    return config.model_copy(update={"events": scaled})


def trend_on_clock(config: Config, clock: TimeScale) -> TrendSettings:
    """The trend's settings of the configuration on the simulation's clock (unchanged on life's)."""
    return trend_settings_on_clock(config.trend.settings(), clock)


def trend_settings_on_clock(settings: TrendSettings, clock: TimeScale) -> TrendSettings:
    """The same analysis on the clock: its windows and spans judged in real seconds, the slope threshold per real
    minute. The floors keep a window several samples wide and a sample on the exporter's own clock (a real
    process's fixed costs do not shrink with the scenario)."""
    if not clock.compressed:
        return settings
    return replace(
        settings,
        interval_seconds=clock.real(settings.interval_seconds, floor=0.1),
        short_window_seconds=clock.real(settings.short_window_seconds, floor=2.0),
        long_window_seconds=clock.real(settings.long_window_seconds, floor=30.0),
        climb_min_seconds=clock.real(settings.climb_min_seconds, floor=3.0),
        climb_soonest_seconds=clock.real(settings.climb_soonest_seconds, floor=3.0),
        saturated_seconds=clock.real(settings.saturated_seconds, floor=1.0),
        climb_min_slope_ratio_per_minute=clock.rate(settings.climb_min_slope_ratio_per_minute),
        analysis_interval_seconds=clock.real(settings.analysis_interval_seconds),
        creep_period_seconds=clock.real(settings.creep_period_seconds, floor=0.4),
        creep_window_seconds=clock.real(settings.creep_window_seconds, floor=60.0),
        creep_min_seconds=clock.real(settings.creep_min_seconds, floor=12.0),
        creep_horizon_seconds=clock.real(settings.creep_horizon_seconds),
    )
