"""The trend on a compressed clock (the drill's, `serve --simulate`'s): a history judged as life's clock judges the
same history at life's pace."""

from __future__ import annotations

from oomguard.common.time_scale import TimeScale
from oomguard.exporter.model import TrendSettings
from oomguard.exporter.trend.analysis import Series
from oomguard.simulate.clock import trend_settings_on_clock


def pinned_after(settings: TrendSettings, calm_seconds: float, pinned_seconds: float) -> str:
    """The state of a series at half its GPU for `calm_seconds`, then pinned at 98.5 % for `pinned_seconds`,
    sampled every `settings.interval_seconds` (real seconds on the clock the settings are for)."""
    series, t, step = Series(settings), 0.0, settings.interval_seconds
    for ratio, seconds in ((0.5, calm_seconds), (0.985, pinned_seconds)):
        end = t + seconds
        while t < end:
            series.add(t, ratio)
            t += step
    trend = series.trend()
    assert trend is not None
    return trend.state


def test_pinned_at_the_top_is_saturated_on_a_compressed_clock_as_at_lifes_pace() -> None:
    # Life: ten minutes at half the GPU, then a minute and a half pinned at the top.
    assert pinned_after(TrendSettings(), 600.0, 90.0) == "saturated"
    # The same at 30x: 20 real seconds, then 3. The median is taken over the last 30 simulated seconds (1 real
    # second), not the last 30 real ones (most of the history, at half the GPU: read as a spike).
    fast = trend_settings_on_clock(TrendSettings(), TimeScale(30.0))
    assert fast.saturated_seconds == 1.0
    assert pinned_after(fast, 20.0, 3.0) == "saturated"


def test_the_saturated_span_follows_the_clock_with_a_floor() -> None:
    assert TrendSettings().saturated_seconds == 30.0
    assert trend_settings_on_clock(TrendSettings(), TimeScale(10.0)).saturated_seconds == 3.0
    # A floor: the span still holds several samples of the exporter's own clock.
    assert trend_settings_on_clock(TrendSettings(), TimeScale(1000.0)).saturated_seconds == 1.0
    assert trend_settings_on_clock(TrendSettings(), TimeScale(1.0)) == TrendSettings()
