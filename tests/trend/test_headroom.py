"""The trend in what is left (docs/trend.md, "What a trend judges" and "A slow climb in what is left").

On a GPU whose engine reserves its memory, the trend follows the use beyond the reservation against the headroom it
leaves (basis "headroom"): a leak of tens of MiB an hour into the 8 GiB a 0.90 reservation leaves on an 80 GB GPU is a
climb with an honest time to full, judged over hours on the floor of each period (trend/analysis.py, `Creep`). What
is noise (a transient allocation, a workspace that comes and goes) is judged at the scale of the total, as its bytes
do not shrink with the headroom. An engine's load, a step, an allocator's warm-up and a wake from sleep are no climb.
"""

from __future__ import annotations

import math
import random

import pytest

from oomguard.exporter.join import GpuClaim
from oomguard.exporter.model import (
    GpuProcess,
    GpuReading,
    GpuReadings,
    Observation,
    ProcessTree,
    TrendKey,
    TrendSettings,
)
from oomguard.exporter.trend.analysis import Series
from oomguard.exporter.trend.sampler import TrendTracker, observations

MIB = 2**20
TOTAL = 81_559 * MIB  # an H100 80GB as NVML reports it
HEADROOM = 0.1 * TOTAL  # what a 0.90 reservation leaves
SCALE = TOTAL / HEADROOM
START = 300 * MIB  # the context and workspaces beyond the reservation, from the start


def _transients(rng: random.Random, t: float, held: list[tuple[float, float]], interval: float) -> float:
    """Allocations that come and go above the floor: a dozen an hour, 2 to 160 MiB, for 20 s to 2.5 minutes."""
    held[:] = [(until, size) for until, size in held if until > t]
    if rng.random() < 12 * interval / 3600:
        held.append((t + rng.uniform(20, 150), min(160 * MIB, max(2 * MIB, rng.lognormvariate(2.77, 0.9) * MIB))))
    return sum(size for _, size in held)


def _leak(rate_mib_per_hour: float, seed: int, hours: float = 4.0, interval: float = 2.0):
    """(t, trend, true seconds to full) every 10 s of a leak of 2 MiB steps at `rate` into the headroom, with
    transients above it, sampled every `interval` as the exporter samples."""
    rng = random.Random(seed)
    series = Series(TrendSettings(interval_seconds=interval), from_serving=True, noise_scale=SCALE)
    every = 2 * 3600 / rate_mib_per_hour
    held: list[tuple[float, float]] = []
    for i in range(int(hours * 3600 / interval)):
        t = i * interval
        leaked = 2 * MIB * int(t / every)
        series.add(t, (START + leaked + _transients(rng, t, held, interval)) / HEADROOM)
        if i % 5 == 0:
            truth = (HEADROOM - START - 2 * MIB * t / every) / (rate_mib_per_hour * MIB / 3600)
            yield t, series.trend(), truth


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_leak_of_50_mib_an_hour_into_8_gib_is_a_climb_with_an_honest_time_to_full(seed: int) -> None:
    called = None
    for t, trend, truth in _leak(50, seed):
        assert trend is not None
        if trend.state == "climbing":
            called = called if called is not None else t
            assert trend.seconds_to_full is not None
            # Within 20 % of the truth from the first call on (measured: 12 % at worst, docs/trend.md).
            assert abs(trend.seconds_to_full / truth - 1) <= 0.2, (t, trend.seconds_to_full / 3600, truth / 3600)
        elif called is not None:
            pytest.fail(f"called a climb at {called / 60:.0f} min, let go at {t / 60:.0f} min while it still leaks")
    assert called is not None and called <= 75 * 60, called


@pytest.mark.parametrize("rate", [100, 500, 900])
def test_faster_leaks_are_called_sooner_and_as_honestly(rate: float) -> None:
    called = None
    for t, trend, truth in _leak(rate, 1, hours=3.0):
        if trend is not None and trend.state == "climbing" and trend.seconds_to_full is not None:
            called = called if called is not None else t
            if t >= called + 1800:
                assert abs(trend.seconds_to_full / truth - 1) <= 0.2, (rate, t / 60, trend.seconds_to_full / truth)
    assert called is not None and called <= 50 * 60, (rate, called)


def test_a_leak_that_would_take_weeks_is_no_climb() -> None:
    """20 MiB/h into 8 GiB: 16 days to full, beyond creep_horizon_seconds (10 days): no ticket to write."""
    assert {trend.state for _, trend, _ in _leak(20, 1)} <= {"steady", "sawtooth"}


def _shaped(values, interval: float = 2.0) -> set[str]:
    series = Series(TrendSettings(interval_seconds=interval), from_serving=True, noise_scale=SCALE)
    states = set()
    for i, used in enumerate(values):
        series.add(i * interval, used / HEADROOM)
        trend = series.trend()
        if trend is not None:
            states.add(trend.state)
    return states


def test_a_step_up_that_stays_is_no_climb() -> None:
    """A new request shape takes 600 MiB more once (a lazily made workspace), then nothing moves for hours."""
    values = [START] * 900 + [START + 600 * MIB] * 5400
    assert "climbing" not in _shaped(values)


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_an_allocators_warm_up_is_called_a_climb_an_hour_at_most(seed: int) -> None:
    """The first hours after a start: 20 MiB segments reserved at a rate that decays (40 minutes), some 360 MiB in
    all. Its first 45 minutes look like a leak (a decay shows only later): the slow climb may call it, then lets go
    once its second half is slower than its first. What the climb alerts rely on (a climb that fills later than
    `slow_beyond` is ticketed only once called for `slow_for`, 3 hours): never called for 90 minutes in a row, nor
    after its first 2.5 hours."""
    rng = random.Random(seed)
    series = Series(TrendSettings(interval_seconds=2.0), from_serving=True, noise_scale=SCALE)
    used, since, spans = START, None, []
    for i in range(6 * 1800):
        t = i * 2.0
        if rng.random() < 18 / 2400 * 2.0 * math.exp(-t / 2400):
            used += 20 * MIB
        series.add(t, used / HEADROOM)
        climbing = series.trend().state == "climbing"
        if climbing and since is None:
            since = t
        elif not climbing and since is not None:
            spans.append((since, t))
            since = None
    assert since is None, f"still called at the end (since {since / 60:.0f} min)"
    assert all(end - start < 90 * 60 and end < 150 * 60 for start, end in spans), spans


def test_a_workspace_that_comes_and_goes_with_the_batch_is_no_climb_nor_an_end_of_one() -> None:
    """+-330 MiB every 44 s (the simulated incident's workspace: 0.4 % of the GPU, 8 % of the headroom) is noise at
    the total's scale: on a flat series no climb, and under a climb of 6 % of the headroom a minute it does not end
    it (a climb is called within 5 minutes of its start)."""
    flat = [START + 330 * MIB * (1 + math.sin(i * 2.0 / 7.0)) for i in range(3600)]
    assert "climbing" not in _shaped(flat)
    rising = flat[:900] + [
        START + 330 * MIB * (1 + math.sin((900 + i) * 2.0 / 7.0)) + 0.06 * HEADROOM * i * 2.0 / 60 for i in range(600)
    ]
    series = Series(TrendSettings(interval_seconds=2.0), from_serving=True, noise_scale=SCALE)
    called = None
    for i, used in enumerate(rising):
        series.add(i * 2.0, used / HEADROOM)
        trend = series.trend()
        if trend is not None and trend.state == "climbing" and called is None:
            called = i * 2.0 - 1800
    assert called is not None and called <= 300, called


def test_a_flat_hours_long_series_calls_a_climb_from_where_it_leaves_its_floor() -> None:
    """Flat for ten hours (a climb never began, and never fell back), then the incident: 6 % of the headroom a
    minute. The climb begins where it leaves its floor, not ten hours before: called within 5 minutes."""
    values = [START] * 18000 + [START + 0.06 * HEADROOM * i * 2.0 / 60 for i in range(450)]
    series = Series(TrendSettings(interval_seconds=2.0), from_serving=True, noise_scale=SCALE)
    called = None
    for i, used in enumerate(values):
        series.add(i * 2.0, used / HEADROOM)
        if i >= 17900:
            trend = series.trend()
            if trend is not None and trend.state == "climbing" and called is None:
                called = i * 2.0 - 36000
    assert called is not None and called <= 300, called


# -- what the sampler observes -----------------------------------------------------------------------------------
def _gpu(index: int, used: float, engine_bytes: float | None = None) -> GpuReading:
    processes = None if engine_bytes is None else (GpuProcess(100, "vllm", engine_bytes),)
    return GpuReading(index=index, up=True, total_bytes=TOTAL, used_bytes=used, free_bytes=TOTAL - used,
                      processes=processes)  # fmt: skip


def test_a_gpu_whose_engine_reserves_is_observed_in_its_headroom() -> None:
    own = 0.9 * TOTAL + 500 * MIB
    nvml = GpuReadings(up=True, gpus=(_gpu(0, own + 200 * MIB, own), _gpu(1, 30 * TOTAL / 100)))
    claim = GpuClaim(configured=(0,), process=ProcessTree(100, frozenset({100}), 0.0, 0.0))
    seen = observations(nvml, [("llama", claim)], reserving=[("llama", claim, 0.9)])
    headroom = TOTAL - 0.9 * TOTAL
    # Beyond the reservation: its own 500 MiB over it, and 200 MiB of another process's.
    assert seen[TrendKey("gpu", "0", "gpu")] == Observation(700 * MIB, headroom, "headroom", TOTAL)
    assert seen[TrendKey("target", "llama", "gpu")] == Observation(700 * MIB, headroom, "headroom", TOTAL)
    # A GPU no reserving engine runs on: used against its total, as before.
    assert seen[TrendKey("gpu", "1", "gpu")] == Observation(30 * TOTAL / 100, TOTAL)


def test_a_series_judged_on_another_basis_starts_afresh() -> None:
    """Its engine's reservation known from a scrape on: the series on the total basis is replaced by one on the
    headroom's (a level of 0.9 would otherwise read as 0.05 at once: a fall, a restart)."""
    tracker = TrendTracker(TrendSettings())
    key = TrendKey("gpu", "0", "gpu")
    for t in range(0, 200, 2):
        tracker.record(float(t), {key: Observation(0.905 * TOTAL, TOTAL)})
    assert tracker.latest[key].basis == "total"
    before = tracker._series[key]
    tracker.record(200.0, {key: Observation(0.005 * TOTAL, HEADROOM, "headroom", TOTAL)})
    assert tracker._series[key] is not before and len(tracker._series[key]) == 1
    assert tracker.latest[key].basis == "headroom" and tracker.latest[key].capacity_bytes == HEADROOM
