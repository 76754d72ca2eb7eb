"""The trend tracker at full history (30 min of samples): its memory, and the time of one sample's analysis.

bench_memory runs ~3 minutes, so the trend history (a ring of long_window_seconds / interval_seconds samples per
series) is far from full there; this fills it directly. `TrendTracker.record` runs on the event loop (Sampler.run),
so its time is how long a scrape landing at that moment waits. Goals it bears on: RSS under 80 MB and flat; a scrape
within 5 ms of the slowest target; a trend tick under 2 ms at 40 series (the tick's own CPU time: how long it holds
the GIL, since the analysis is Python from end to end).
Run: python bench/bench_trend.py [--ticks 300] [--jitter-ms 0]
(--jitter-ms 20: each tick's time late by 0-20 ms, as the sampler's clock reads after its observation; the buckets'
edges then fall either side of a sample, and fewer of their statistics are found again from earlier ticks.)
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc

from _common import N_GPUS, N_TARGETS, cpu_mark, machine, other_load, percentile

from oomguard.exporter.config import Config
from oomguard.exporter.model import Observation, TrendKey
from oomguard.exporter.trend.sampler import TrendTracker

GIB = 1024**3
GOAL_MS = 2.0  # the trend tick's goal (its CPU time, at 40 series)
# Ticks run untimed once the history is full: the statistics carried between ticks are found again from the
# ticks of one bucket's width (75 at the defaults) on, as they are in a sampler that has run for a while.
WARM_TICKS = 100


def keys(with_host: bool) -> list[TrendKey]:
    """8 GPUs, 16 targets' GPUs, and with local targets their host RSS too: 24 or 40 series."""
    out = [TrendKey("gpu", str(i), "gpu") for i in range(N_GPUS)]
    for i in range(N_TARGETS):
        out.append(TrendKey("target", f"t{i:02d}", "gpu"))
        if with_host:
            out.append(TrendKey("target", f"t{i:02d}", "host"))
    return out


def observe(series: list[TrendKey], rng: random.Random) -> dict[TrendKey, Observation]:
    # Noisy steady levels: the common case.
    return {k: Observation(60 * GIB * (1 + 0.02 * rng.random()), 80 * GIB) for k in series}


def fill(with_host: bool, ticks: int, jitter_ms: float) -> tuple[float, list[float], list[float]]:
    """Fill every ring (and WARM_TICKS more), then time `ticks` more; (traced MB when full, wall ms and CPU ms per
    record over those ticks). The CPU time is the thread's own (time.thread_time): how long the tick holds the GIL,
    less what other processes on a shared machine add to the wall time."""
    settings = Config().trend.settings()  # the defaults: 2 s interval, 30 min history
    series = keys(with_host)
    full = int(settings.long_window_seconds / settings.interval_seconds) + 20  # a little past the ring's size
    rng = random.Random(7)
    late = random.Random(11)

    def at(tick: int) -> float:
        return tick * settings.interval_seconds + late.uniform(0.0, jitter_ms / 1000)

    tracemalloc.start()
    tracker = TrendTracker(settings)
    for tick in range(full + WARM_TICKS):
        tracker.record(at(tick), observe(series, rng))
    traced = tracemalloc.get_traced_memory()[0] / 1024**2
    tracemalloc.stop()  # it slows allocation: time the last ticks without it
    times, cpu = [], []
    for tick in range(full + WARM_TICKS, full + WARM_TICKS + ticks):
        observations = observe(series, rng)
        t = at(tick)
        started, started_cpu = time.perf_counter(), time.thread_time()
        tracker.record(t, observations)
        cpu.append((time.thread_time() - started_cpu) * 1000)
        times.append((time.perf_counter() - started) * 1000)
    return traced, times, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ticks", type=int, default=300, help="ticks timed once the history is full")
    parser.add_argument("--jitter-ms", type=float, default=0.0, help="each tick's time late by up to this")
    args = parser.parse_args()
    where = machine()
    mark = cpu_mark()
    rows = []
    for with_host, label in ((False, "24 (remote targets)"), (True, "40 (local targets: + host RSS)")):
        traced, times, cpu = fill(with_host, args.ticks, args.jitter_ms)
        verdict = "" if not with_host else " (met)" if statistics.median(cpu) < GOAL_MS else " (not met)"
        rows.append(
            f"| {label} | {traced:.1f} | {statistics.median(times):.2f} | {percentile(times, 99):.2f} "
            f"| **{statistics.median(cpu):.2f}**{verdict} | {percentile(cpu, 99):.2f} | {max(times):.1f} |"
        )
    jitter = f", ticks late by 0-{args.jitter_ms:g} ms" if args.jitter_ms else ""
    print(
        f"## Trend tracker at full history, {args.ticks} ticks timed{jitter} ({where}; other processes used "
        f"{other_load(mark):.0f} % of the CPUs)\n"
    )
    print(
        "| series | tracker memory MB | record() median ms | record() p99 ms "
        f"| GIL held (tick CPU) median ms, goal < {GOAL_MS:g} at 40 | GIL held p99 ms | record() max ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
