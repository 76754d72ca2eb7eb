"""What a trend series holds once its 30-minute window is full (issue 50, item 2): its samples as arrays of doubles,
its buckets' statistics in a ring little over its span. Measured with tracemalloc (what Python allocated for it), not
with a clock: the same figure on every run of one Python."""

from __future__ import annotations

import gc
import random
import tracemalloc

from oomguard.exporter.model import Observation, TrendKey, TrendSettings
from oomguard.exporter.trend.sampler import TrendTracker

SERIES = 4
# Before: 120 KiB a series (lists of float objects, rings sized to the next power of two); 77.3 with arrays and rings
# a little over their span; now 72.8 (each bucket's bounds in arrays, not a list of two ints and its values).
MOST_KIB_A_SERIES = 75


def test_a_full_windows_series_holds_at_most_its_budget() -> None:
    settings = TrendSettings()  # as shipped: a sample every 2 s, a 30-minute window (901 samples)
    tracker = TrendTracker(settings)
    keys = [TrendKey("target", f"llm/vllm-{i}", "gpu") for i in range(SERIES)]
    rng = random.Random(1)
    levels = [0.9] * SERIES
    ticks = int(settings.long_window_seconds / settings.interval_seconds) + 20
    gc.collect()
    tracemalloc.start(1)
    try:
        before = tracemalloc.get_traced_memory()[0]
        for tick in range(ticks):
            for i in range(SERIES):
                levels[i] = min(0.98, max(0.5, levels[i] + rng.gauss(0, 0.002)))
            tracker.record(
                tick * settings.interval_seconds,
                {k: Observation(levels[i] * 80e9, 80e9) for i, k in enumerate(keys)},
            )
        gc.collect()
        held = (tracemalloc.get_traced_memory()[0] - before) / 1024 / SERIES
    finally:
        tracemalloc.stop()
    assert all(len(tracker._series[k]) >= ticks - 20 for k in keys)  # the window full
    assert held <= MOST_KIB_A_SERIES, f"{held:.1f} KiB a series once its window is full"
