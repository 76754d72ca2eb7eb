"""The trend's statistics carried from tick to tick (analysis.BucketCache, the sorted window) against the same
statistics computed from scratch every tick, on random and adversarial series: the incremental path cannot drift."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oomguard.exporter.trend.analysis import BucketCache, History, Series, TrendSettings, bucket_stats

# Short windows so that a few hundred samples fill the history many times over (the defaults need 900 a window).
SMALL = TrendSettings(
    interval_seconds=1.0,
    short_window_seconds=12.0,
    long_window_seconds=60.0,
    climb_min_seconds=10.0,
    climb_min_slope_ratio_per_minute=0.01,
)

# Levels on a coarse grid as well as anywhere: many equal values (ties in every sort), and plateaus.
values = st.one_of(
    st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
    st.sampled_from([0.0, 0.25, 0.5, 0.5, 0.75, 0.97, 1.0]),
)
# Regular ticks, jittered ticks (the bucket edges fall either side of a sample), and gaps (empty buckets).
steps = st.one_of(st.just(1.0), st.floats(min_value=0.9, max_value=1.1), st.sampled_from([1.0, 1.0, 1.0, 7.0]))


def _both(samples: list[tuple[float, float]]) -> None:
    incremental, scratch = Series(SMALL), Series(SMALL, incremental=False)
    for i, (t, v) in enumerate(samples):
        incremental.add(t, v)
        scratch.add(t, v)
        assert incremental.trend() == scratch.trend(), f"sample {i} at t={t}"
        assert list(incremental._sorted) == sorted(scratch._values[scratch._head :])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(steps, values), min_size=1, max_size=400))
def test_series_matches_a_from_scratch_computation(draws: list[tuple[float, float]]) -> None:
    t, samples = 1.7e9, []
    for step, value in draws:
        t += step
        samples.append((t, value))
    _both(samples)


def _shaped(kind: str, n: int, rng: random.Random) -> list[float]:
    """Series shaped like those the analysis tells apart, with noise, restarts and wild readings."""
    out = []
    for i in range(n):
        if kind == "leak":
            v = 0.3 + 0.004 * i
        elif kind == "sawtooth-leak":
            v = 0.3 + 0.002 * i + 0.08 * ((i % 15) / 15)
        elif kind == "spike":
            v = 0.6 if i < n // 2 else min(1.0, 0.6 + 0.05 * (i - n // 2))
        elif kind == "restart":
            v = 0.8 if i % 150 < 100 else 0.05 + 0.01 * (i % 150 - 100)
        else:  # steady, read through a noisy path
            v = 0.7
        v += rng.uniform(-0.01, 0.01)
        if rng.random() < 0.02:
            v += rng.choice((-0.2, 0.2))
        out.append(min(1.0, max(0.0, v)))
    return out


def test_shaped_series_match_a_from_scratch_computation() -> None:
    rng = random.Random(16)
    seen = set()
    for kind in ("leak", "sawtooth-leak", "spike", "restart", "steady"):
        for jitter in (0.0, 0.05):
            t, samples = 0.0, []
            for v in _shaped(kind, 600, rng):
                t += 1.0 + rng.uniform(-jitter, jitter)
                samples.append((t, v))
            _both(samples)
            series = Series(SMALL)
            for t, v in samples:
                series.add(t, v)
                trend = series.trend()
                assert trend is not None
                seen.add(trend.state)
    # The comparison covered every state, so every window of the analysis (climb, half, latched included).
    assert seen == {"climbing", "spike", "saturated", "sawtooth", "steady"}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(values, min_size=30, max_size=300),
    st.integers(min_value=5, max_value=80),
    st.integers(min_value=1, max_value=12),
    st.floats(min_value=0.0, max_value=0.49),
)
def test_bucket_statistics_carried_over_match_sorting_afresh(
    data: list[float], span: int, count: int, jitter: float
) -> None:
    """A window of `span` samples slid one sample at a time (jittered times: edges move by 0, 1 or 2), and now
    and then jumping ahead: each tick's buckets equal those of a window sorted afresh."""
    rng = random.Random(len(data) * 31 + span)
    times, t = [], 0.0
    for _ in data:
        t += 1.0 + rng.uniform(-jitter, jitter)
        times.append(t)
    caches: dict[str, BucketCache] = {}
    end = span
    while end <= len(data):
        lo, hi = end - span, end
        window = History(times, data, lo, hi, 0, caches)
        fresh = History(times, data, lo, hi)
        start = times[lo] + rng.choice((0.0, 0.3))
        assert bucket_stats(window, start, times[hi - 1], count=count, slot="s") == bucket_stats(
            fresh, start, times[hi - 1], count=count
        )
        end += 1 if rng.random() < 0.9 else rng.randint(2, 20)
