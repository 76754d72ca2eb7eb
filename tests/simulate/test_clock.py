"""The simulation's clock: what the runtime judges runs `time_scale` times faster; what it measures does not."""

from __future__ import annotations

from oomguard.common.time_scale import REAL, TimeScale
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.sources.restarts import ANNOUNCE_WINDOW
from oomguard.exporter.sources.targets import RESERVATION_RETRY_SECONDS, TargetScraper
from oomguard.simulate.checks import load_config
from oomguard.simulate.clock import events_on_clock, trend_on_clock
from oomguard.simulate.host import SimulatedHost


def test_the_runtime_of_a_simulation_judges_on_its_clock() -> None:
    config = load_config(None, {"simulation": {"scenario": "incident", "time_scale": 10}})
    runtime = Runtime(config, nvml_lib=None, simulated=SimulatedHost(config))
    events = runtime.config.events
    assert (events.quiet_seconds, events.rearm_seconds) == (1.0, 6.0)  # 5 s floored at 1 s; 60 s / 10
    trend = trend_on_clock(runtime.config, runtime.clock)
    assert (trend.interval_seconds, trend.short_window_seconds, trend.climb_min_seconds) == (0.2, 12.0, 30.0)
    assert trend.analysis_interval_seconds == 1.0
    assert trend.climb_min_slope_ratio_per_minute == 10 * runtime.config.trend.climb_min_slope_ratio_per_minute


def test_a_real_deployment_keeps_its_durations() -> None:
    config = load_config(None, {"trend": {"short_window_seconds": 300}, "events": {"quiet_seconds": 7}})
    runtime = Runtime(config, nvml_lib=None)
    assert runtime.clock == REAL and runtime.config.events == config.events
    assert trend_on_clock(config, REAL) == config.trend.settings()
    assert events_on_clock(config, REAL) is config


def test_a_scrapers_windows_and_back_offs_follow_the_clock() -> None:
    # SGLang: its reservation is fetched apart from /metrics, with a back-off after a failure.
    config = load_config(None, {"targets": [{"name": "a", "url": "http://127.0.0.1:8000", "engine": "sglang"}]})
    real = TargetScraper(config.targets[0], timeout=3, max_body_bytes=1 << 20)
    fast = TargetScraper(config.targets[0], timeout=3, max_body_bytes=1 << 20, clock=TimeScale(30))
    assert real.restarts.announce_window == ANNOUNCE_WINDOW
    assert fast.restarts.announce_window == ANNOUNCE_WINDOW / 30
    assert fast.reservation is not None and fast.reservation.retry_seconds == RESERVATION_RETRY_SECONDS / 30
