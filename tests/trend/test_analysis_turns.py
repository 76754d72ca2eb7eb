"""The analysis in turns (trend.analysis_interval_seconds): each tick analyses its share of the series, every
series is analysed once per interval, a new one at once, and between its turns a series keeps its last trend."""

from __future__ import annotations

import pytest

from oomguard.common.time_scale import TimeScale
from oomguard.exporter.config import Config
from oomguard.exporter.config_loader import load_config
from oomguard.exporter.model import Observation, Trend, TrendKey
from oomguard.exporter.trend import analysis
from oomguard.exporter.trend.analysis import TrendSettings
from oomguard.exporter.trend.sampler import TrendTracker
from oomguard.simulate.clock import trend_settings_on_clock

GIB = 1024**3


def observe(keys: list[TrendKey], t: float) -> dict[TrendKey, Observation]:
    return {k: Observation((40 + (i % 7) + 0.001 * t) * GIB, 80 * GIB) for i, k in enumerate(keys)}


def test_each_tick_analyses_its_share_and_every_series_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Config().trend.settings()  # the defaults: a sample every 2 s, each series analysed every 10 s
    assert settings.analysis_every == 5
    analysed: list[int] = []
    real = analysis.Series.trend

    def counted(series: analysis.Series) -> Trend | None:
        analysed.append(id(series))
        return real(series)

    monkeypatch.setattr(analysis.Series, "trend", counted)
    keys = [TrendKey("gpu", str(i), "gpu") for i in range(12)]
    tracker = TrendTracker(settings)
    tracker.record(0.0, observe(keys, 0.0))
    assert len(analysed) == 12  # new series: analysed at once
    per_tick = []
    seen: list[set[int]] = []
    for tick in range(1, 21):
        analysed.clear()
        tracker.record(tick * 2.0, observe(keys, tick * 2.0))
        per_tick.append(len(analysed))
        seen.append(set(analysed))
        assert set(tracker.latest) == set(keys)  # a series out of its turn keeps its last trend
    assert max(per_tick) == 3 and min(per_tick) == 2, per_tick  # 12 series over 5 ticks: 2 or 3 a tick
    for start in range(0, 20, 5):  # every series once in each run of 5 ticks
        window = [s for ticks in seen[start : start + 5] for s in ticks]
        assert len(window) == len(set(window)) == 12
    # A series added later is analysed at once, then in its turn.
    analysed.clear()
    added = TrendKey("gpu", "12", "gpu")
    tracker.record(42.0, observe([*keys, added], 42.0))
    assert added in tracker.latest


def test_every_sample_when_zero_and_at_most_a_quarter_of_the_short_window() -> None:
    assert TrendSettings().analysis_every == 1  # the library's default: every sample (the replays and the drill)
    assert TrendSettings(analysis_interval_seconds=0.0).analysis_every == 1
    assert TrendSettings(analysis_interval_seconds=3.0).analysis_every == 1  # less than two samples: every one
    # A short window of 20 s: a spike is judged within 5 s whatever the setting.
    assert TrendSettings(analysis_interval_seconds=60.0, short_window_seconds=20.0).analysis_every == 2
    # At 30x: 10 simulated seconds are 0.33 s, three of the 0.1 s samples (the floor of the sample interval).
    assert trend_settings_on_clock(TrendSettings(analysis_interval_seconds=10.0), TimeScale(30.0)).analysis_every == 3
    config = load_config(None, {"trend": {"analysis_interval_seconds": 0}})
    assert config.trend.settings().analysis_every == 1
