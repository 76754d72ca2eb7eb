"""Memory trend of one series: slopes, the monotonic climb, time to full, and a state.

The postmortem's lesson: one reading says nothing. "A climb that never falls back
is a leak or cache growth; a spike straight to the top is over-provisioning." The
definitions and thresholds of each state are in docs/trend.md.

Everything here is pure and cheap: it runs every sample interval for every series.
Values are kept as a share of the series' capacity (0-1), so one set of thresholds
fits an 80 GB GPU and a 2 TB host alike; slopes are turned back into bytes on export.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from dataclasses import dataclass, replace

from oomguard.model import Trend

# Kendall's tau a rise must reach to count as a climb (1: every later bucket is higher).
CONSISTENT = 0.6
# Share of the climb's span its rise must be spread over (a step up is not a leak).
SPREAD = 0.35


@dataclass(frozen=True, slots=True)
class TrendSettings:
    interval_seconds: float = 2.0
    short_window_seconds: float = 120.0
    long_window_seconds: float = 1800.0
    # A fall of more than this (share of capacity) ends a climb: normal churn falls back.
    tolerance_ratio: float = 0.02
    climb_min_seconds: float = 300.0
    climb_min_rise_ratio: float = 0.03
    # Slower than this is not a leak but load drifting (a diurnal cycle of +-8 % peaks at 0.035 %/min).
    climb_min_slope_ratio_per_minute: float = 0.0006
    spike_rise_ratio: float = 0.15
    spike_level_ratio: float = 0.90
    saturated_ratio: float = 0.97
    sawtooth_span_ratio: float = 0.04
    # A fall this large within one interval is a restart (memory freed at once), not churn: history restarts.
    restart_drop_ratio: float = 0.5

    def time_scaled(self, scale: float) -> TrendSettings:
        """The same analysis on a clock `scale` times faster (the drill's): times divided, the slope
        threshold multiplied. The floors keep a window several samples wide and a sample on the
        exporter's own clock (a real process's fixed costs do not shrink with the scenario)."""
        return replace(
            self,
            interval_seconds=max(0.1, self.interval_seconds / scale),
            short_window_seconds=max(2.0, self.short_window_seconds / scale),
            long_window_seconds=max(30.0, self.long_window_seconds / scale),
            climb_min_seconds=max(3.0, self.climb_min_seconds / scale),
            climb_min_slope_ratio_per_minute=self.climb_min_slope_ratio_per_minute * scale,
        )


def theil_sen(points: list[tuple[float, float]]) -> float | None:
    """Median of pairwise slopes: one wild reading cannot tilt it (unlike least squares)."""
    slopes = [(v2 - v1) / (t2 - t1) for i, (t1, v1) in enumerate(points) for t2, v2 in points[i + 1 :] if t2 > t1]
    return statistics.median(slopes) if slopes else None


@dataclass(frozen=True, slots=True)
class History:
    """Samples as two parallel lists, times ascending: windows are found by bisection and cut by
    slicing, with no pass over every sample in Python (this runs for every series every tick)."""

    times: list[float]
    values: list[float]

    def since(self, start: float) -> History:
        i = bisect.bisect_left(self.times, start)
        return History(self.times[i:], self.values[i:])


def bucket_points(
    history: History, start: float, end: float, *, floor: bool = False, count: int = 12
) -> list[tuple[float, float]]:
    """Split [start, end] into equal buckets; one point per bucket: its median, or its 10th percentile
    (`floor`: the troughs under a sawtooth, where one wild low reading does not count)."""
    if end - start <= 0:
        return []
    width = (end - start) / count
    times = history.times
    edges = [bisect.bisect_left(times, start + i * width) for i in range(count)] + [len(times)]
    points = []
    for i in range(count):
        values = history.values[edges[i] : edges[i + 1]]
        if values:
            stat = sorted(values)[len(values) // 10] if floor else statistics.median(values)
            points.append((start + (i + 0.5) * width, stat))
    return points


def robust_slope(history: History, start: float, end: float, *, floor: bool = False) -> float | None:
    points = bucket_points(history, start, end, floor=floor)
    return theil_sen(points) if len(points) >= 3 else None


def consistency(points: list[tuple[float, float]]) -> float:
    """Kendall's tau of value against time (-1..1): near 1 when nearly every later point is higher.

    A leak rises throughout; one step up (a burst, a restart's load) or noise does not.
    """
    pairs = [(v2 > v1) - (v2 < v1) for i, (_, v1) in enumerate(points) for _, v2 in points[i + 1 :]]
    return sum(pairs) / len(pairs) if pairs else 0.0


def spread(points: list[tuple[float, float]]) -> float:
    """Share of the span over which the rise happened (10 % to 90 % of it): a leak's rise is spread
    out, a burst's or a restart's is one step."""
    (t0, first), (t1, last) = points[0], points[-1]
    rise = last - first
    if rise <= 0 or t1 <= t0:
        return 0.0
    t10 = next(t for t, v in points if v >= first + 0.1 * rise)
    t90 = next(t for t, v in points if v >= first + 0.9 * rise)
    return (t90 - t10) / (t1 - t0)


class Series:
    """The bounded history of one series and its climb, fed one sample at a time."""

    def __init__(self, settings: TrendSettings) -> None:
        self.settings = settings
        self.samples: deque[tuple[float, float]] = deque(
            maxlen=int(settings.long_window_seconds / settings.interval_seconds) + 8
        )
        self._recent: deque[float] = deque(maxlen=3)
        self.climb_start: float | None = None
        self.climb_floor = 0.0
        self.peak = 0.0
        # Once called a climb, it stays one while its floor still rises: no flapping at the
        # thresholds while noise (or cache churn) moves the level up and down.
        self.latched = False
        self.latched_at = 0.0

    def add(self, t: float, ratio: float) -> None:
        s = self.settings
        if self.samples and self.samples[-1][1] - ratio >= s.restart_drop_ratio:
            self.reset()
        self.samples.append((t, ratio))
        while self.samples and self.samples[0][0] < t - s.long_window_seconds:
            self.samples.popleft()
        # The climb follows a median of 3, so one odd reading neither ends nor starts it.
        self._recent.append(ratio)
        smooth = statistics.median(self._recent)
        if self.climb_start is None or smooth < self.peak - s.tolerance_ratio:
            self.climb_start, self.climb_floor, self.peak = t, smooth, smooth
        else:
            self.peak = max(self.peak, smooth)

    def reset(self) -> None:
        self.samples.clear()
        self._recent.clear()
        self.climb_start = None
        self.latched = False

    def trend(self) -> Trend | None:
        if not self.samples:
            return None
        s = self.settings
        samples = History([t for t, _ in self.samples], [v for _, v in self.samples])
        first, now = samples.times[0], samples.times[-1]
        level = statistics.median(self._recent)
        short = samples.since(now - s.short_window_seconds)
        slope_short = robust_slope(short, now - s.short_window_seconds, now)
        slope_long = robust_slope(samples, first, now)
        climb_seconds = now - self.climb_start if self.climb_start is not None else 0.0
        state = self._classify(samples, short, level, climb_seconds, now)
        rising = {"spike": slope_short, "climbing": self._climb_slope(samples, now)}.get(state)
        seconds_to_full = (1.0 - level) / rising if rising and rising > 0 else None
        if state == "climbing" and rising:
            slope_long = rising
        return Trend(state, level, slope_short, slope_long, climb_seconds, seconds_to_full, now - first)

    def _climb_slope(self, samples: History, now: float) -> float | None:
        """The pace of the current climb, or of the floor under a sawtooth when that is what rises."""
        assert self.climb_start is not None
        slope = robust_slope(samples.since(self.climb_start), self.climb_start, now)
        floor = robust_slope(samples, samples.times[0], now, floor=True)
        candidates = [x for x in (slope, floor) if x is not None]
        return max(candidates) if candidates else None

    def _classify(
        self,
        samples: History,
        short: History,
        level: float,
        climb_seconds: float,
        now: float,
    ) -> str:
        s = self.settings
        if statistics.median(samples.since(now - 30.0).values) >= s.saturated_ratio:
            return "saturated"
        if level >= s.spike_level_ratio and level - min(short.values) >= s.spike_rise_ratio:
            return "spike"
        climbing = self._is_climbing(samples, level, climb_seconds, now)
        if climbing and not self.latched:
            self.latched_at = now
        self.latched = climbing
        if climbing:
            return "climbing"
        values = sorted(samples.values)
        p5, p95 = values[int(0.05 * (len(values) - 1))], values[int(0.95 * (len(values) - 1))]
        return "sawtooth" if p95 - p5 >= s.sawtooth_span_ratio else "steady"

    def _is_climbing(self, samples: History, level: float, climb_seconds: float, now: float) -> bool:
        s = self.settings
        if self.latched:
            start = max(self.latched_at - s.climb_min_seconds, now - s.long_window_seconds / 2, samples.times[0])
            slope = robust_slope(samples.since(start), start, now, floor=True)
            return slope is not None and slope >= s.climb_min_slope_ratio_per_minute / 60 / 2
        # A climb that has not fallen back for a while, and whose latter half still rises, steadily,
        # at a leak's pace: a restart's loading ramp, a burst (a step up, then flat) and noise all fail.
        if climb_seconds >= s.climb_min_seconds and level - self.climb_floor >= s.climb_min_rise_ratio:
            start = max(now - climb_seconds / 2, samples.times[0])
            if self._rises(samples.since(start), start, now, s.climb_min_rise_ratio / 2):
                return True
        # A sawtooth whose troughs rise: a leak under cache churn. Needs most of the long window.
        start = samples.times[0]
        return now - start >= 0.8 * s.long_window_seconds and self._rises(
            samples, start, now, s.climb_min_rise_ratio, floor=True
        )

    def _rises(self, samples: History, start: float, end: float, min_rise: float, *, floor: bool = False) -> bool:
        points = bucket_points(samples, start, end, floor=floor)
        if len(points) < 6:
            return False
        slope = theil_sen(points) or 0.0
        return (
            slope >= self.settings.climb_min_slope_ratio_per_minute / 60
            and slope * (end - start) >= min_rise
            and consistency(points) >= CONSISTENT
            and spread(points) >= SPREAD
        )
