"""The trend tracker at full history (30 min of samples): its memory, and the time of one sample's analysis.

bench_memory runs ~3 minutes, so the trend history (a ring of long_window_seconds / interval_seconds samples per
series) is far from full there; this fills it directly. `TrendTracker.record` runs on the event loop (Sampler.run),
so its time is how long a scrape landing at that moment waits. Goals it bears on: RSS under 80 MB and flat; a scrape
within 5 ms of the slowest target.
Run: python bench/bench_trend.py
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc

from _common import N_GPUS, N_TARGETS, cpu_mark, machine, other_load

from oomguard.config import Config
from oomguard.model import Observation, TrendKey
from oomguard.trend.sampler import TrendTracker

GIB = 1024**3
GOAL_MS = 5.0


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


def fill(with_host: bool) -> tuple[float, list[float], list[float]]:
    """Fill every ring, then time 100 more ticks; (traced MB when full, wall ms and CPU ms per record over those
    ticks). The CPU time is the thread's own (time.thread_time): how long the tick holds the GIL, less what other
    processes on a shared machine add to the wall time."""
    settings = Config().trend.settings()  # the defaults: 2 s interval, 30 min history
    series = keys(with_host)
    full = int(settings.long_window_seconds / settings.interval_seconds) + 20  # a little past the ring's size
    rng = random.Random(7)
    tracemalloc.start()
    tracker = TrendTracker(settings)
    for tick in range(full):
        tracker.record(tick * settings.interval_seconds, observe(series, rng))
    traced = tracemalloc.get_traced_memory()[0] / 1024**2
    tracemalloc.stop()  # it slows allocation: time the last ticks without it
    times, cpu = [], []
    for tick in range(full, full + 100):
        observations = observe(series, rng)
        started, started_cpu = time.perf_counter(), time.thread_time()
        tracker.record(tick * settings.interval_seconds, observations)
        cpu.append((time.thread_time() - started_cpu) * 1000)
        times.append((time.perf_counter() - started) * 1000)
    return traced, times, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
    where = machine()
    mark = cpu_mark()
    rows = []
    for with_host, label in ((False, "24 (remote targets)"), (True, "40 (local targets: + host RSS)")):
        traced, times, cpu = fill(with_host)
        verdict = "within" if max(times) <= GOAL_MS else "over"
        rows.append(
            f"| {label} | {traced:.1f} | {statistics.median(times):.2f} | {statistics.median(cpu):.2f} "
            f"| {max(times):.1f} ({verdict}) |"
        )
    print(f"## Trend tracker at full history ({where}; other processes used {other_load(mark):.0f} % of the CPUs)\n")
    print(
        "| series | tracker memory MB | record() median ms | record() CPU median ms "
        f"| record() max ms (vs the {GOAL_MS:g} ms scrape budget) |"
    )
    print("|---|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
