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
from collections import deque
from dataclasses import dataclass, field, replace
from itertools import combinations

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


def median_of_sorted(data: list[float]) -> float:
    """statistics.median's result, from a list already sorted (the same formula: the middle value,
    or the mean of the middle two)."""
    n = len(data)
    if n % 2:
        return data[n // 2]
    return (data[n // 2 - 1] + data[n // 2]) / 2


def theil_sen(points: list[tuple[float, float]]) -> float | None:
    """Median of pairwise slopes: one wild reading cannot tilt it (unlike least squares)."""
    slopes = [(v2 - v1) / (t2 - t1) for (t1, v1), (t2, v2) in combinations(points, 2) if t2 > t1]
    return median_of_sorted(sorted(slopes)) if slopes else None


# A bucket kept sorted between ticks: [absolute index of its first sample, of the one past its last, values sorted].
SortedBucket = list  # [int, int, list[float]]


@dataclass(frozen=True, slots=True)
class History:
    """A window of a series' samples: parallel lists, times ascending, and the window's bounds in them.
    Windows are found by bisection, with no copy and no pass over every sample in Python (this runs for
    every series every tick). `base` is the absolute index (counted since the series began) of the lists'
    first element, so that a bucket's sorted values can be carried from one tick to the next (`sorted_cache`)."""

    times: list[float]
    values: list[float]
    lo: int = 0
    hi: int = -1
    base: int = 0
    sorted_cache: dict[str, list[SortedBucket | None]] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.hi < 0:
            object.__setattr__(self, "hi", len(self.times))

    def since(self, start: float) -> History:
        i = bisect.bisect_left(self.times, start, self.lo, self.hi)
        return History(self.times, self.values, i, self.hi, self.base, self.sorted_cache)

    def __len__(self) -> int:
        return self.hi - self.lo

    @property
    def first(self) -> float:
        return self.times[self.lo]

    def window(self) -> list[float]:
        return self.values[self.lo : self.hi]


def _slide(data: list[float], values: list[float], old_lo: int, lo: int, old_hi: int, hi: int) -> bool:
    """sorted(values[old_lo:old_hi]) -> sorted(values[lo:hi]) in place, for old_lo <= lo <= old_hi <= hi."""
    for value in values[old_lo:lo]:
        if not _remove(data, value):
            return False
    for value in values[old_hi:hi]:
        bisect.insort(data, value)
    return True


def _remove(data: list[float], value: float) -> bool:
    i = bisect.bisect_left(data, value)
    if i < len(data) and data[i] == value:
        del data[i]
        return True
    return False  # NaN, or out of step: the caller sorts afresh


def bucket_data(
    history: History, start: float, end: float, *, count: int = 12, slot: str | None = None
) -> list[tuple[float, list[float]]]:
    """Split [start, end] into equal buckets; per bucket that holds samples: its centre and its values,
    sorted. `slot` names the caller, whose buckets are kept sorted from one tick to the next
    (the window slides by a sample or two per tick: the values that left are taken out of the sorted
    list, those that came are inserted, the same list as sorting afresh); without one, each bucket is
    sorted afresh. `base` is the absolute index of values[0]: the cache holds absolute indices, so a
    compaction of the lists does not mislead it."""
    if end - start <= 0:
        return []
    width = (end - start) / count
    times, lo, hi = history.times, history.lo, history.hi
    edges = [bisect.bisect_left(times, start + i * width, lo, hi) for i in range(count)] + [hi]
    cache, values, base = history.sorted_cache, history.values, history.base
    out = []
    kept: list[SortedBucket | None] | None = None
    if cache is not None and slot is not None:
        kept = cache.get(slot)
        if kept is None or len(kept) != count:
            kept = cache[slot] = [None] * count
    for i in range(count):
        a, b = edges[i], edges[i + 1]
        if a < b:
            if kept is None:
                data = sorted(values[a:b])
            else:
                entry, new_lo, new_hi = kept[i], a + base, b + base
                if entry is not None and entry[0] == new_lo and entry[1] == new_hi:
                    data = entry[2]
                elif (
                    entry is not None
                    and base <= entry[0] <= new_lo <= entry[1] <= new_hi
                    and new_lo - entry[0] + new_hi - entry[1] < 8
                    and _slide(entry[2], values, entry[0] - base, a, entry[1] - base, b)
                ):
                    data = entry[2]
                    entry[0], entry[1] = new_lo, new_hi
                else:
                    data = sorted(values[a:b])
                    kept[i] = [new_lo, new_hi, data]
            out.append((start + (i + 0.5) * width, data))
    return out


def stat_points(buckets: list[tuple[float, list[float]]], *, floor: bool = False) -> list[tuple[float, float]]:
    """One point per bucket: its median, or its 10th percentile (`floor`: the troughs under a sawtooth,
    where one wild low reading does not count)."""
    if floor:
        return [(centre, data[len(data) // 10]) for centre, data in buckets]
    return [(centre, median_of_sorted(data)) for centre, data in buckets]


def bucket_points(
    history: History, start: float, end: float, *, floor: bool = False, count: int = 12, slot: str | None = None
) -> list[tuple[float, float]]:
    """Split [start, end] into equal buckets; one point per bucket: its median, or its 10th percentile."""
    return stat_points(bucket_data(history, start, end, count=count, slot=slot), floor=floor)


def slope_of(points: list[tuple[float, float]]) -> float | None:
    return theil_sen(points) if len(points) >= 3 else None


def robust_slope(
    history: History, start: float, end: float, *, floor: bool = False, slot: str | None = None
) -> float | None:
    return slope_of(bucket_points(history, start, end, floor=floor, slot=slot))


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
    """The bounded history of one series and its climb, fed one sample at a time.

    The samples are kept as parallel lists (times, values) with the window's start in them, compacted
    now and then, and the values also kept sorted as a whole and per bucket of the windows analysed
    (bucket_data): a tick adds a sample and drops one, so it moves a few values in sorted
    lists instead of sorting the whole history again. The results are those of sorting afresh."""

    def __init__(self, settings: TrendSettings) -> None:
        self.settings = settings
        self.maxlen = int(settings.long_window_seconds / settings.interval_seconds) + 8
        self._times: list[float] = []
        self._values: list[float] = []
        self._head = 0  # index of the oldest sample still in the window
        self._base = 0  # samples compacted away since the series began: absolute index = _base + list index
        self._sorted: list[float] = []  # the window's values, sorted (the spread's percentiles)
        self._buckets: dict[str, list[SortedBucket | None]] = {}
        self._recent: deque[float] = deque(maxlen=3)
        self.climb_start: float | None = None
        self.climb_floor = 0.0
        self.peak = 0.0
        # Once called a climb, it stays one while its floor still rises: no flapping at the
        # thresholds while noise (or cache churn) moves the level up and down.
        self.latched = False
        self.latched_at = 0.0
        self._whole_floor: list[tuple[float, float]] | None = None  # this tick's, computed at most once

    def __len__(self) -> int:
        """The samples held: never more than the long window's worth (`maxlen`)."""
        return len(self._times) - self._head

    @property
    def last_time(self) -> float | None:
        return self._times[-1] if len(self) else None

    def _drop_oldest(self) -> None:
        _remove(self._sorted, self._values[self._head]) or self._resort()
        self._head += 1

    def _resort(self) -> None:
        self._sorted = sorted(self._values[self._head :])

    def add(self, t: float, ratio: float) -> None:
        s = self.settings
        if len(self) and self._values[-1] - ratio >= s.restart_drop_ratio:
            self.reset()
        if len(self) == self.maxlen:
            self._drop_oldest()
        self._times.append(t)
        self._values.append(ratio)
        bisect.insort(self._sorted, ratio)
        while len(self) and self._times[self._head] < t - s.long_window_seconds:
            self._drop_oldest()
        if self._head >= self.maxlen:  # compact: the lists hold at most two windows' worth
            del self._times[: self._head], self._values[: self._head]
            self._base += self._head
            self._head = 0
        # The climb follows a median of 3, so one odd reading neither ends nor starts it.
        self._recent.append(ratio)
        smooth = median_of_sorted(sorted(self._recent))
        if self.climb_start is None or smooth < self.peak - s.tolerance_ratio:
            self.climb_start, self.climb_floor, self.peak = t, smooth, smooth
        else:
            self.peak = max(self.peak, smooth)

    def reset(self) -> None:
        self._base += len(self._times)
        self._times, self._values, self._head = [], [], 0
        self._sorted.clear()
        self._buckets.clear()
        self._recent.clear()
        self.climb_start = None
        self.latched = False

    def trend(self) -> Trend | None:
        if not len(self):
            return None
        s = self.settings
        samples = History(self._times, self._values, self._head, len(self._times), self._base, self._buckets)
        first, now = samples.first, self._times[-1]
        level = median_of_sorted(sorted(self._recent))
        short = samples.since(now - s.short_window_seconds)
        slope_short = robust_slope(short, now - s.short_window_seconds, now)  # a few samples a bucket
        # The whole history's buckets, shared by the long slope and the floor's (sorted once per tick).
        whole = bucket_data(samples, first, now, slot="all")
        self._whole_floor = None
        slope_long = slope_of(stat_points(whole))
        climb_seconds = now - self.climb_start if self.climb_start is not None else 0.0
        state = self._classify(samples, short, whole, level, climb_seconds, now)
        rising = None  # the pace toward full: only for these two states, and only then computed
        if state == "spike":
            rising = slope_short
        elif state == "climbing":
            rising = self._climb_slope(samples, whole, now)
        seconds_to_full = (1.0 - level) / rising if rising and rising > 0 else None
        if state == "climbing" and rising:
            slope_long = rising
        return Trend(state, level, slope_short, slope_long, climb_seconds, seconds_to_full, now - first)

    def _floor_points(self, whole: list[tuple[float, list[float]]]) -> list[tuple[float, float]]:
        if self._whole_floor is None:
            self._whole_floor = stat_points(whole, floor=True)
        return self._whole_floor

    def _climb_slope(self, samples: History, whole: list[tuple[float, list[float]]], now: float) -> float | None:
        """The pace of the current climb, or of the floor under a sawtooth when that is what rises."""
        assert self.climb_start is not None
        slope = robust_slope(samples.since(self.climb_start), self.climb_start, now, slot="climb")
        floor = slope_of(self._floor_points(whole))
        candidates = [x for x in (slope, floor) if x is not None]
        return max(candidates) if candidates else None

    def _classify(
        self,
        samples: History,
        short: History,
        whole: list[tuple[float, list[float]]],
        level: float,
        climb_seconds: float,
        now: float,
    ) -> str:
        s = self.settings
        if median_of_sorted(sorted(samples.since(now - 30.0).window())) >= s.saturated_ratio:
            return "saturated"
        if level >= s.spike_level_ratio and level - min(short.window()) >= s.spike_rise_ratio:
            return "spike"
        climbing = self._is_climbing(samples, whole, level, climb_seconds, now)
        if climbing and not self.latched:
            self.latched_at = now
        self.latched = climbing
        if climbing:
            return "climbing"
        values = self._sorted
        p5, p95 = values[int(0.05 * (len(values) - 1))], values[int(0.95 * (len(values) - 1))]
        return "sawtooth" if p95 - p5 >= s.sawtooth_span_ratio else "steady"

    def _is_climbing(
        self, samples: History, whole: list[tuple[float, list[float]]], level: float, climb_seconds: float, now: float
    ) -> bool:
        s = self.settings
        if self.latched:
            start = max(self.latched_at - s.climb_min_seconds, now - s.long_window_seconds / 2, samples.first)
            slope = robust_slope(samples.since(start), start, now, floor=True, slot="latched")
            return slope is not None and slope >= s.climb_min_slope_ratio_per_minute / 60 / 2
        # A climb that has not fallen back for a while, and whose latter half still rises, steadily,
        # at a leak's pace: a restart's loading ramp, a burst (a step up, then flat) and noise all fail.
        if climb_seconds >= s.climb_min_seconds and level - self.climb_floor >= s.climb_min_rise_ratio:
            start = max(now - climb_seconds / 2, samples.first)
            points = bucket_points(samples.since(start), start, now, slot="half")
            if self._rises(points, start, now, s.climb_min_rise_ratio / 2):
                return True
        # A sawtooth whose troughs rise: a leak under cache churn. Needs most of the long window.
        start = samples.first
        return now - start >= 0.8 * s.long_window_seconds and self._rises(
            self._floor_points(whole), start, now, s.climb_min_rise_ratio
        )

    def _rises(self, points: list[tuple[float, float]], start: float, end: float, min_rise: float) -> bool:
        if len(points) < 6:
            return False
        needed = max(self.settings.climb_min_slope_ratio_per_minute / 60, min_rise / (end - start))
        values = [v for _, v in points]
        # No pairwise slope can exceed the points' range over the closest pair's distance (a bucket's
        # width, (end - start) / 12): below half the pace needed (a margin for rounding), the median of
        # the slopes cannot reach it either. Most series are not rising: this spares their Theil-Sen.
        if needed > 0 and (max(values) - min(values)) * 2 < needed * (end - start) / 12:
            return False
        slope = theil_sen(points) or 0.0
        return (
            slope >= self.settings.climb_min_slope_ratio_per_minute / 60
            and slope * (end - start) >= min_rise
            and consistency(points) >= CONSISTENT
            and spread(points) >= SPREAD
        )
