"""The simulation's clock: `serve --simulate` and the drill run a scenario `time_scale` times faster than life,
and every duration the exporter judges runs on that clock too.

Judged durations are thresholds and windows: the trend's sample interval, windows and minimum climb, an
incident's quiet spell and re-arm time, how long after a start its startup line still belongs to it, the
back-off after a failed fetch. At 10x a two-minute window is 12 real seconds, so the quick start shows a climb
and its time to full minutes (simulated) before the first OOM, as a real host would. Measured durations and
timestamps stay in real seconds (the slopes, the time to full, a startup): Prometheus stamps its samples with
the real clock, and the drill's rules are scaled to match (bundle `time_scale`).
"""

from __future__ import annotations

from oomguard.exporter.config import Config
from oomguard.exporter.model import TrendSettings


def judged_seconds(seconds: float, time_scale: float, floor: float = 0.0) -> float:
    """A duration the exporter judges, on a clock `time_scale` times faster than life."""
    return max(floor, seconds / time_scale)


def events_on_clock(config: Config, time_scale: float) -> Config:
    """The config with its event timings on the simulation's clock (unchanged at 1)."""
    if time_scale == 1:
        return config
    events = config.events
    # A quiet spell or re-arm shorter than two reads of the sources would split one death.
    floor = 2 * events.poll_interval_seconds
    scaled = events.model_copy(update={
        "quiet_seconds": judged_seconds(events.quiet_seconds, time_scale, floor),
        "rearm_seconds": judged_seconds(events.rearm_seconds, time_scale, floor),
    })  # fmt: skip
    return config.model_copy(update={"events": scaled})


def trend_on_clock(config: Config, time_scale: float) -> TrendSettings:
    """The trend's settings on the simulation's clock (TrendSettings.time_scaled: its floors keep a window
    several samples wide)."""
    settings = config.trend.settings()
    return settings if time_scale == 1 else settings.time_scaled(time_scale)
