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
from array import array
from collections import deque
from collections.abc import MutableSequence, Sequence
from itertools import combinations

from oomguard.exporter.model import Trend, TrendSettings

# Kendall's tau a rise must reach to count as a climb (1: every later bucket is higher).
CONSISTENT = 0.6
# Share of the climb's span its rise must be spread over (a step up is not a leak).
SPREAD = 0.35
# The slow climb's time to full: when the GPU has run out with these odds (a transient allocation no longer fitting).
# Two in five: a slow leak's OOM comes with a transient, at a moment spread over an hour or more, and its page is due
# once that moment has a fair chance within the hour, not once it is likely (on the detection library three in four
# left 4 slow leaks unpaged 5 minutes ahead, two in five 2: docs/performance.md, "Detection").
OOM_ODDS = 0.4
# A slow climb's second half must rise at least this share of its first half's pace to be called (an allocator's
# warm-up decays: its second half is slower), and this share to be held once called.
STEADY = 0.5
HOLD_STEADY = 0.35
# A series' samples that left its window are dropped from its arrays this many at a time (a move of the window's
# 900 doubles, 7 KiB, every 64 samples).
COMPACT_AFTER = 64


def median_of_sorted(data: Sequence[float]) -> float:
    """statistics.median's result, from a list already sorted (the same formula: the middle value,
    or the mean of the middle two)."""
    n = len(data)
    if n % 2:
        return data[n // 2]
    return (data[n // 2 - 1] + data[n // 2]) / 2


def theil_sen(points: list[tuple[float, float]]) -> float | None:
    """Median of pairwise slopes: one wild reading cannot tilt it (unlike least squares)."""
    slopes = [(v2 - v1) / (t2 - t1) for (t1, v1), (t2, v2) in combinations(points, 2) if t2 > t1]
    if not slopes:
        return None
    slopes.sort()
    return median_of_sorted(slopes)


class BucketCache:
    """What one caller (a slot) keeps of its buckets from one tick to the next.

    `kept`: per bucket, its values sorted (an array of doubles, or None), `kept_lo` and `kept_hi` the absolute
    indices of its first sample and of the one past its last; a bucket that moved by a sample or two is slid (the
    values that left taken out, those that came put in).
    `ring`: the statistics (median, 10th percentile) of the buckets seen, by absolute index range. At full
    history a window slides by one sample a tick and its width stays put, so bucket i's range of this tick
    is bucket i + 1's of (width / interval) ticks ago: 11 of 12 buckets are found here, and only the newest
    is computed. Stored in arrays, slot b % size, keyed by both ends: an entry is used only for its exact
    range, and values never change once added, so a hit is the same result as sorting afresh. Its size is a
    little over the span (grown by a quarter at a time, not to the next power of two: 921 entries for a full
    window of 900 samples, not 1,024), and its keys 4 bytes each: the end modulo 2**32 (two ends the ring holds at
    once are less than its size apart) and the width (1 or more; 0 in an entry never written)."""

    __slots__ = ("ends", "floors", "kept", "kept_hi", "kept_lo", "medians", "size", "widths")

    def __init__(self) -> None:
        self.kept: list[array | None] = []
        self.kept_lo = self.kept_hi = array("q")
        self.size = 0

    def _grow(self, span: int) -> None:
        size = 64
        while size <= span:
            size += size // 4
        self.size = size
        self.widths = array(_U32, [0]) * size
        self.ends = array(_U32, [0]) * size
        self.medians = array("d", [0.0]) * size
        self.floors = array("d", [0.0]) * size


_U32 = "I" if array("I").itemsize >= 4 else "L"  # an unsigned type of at least 32 bits
_LOW32 = 0xFFFFFFFF


def _stats(data: Sequence[float]) -> tuple[float, float]:
    """A sorted bucket's median and 10th percentile (the index stat_points used)."""
    n = len(data)
    return (data[n // 2] if n % 2 else (data[n // 2 - 1] + data[n // 2]) / 2), data[n // 10]


class History:
    """A window of a series' samples: parallel lists, times ascending, and the window's bounds in them.
    Windows are found by bisection, with no copy and no pass over every sample in Python (this runs for
    every series every tick). `base` is the absolute index (counted since the series began) of the lists'
    first element, so that buckets can be carried from one tick to the next (`caches`, by slot)."""

    __slots__ = ("base", "caches", "hi", "lo", "times", "values")

    def __init__(
        self,
        times: Sequence[float],
        values: Sequence[float],
        lo: int = 0,
        hi: int = -1,
        base: int = 0,
        caches: dict[str, BucketCache] | None = None,
    ) -> None:
        self.times, self.values, self.lo, self.base, self.caches = times, values, lo, base, caches
        self.hi = len(times) if hi < 0 else hi

    def since(self, start: float) -> History:
        i = bisect.bisect_left(self.times, start, self.lo, self.hi)
        return History(self.times, self.values, i, self.hi, self.base, self.caches)

    def __len__(self) -> int:
        return self.hi - self.lo

    @property
    def first(self) -> float:
        return self.times[self.lo]

    def window(self) -> Sequence[float]:
        return self.values[self.lo : self.hi]


def _slide(data: MutableSequence[float], values: Sequence[float], old_lo: int, lo: int, old_hi: int, hi: int) -> bool:
    """sorted(values[old_lo:old_hi]) -> sorted(values[lo:hi]) in place, for old_lo <= lo <= old_hi <= hi."""
    for value in values[old_lo:lo]:
        if not _remove(data, value):
            return False
    for value in values[old_hi:hi]:
        bisect.insort(data, value)
    return True


def _remove(data: MutableSequence[float], value: float) -> bool:
    i = bisect.bisect_left(data, value)
    if i < len(data) and data[i] == value:
        del data[i]
        return True
    return False  # NaN, or out of step: the caller sorts afresh


def bucket_stats(
    history: History, start: float, end: float, *, count: int = 12, slot: str | None = None
) -> list[tuple[float, float, float]]:
    """Split [start, end] into equal buckets; per bucket that holds samples: its centre, its median and its
    10th percentile. `slot` names the caller, whose buckets are carried from one tick to the next
    (BucketCache); without one (or without `history.caches`), each bucket is sorted afresh. Either way the
    figures are those of sorting each bucket's values afresh."""
    if end - start <= 0:
        return []
    width = (end - start) / count
    times, lo, hi = history.times, history.lo, history.hi
    edges = [bisect.bisect_left(times, start + i * width, lo, hi) for i in range(count)]
    edges.append(hi)
    values, base = history.values, history.base
    caches = history.caches
    out = []
    if caches is None or slot is None:
        for i in range(count):
            a, b = edges[i], edges[i + 1]
            if a < b:
                out.append((start + (i + 0.5) * width, *_stats(sorted(values[a:b]))))
        return out
    cache = caches.get(slot)
    if cache is None:
        cache = caches[slot] = BucketCache()
    kept = cache.kept
    if len(kept) != count:
        kept = cache.kept = [None] * count
        cache.kept_lo, cache.kept_hi = array("q", [-1]) * count, array("q", [-1]) * count
    kept_lo, kept_hi = cache.kept_lo, cache.kept_hi
    if cache.size <= hi - lo:
        cache._grow(hi - lo)
    size = cache.size
    widths, ends, medians, floors = cache.widths, cache.ends, cache.medians, cache.floors
    for i in range(count):
        a, b = edges[i], edges[i + 1]
        if a < b:
            new_lo, new_hi = a + base, b + base
            at, end = new_hi % size, new_hi & _LOW32
            if ends[at] == end and widths[at] == b - a:
                out.append((start + (i + 0.5) * width, medians[at], floors[at]))
                continue
            data = kept[i]
            old_lo, old_hi = kept_lo[i], kept_hi[i]
            if data is not None and old_lo == new_lo and old_hi == new_hi:
                pass
            elif (
                data is not None
                and base <= old_lo <= new_lo <= old_hi <= new_hi
                and new_lo - old_lo + new_hi - old_hi < 8
                and _slide(data, values, old_lo - base, a, old_hi - base, b)
            ):
                kept_lo[i], kept_hi[i] = new_lo, new_hi
            else:
                data = kept[i] = array("d", sorted(values[a:b]))  # 8 bytes a value, not a float object's 32
                kept_lo[i], kept_hi[i] = new_lo, new_hi
            median, floor = _stats(data)
            widths[at], ends[at], medians[at], floors[at] = b - a, end, median, floor
            out.append((start + (i + 0.5) * width, median, floor))
    return out


def stat_points(buckets: list[tuple[float, float, float]], *, floor: bool = False) -> list[tuple[float, float]]:
    """One point per bucket: its median, or its 10th percentile (`floor`: the troughs under a sawtooth,
    where one wild low reading does not count)."""
    if floor:
        return [(centre, low) for centre, _, low in buckets]
    return [(centre, median) for centre, median, _ in buckets]


def bucket_points(
    history: History, start: float, end: float, *, floor: bool = False, count: int = 12, slot: str | None = None
) -> list[tuple[float, float]]:
    """Split [start, end] into equal buckets; one point per bucket: its median, or its 10th percentile."""
    return stat_points(bucket_stats(history, start, end, count=count, slot=slot), floor=floor)


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


class Creep:
    """The slow climb of one series, judged over hours (docs/trend.md, "A slow climb in what is left").

    Each period (`creep_period_seconds`, at least four samples) leaves one point: the lowest reading in it (its
    floor: a wobble above it, a transient allocation, does not count) and its wobble (highest minus lowest). The
    points of `creep_window_seconds` are kept, as arrays. (Its wobble leaves out the period's own rise, first reading
    to last: a leak's steps are no wobble.) A climb runs from the last point where the floor (a median
    of three, so that one odd period neither starts nor ends it) fell more than `creep_tolerance_ratio` below its
    highest since: a leak never falls back, a load does. It is called a climb where, over `creep_min_seconds` or
    more, the series is quiet (a quarter of its periods wobble less than `creep_quiet_ratio`: a series that moves
    with its load is judged by the faster rules, never here), its floor rises steadily (Kendall's tau of twelve
    bucket medians, a rise spread over the span, its second half still rising at least half as fast as its first:
    an allocator's warm-up decays, a leak does not), by `creep_min_rise_ratio` of what was left, at a pace
    that fills what is left within `creep_horizon_seconds`. The judgement changes only when a point is added."""

    __slots__ = (
        "_first", "_floor", "_judged_at", "_last", "_max", "_min", "_peaks", "_period_start", "_times", "_wobble",
        "called", "floor", "quiet", "settings", "slope", "start", "tolerance",
    )  # fmt: skip

    def __init__(self, settings: TrendSettings, noise_scale: float = 1.0) -> None:
        self.settings = settings
        # Noise is judged at the total's scale (see Series): its ratios of the capacity, scaled.
        self.tolerance = noise_ratio(settings.creep_tolerance_ratio, noise_scale)
        self.quiet = noise_ratio(settings.creep_quiet_ratio, noise_scale)
        self._times = array("d")
        self._floor = array("d")
        self._wobble = array("d")
        self._period_start: float | None = None
        self._min = self._max = self._first = self._last = 0.0
        self.called = False  # latched: a climb was called and still holds
        self.slope = 0.0  # its pace (share of capacity per second), while called
        self.start = 0.0  # when it began, while called
        self.floor = 0.0  # its newest floor, while called
        self._judged_at = 0.0  # the end of the period that floor is of
        self._peaks: list[float] = []  # the wobbles of its last six hours, sorted, while called

    @property
    def period(self) -> float:
        return max(self.settings.creep_period_seconds, 4 * self.settings.interval_seconds)

    def add(self, t: float, ratio: float) -> bool:
        """A sample; True where it closed a period (a point added: judge again)."""
        if self._period_start is None:
            self._period_start, self._min, self._max, self._first, self._last = t, ratio, ratio, ratio, ratio
            return False
        if t - self._period_start < self.period:
            self._min, self._max, self._last = min(self._min, ratio), max(self._max, ratio), ratio
            return False
        self._times.append(self._period_start + self.period / 2)
        self._floor.append(self._min)
        # What moved besides the period's own rise: a leak's steps within a period are no wobble.
        self._wobble.append(self._max - self._min - max(0.0, self._last - self._first))
        keep = int(self.settings.creep_window_seconds / self.period) + 1
        if len(self._times) > keep + 64:  # trimmed now and then, never beyond the window and a little
            drop = len(self._times) - keep
            del self._times[:drop], self._floor[:drop], self._wobble[:drop]
        self._period_start, self._min, self._max, self._first, self._last = t, ratio, ratio, ratio, ratio
        return True

    def reset(self) -> None:
        del self._times[:], self._floor[:], self._wobble[:]
        self._period_start = None
        self.called = False

    def judge(self, level: float) -> None:
        """After a point is added: whether the floor climbs, and at what pace."""
        s = self.settings
        n = len(self._times)
        first = max(0, n - int(s.creep_window_seconds / self.period))
        if n - first < 8:
            self.called = False
            return
        smooth = _median_of_three(self._floor[first:n])
        # The climb's start: the last fall of the floor beyond the tolerance below its highest since.
        begin, highest = 0, smooth[0]
        for i, floor in enumerate(smooth):
            if floor < highest - self.tolerance:
                begin, highest = i, floor
            else:
                highest = max(highest, floor)
        times = self._times[first + begin : n]
        floors = smooth[begin:]
        span = times[-1] - times[0] + self.period
        relaxed = self.called  # a climb already called is held while it still rises, however young its points
        if len(floors) < 8 or (span < s.creep_min_seconds and not relaxed):
            self.called = False
            return
        wobble = sorted(self._wobble[first + begin : n])
        if wobble[len(wobble) // 4] > self.quiet:
            self.called = False
            return
        slope = self._steady_slope(list(zip(times, floors, strict=True)), level, relaxed)
        self.called = slope is not None
        if slope is not None:
            self.slope, self.start = slope, times[0] - self.period / 2
            # The forecast starts from the newest period's own floor where it is higher: the smoothing that keeps
            # one odd period from starting or ending a climb lags a leak's floor by a period or two.
            self.floor, self._judged_at = max(floors[-1], self._floor[n - 1]), times[-1] + self.period / 2
            self._peaks = sorted(self._wobble[max(first + begin, n - int(6 * 3600 / self.period)) : n])

    def seconds_to_full(self, now: float, level: float | None = None) -> float:
        """`_time_to_full` from when its floor was last measured, counted down to `now`; sooner where `level` (the
        recent readings' median) stands above that floor by more than any wobble of its last six hours: the floor
        has risen since it was measured (a step the next period will show), by at least that excess."""
        counted = max(0.0, self._time_to_full() - (now - self._judged_at))
        top = self._peaks[-1] if self._peaks else 0.0
        if level is None or level - self.floor <= top:
            return counted
        return min(counted, self._time_to_full(level - top))

    def _time_to_full(self, floor: float | None = None) -> float:
        """How long until the GPU runs out: its floor rises at the climb's pace, and in each period it goes above its
        floor as it did in the periods of the last six hours (the wobbles seen: transient allocations). The first
        period whose wobble no longer fits in what is left is the OOM: the time by which that has happened with the
        odds OOM_ODDS. A leak runs the GPU out at the next transient allocation that does not fit, not when its floor
        reaches the top; this is that time, from what the series has shown."""
        left, slope, peaks = 1.0 - (self.floor if floor is None else floor), self.slope, self._peaks
        if left <= 0 or slope <= 0:
            return 0.0
        if not peaks or peaks[-1] <= 0:
            return left / slope
        # Until what is left is under the largest wobble seen, no period can run it out: start there.
        t = max(0.0, (left - peaks[-1]) / slope)
        survive, n = 1.0, len(peaks)
        while True:
            room = left - slope * t
            if room <= 0:
                return t
            # The share of periods whose wobble would not fit now: this period's odds of the OOM.
            survive *= bisect.bisect_right(peaks, room) / n
            if survive <= 1.0 - OOM_ODDS:
                return t
            t += self.period

    def _steady_slope(self, points: list[tuple[float, float]], level: float, relaxed: bool) -> float | None:
        s = self.settings
        start, end = points[0][0], points[-1][0]
        buckets = _bucket_medians(points, start, end)
        if len(buckets) < 6:
            return None
        slope = theil_sen(buckets)
        if slope is None or slope <= 0:
            return None
        rise = buckets[-1][1] - buckets[0][1]
        left = max(1.0 - buckets[0][1], 1e-9)
        if rise < s.creep_min_rise_ratio * left and not relaxed:
            return None
        if (1.0 - level) / slope > s.creep_horizon_seconds:
            return None
        if consistency(buckets) < (0.5 if relaxed else 0.7):
            return None
        if not relaxed and spread(buckets) < SPREAD:
            return None
        half = len(buckets) // 2
        early, late = theil_sen(buckets[: half + 1]), theil_sen(buckets[half:])
        if late is None or late < (HOLD_STEADY if relaxed else STEADY) * max(early or 0.0, slope):
            return None
        return slope


# A noise threshold never exceeds this share of the capacity, however small the capacity is against the total.
MAX_NOISE_RATIO = 0.25


def noise_ratio(ratio: float, scale: float) -> float:
    """A threshold of noise (a share of the total) as a share of a capacity `scale` times smaller (the headroom)."""
    return min(MAX_NOISE_RATIO, ratio * max(1.0, scale))


def _median_of_three(values: array) -> list[float]:
    """Each value replaced by the median of it and its neighbours (the ends by the lower of the two there)."""
    n = len(values)
    if n < 3:
        return list(values)
    out = [min(values[0], values[1])]
    for i in range(1, n - 1):
        a, b, c = values[i - 1], values[i], values[i + 1]
        out.append(max(min(a, b), min(max(a, b), c)))
    out.append(min(values[-2], values[-1]))
    return out


def _bucket_medians(points: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """Twelve equal buckets of [start, end]: each one's centre and the median of its values (those with any)."""
    width = (end - start) / 12 or 1.0
    groups: list[list[float]] = [[] for _ in range(12)]
    for t, v in points:
        groups[min(11, int((t - start) / width))].append(v)
    return [(start + (i + 0.5) * width, median_of_sorted(sorted(g))) for i, g in enumerate(groups) if g]


class Series:
    """The bounded history of one series and its climb, fed one sample at a time.

    The samples are kept as parallel lists (times, values) with the window's start in them, compacted
    now and then, and the values also kept sorted as a whole; the statistics of the windows' buckets are
    carried from one tick to the next (BucketCache): a tick adds a sample and drops one, so it computes
    the newest bucket of each window and finds the others' among those it computed before, instead of
    sorting every bucket again. The results are those of sorting afresh: `incremental=False` computes
    every statistic from scratch, each tick (the tests compare the two)."""

    def __init__(
        self, settings: TrendSettings, *, incremental: bool = True, from_serving: bool = False, noise_scale: float = 1.0
    ) -> None:
        """`from_serving`: the history begins with its engine up and serving (TrendTracker.forget), so a climb
        from its start is not a load: it may be called sooner (TrendSettings.climb_share_of_time_to_full).
        `noise_scale`: the total over the capacity the series is a share of (the headroom a reservation leaves is
        a tenth of the GPU at 0.90). What it judges as progress (a rise, a pace, the top) is a share of the
        capacity; what it judges as noise (a fall that ends a climb, a sawtooth's span) is a share of the total, as
        the bytes of a workspace or a transient do not shrink with the headroom."""
        self.settings = settings
        self.tolerance = noise_ratio(settings.tolerance_ratio, noise_scale)
        # A process exiting frees a share of the total: on the headroom basis its engine's reservation goes with it
        # (a new series, another basis), and a transient that comes and goes is no restart.
        self.restart_drop = settings.restart_drop_ratio * max(1.0, noise_scale)
        self.sawtooth_span = noise_ratio(settings.sawtooth_span_ratio, noise_scale)
        self.incremental = incremental
        self.from_serving = from_serving
        self.maxlen = int(settings.long_window_seconds / settings.interval_seconds) + 8
        # Arrays of doubles, not lists of floats: 8 bytes a sample, not a pointer and a float object's 32 (a target's
        # series holds 900 samples once its window is full, and a fleet exporter holds thousands of series).
        self._times = array("d")
        self._values = array("d")
        self._head = 0  # index of the oldest sample still in the window
        self._base = 0  # samples compacted away since the series began: absolute index = _base + array index
        self._sorted = array("d")  # the window's values, sorted (the spread's percentiles)
        self._buckets: dict[str, BucketCache] = {}
        self._recent: deque[float] = deque(maxlen=3)
        self.climb_start: float | None = None
        self.climb_floor = 0.0
        self.peak = 0.0
        self._plateau = 0.0  # the level it last rose to (by a quarter of the tolerance)
        self._plateau_since = 0.0  # and when
        # Once called a climb, it stays one while its floor still rises: no flapping at the
        # thresholds while noise (or cache churn) moves the level up and down.
        self.latched = False
        self.latched_slope = 0.0  # its pace when called (share of capacity per second)
        self._called_slope = 0.0
        self._whole_floor: list[tuple[float, float]] | None = None  # this tick's, computed at most once
        self.creep = Creep(settings, noise_scale)
        self._creep_due = False  # a point was added since the creep was last judged

    def __len__(self) -> int:
        """The samples held: never more than the long window's worth (`maxlen`)."""
        return len(self._times) - self._head

    @property
    def last_time(self) -> float | None:
        return self._times[-1] if len(self) else None

    def recent(self, seconds: float, points: int) -> list[float]:
        """The ratios of the last `seconds` (before the newest sample), at most `points` of them, evenly taken:
        a sparkline's (the status page's)."""
        if not len(self):
            return []
        start = bisect.bisect_left(self._times, self._times[-1] - seconds, self._head)
        values = self._values[start:]
        stride = max(1, -(-len(values) // points))
        return values[::stride].tolist()

    def _drop_oldest(self) -> None:
        _remove(self._sorted, self._values[self._head]) or self._resort()
        self._head += 1

    def _resort(self) -> None:
        self._sorted = array("d", sorted(self._values[self._head :]))

    def add(self, t: float, ratio: float) -> None:
        s = self.settings
        if len(self) and self._values[-1] - ratio >= self.restart_drop:
            self.reset()
        if len(self) == self.maxlen:
            self._drop_oldest()
        self._times.append(t)
        self._values.append(ratio)
        bisect.insort(self._sorted, ratio)
        while len(self) and self._times[self._head] < t - s.long_window_seconds:
            self._drop_oldest()
        if self._head >= COMPACT_AFTER:  # compact: the arrays hold at most the window and COMPACT_AFTER samples
            del self._times[: self._head], self._values[: self._head]
            self._base += self._head
            self._head = 0
        if self.creep.add(t, ratio):
            self._creep_due = True
        # The climb follows a median of 3, so one odd reading neither ends nor starts it.
        self._recent.append(ratio)
        smooth = median_of_sorted(sorted(self._recent))
        step = self.tolerance / 4
        if smooth > self._plateau + step:
            self._plateau, self._plateau_since = smooth, t
        if self.climb_start is None or smooth < self.peak - self.tolerance:
            self.climb_start, self.climb_floor, self.peak = t, smooth, smooth
            self._plateau, self._plateau_since = smooth, t
        elif t - self._plateau_since >= s.climb_soonest and not self.latched:
            # Flat this long, and no climb called: whatever rose before (an allocator's steps hours ago) is over,
            # and the climb begins where it leaves this plateau, not hours before (its latter half would be hours of
            # flat). The slow climb (Creep) judges a staircase as a whole; a climb called keeps its start.
            self.climb_start, self.climb_floor, self.peak = t, smooth, max(smooth, self._plateau)
            self._plateau_since = t
        else:
            self.peak = max(self.peak, smooth)

    def reset(self) -> None:
        self._base += len(self._times)
        self._times, self._values, self._head = array("d"), array("d"), 0
        del self._sorted[:]
        self._buckets.clear()
        self._recent.clear()
        self.climb_start = None
        self.latched = False
        self.creep.reset()
        self.from_serving = False  # memory freed at once: a restart, whose load comes next

    def trend(self) -> Trend | None:
        if not len(self):
            return None
        s = self.settings
        caches = self._buckets if self.incremental else None
        samples = History(self._times, self._values, self._head, len(self._times), self._base, caches)
        first, now = samples.first, self._times[-1]
        level = median_of_sorted(sorted(self._recent))
        short = samples.since(now - s.short_window_seconds)
        slope_short = robust_slope(short, now - s.short_window_seconds, now, slot="short")
        # The whole history's buckets, shared by the long slope and the floor's (computed once per tick).
        whole = bucket_stats(samples, first, now, slot="all")
        self._whole_floor = None
        slope_long = slope_of(stat_points(whole))
        climb_seconds = now - self.climb_start if self.climb_start is not None else 0.0
        if self._creep_due:
            self.creep.judge(level)
            self._creep_due = False
        state = self._classify(samples, short, whole, level, climb_seconds, now)
        # The pace toward full, only where a climb or a spike is called (and only then computed): pinned near the
        # top (saturated), a climb that was called goes on being one, and its time to full with it.
        rising = None
        seconds_to_full = None
        if state == "spike":
            rising = slope_short
        elif state in ("climbing", "saturated"):
            fast_age = climb_seconds  # the fast climb's, since it last left its floor
            if self.creep.called:  # the slow climb's: its pace over hours, its length since it began
                rising, climb_seconds = self.creep.slope, max(climb_seconds, now - self.creep.start)
                seconds_to_full = self.creep.seconds_to_full(now, level)
            # A fast climb's pace, where it has run long enough to be measured (minutes of samples, not the few
            # since it last left a plateau), or where no slow climb is called: the faster of the two counts.
            if self.latched and (rising is None or fast_age >= 2 * s.climb_min_seconds):
                fast = self._climb_slope(samples, whole, now)
                if fast is not None and (rising is None or fast > rising):
                    rising, seconds_to_full = fast, None
        if seconds_to_full is None and rising and rising > 0:
            seconds_to_full = max(0.0, 1.0 - level) / rising
        if state == "climbing" and rising:
            slope_long = rising
        self._whole_floor = None  # this tick's: not kept until the next
        return Trend(state, level, slope_short, slope_long, climb_seconds, seconds_to_full)

    def _floor_points(self, whole: list[tuple[float, float, float]]) -> list[tuple[float, float]]:
        if self._whole_floor is None:
            self._whole_floor = stat_points(whole, floor=True)
        return self._whole_floor

    def _climb_slope(self, samples: History, whole: list[tuple[float, float, float]], now: float) -> float | None:
        """The pace of the current climb, or of the floor under a sawtooth when that is what rises. A climb of less
        than `climb_soonest` (it fell back, or left a plateau, a moment ago) has no pace yet worth its name: a few
        samples, one of them a step, would read as any pace at all."""
        assert self.climb_start is not None
        slope = None
        if now - self.climb_start >= self.settings.climb_soonest:
            slope = robust_slope(samples.since(self.climb_start), self.climb_start, now, slot="climb")
        floor = slope_of(self._floor_points(whole))
        candidates = [x for x in (slope, floor) if x is not None]
        return max(candidates) if candidates else None

    def _classify(
        self,
        samples: History,
        short: History,
        whole: list[tuple[float, float, float]],
        level: float,
        climb_seconds: float,
        now: float,
    ) -> str:
        s = self.settings
        # No median of the last `saturated_seconds` reaches the mark when no value of the window does (the largest is
        # kept, sorted): most series are spared the sort.
        values = self._sorted if self.incremental else sorted(samples.window())
        if values[-1] >= s.saturated_ratio and (
            median_of_sorted(sorted(samples.since(now - s.saturated_seconds).window())) >= s.saturated_ratio
        ):
            return "saturated"
        if level >= s.spike_level_ratio and level - min(short.window()) >= s.spike_rise_ratio:
            return "spike"
        climbing = self._is_climbing(samples, whole, level, climb_seconds, now)
        if climbing and not self.latched:
            self.latched_slope = self._called_slope
        self.latched = climbing
        if climbing or self.creep.called:
            return "climbing"
        p5, p95 = values[int(0.05 * (len(values) - 1))], values[int(0.95 * (len(values) - 1))]
        return "sawtooth" if p95 - p5 >= self.sawtooth_span else "steady"

    def _is_climbing(
        self, samples: History, whole: list[tuple[float, float, float]], level: float, climb_seconds: float, now: float
    ) -> bool:
        s = self.settings
        if self.latched:
            # Over the time the climb, at the pace it was called at, takes to rise by half the minimum rise:
            # a slow leak is judged over many minutes, a warm-up ramp that has levelled off lets go soon.
            hold = s.climb_min_rise_ratio / 2 / self.latched_slope if self.latched_slope > 0 else s.climb_min_seconds
            # At least the soonest climb and a dozen samples: a staircase's floor shows its steps over that long.
            hold = min(max(hold, s.climb_soonest, 12 * s.interval_seconds), s.long_window_seconds / 2)
            start = max(now - hold, samples.first)
            slope = robust_slope(samples.since(start), start, now, floor=True, slot="latched")
            return slope is not None and slope >= s.climb_min_slope_ratio_per_minute / 60 / 2
        # A climb that has not fallen back for a while, and whose latter half still rises, steadily,
        # at a leak's pace: a restart's loading ramp, a burst (a step up, then flat) and noise all fail.
        soonest = s.climb_soonest if self.from_serving else s.climb_min_seconds
        if climb_seconds >= soonest and level - self.climb_floor >= s.climb_min_rise_ratio:
            start = max(now - climb_seconds / 2, samples.first)
            points = bucket_points(samples.since(start), start, now, slot="half")
            slope = self._rising_slope(points, start, now, s.climb_min_rise_ratio / 2)
            if slope is not None and climb_seconds >= self._climb_needs(level, slope):
                # Called sooner than climb_min_seconds, it must still rise at the end: a warm-up step that has
                # just levelled off rises over the half as a whole, not over its latter half.
                recent = theil_sen(points[len(points) // 2 :])
                if climb_seconds >= s.climb_min_seconds or (recent is not None and recent >= slope / 2):
                    self._called_slope = slope
                    return True
        # A sawtooth whose troughs rise: a leak under cache churn. Needs most of the long window.
        start = samples.first
        if now - start < 0.8 * s.long_window_seconds:
            return False
        slope = self._rising_slope(self._floor_points(whole), start, now, s.climb_min_rise_ratio)
        self._called_slope = slope or 0.0
        return slope is not None

    def _climb_needs(self, level: float, slope: float) -> float:
        """How long a climb at `slope` (share of capacity per second) must have lasted to be called one."""
        s = self.settings
        if not self.from_serving:
            return s.climb_min_seconds
        to_full = (1.0 - level) / slope
        return max(s.climb_soonest, min(s.climb_min_seconds, s.climb_share_of_time_to_full * to_full))

    def _rising_slope(
        self, points: list[tuple[float, float]], start: float, end: float, min_rise: float
    ) -> float | None:
        """The points' Theil-Sen slope where they rise steadily, at a leak's pace, by `min_rise`; else None."""
        if len(points) < 6:
            return None
        needed = max(self.settings.climb_min_slope_ratio_per_minute / 60, min_rise / (end - start))
        values = [v for _, v in points]
        # No pairwise slope can exceed the points' range over the closest pair's distance (a bucket's
        # width, (end - start) / 12): below half the pace needed (a margin for rounding), the median of
        # the slopes cannot reach it either. Most series are not rising: this spares their Theil-Sen.
        if needed > 0 and (max(values) - min(values)) * 2 < needed * (end - start) / 12:
            return None
        # Where the last point is no higher than the first, the spread is 0 and fails: no Theil-Sen needed.
        if values[-1] <= values[0]:
            return None
        slope = theil_sen(points) or 0.0
        steady = (
            slope >= self.settings.climb_min_slope_ratio_per_minute / 60
            and slope * (end - start) >= min_rise
            and consistency(points) >= CONSISTENT
            and spread(points) >= SPREAD
        )
        return slope if steady else None
