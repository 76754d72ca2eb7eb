"""The trend tracker's memory a series as its window fills: what each cluster-mode target (one series) holds
after 30 seconds, 5, 15 and 30 minutes of uptime (as shipped: a sample every 2 s, a 30-minute window).

The real TrendTracker (trend/sampler.py) with the shipped TrendSettings is fed `--series` series, a sample each
every interval on a virtual clock (values a small random walk around 90 % used), until its long window is full;
tracemalloc (4 frames) measures the memory traced since the empty tracker, a series, at each mark, and at the end the
allocating lines that hold it.
Run: python bench/bench_trend_memory.py [--series 200]
"""

from __future__ import annotations

import argparse
import gc
import random
import tracemalloc

from _common import machine

MARKS_MINUTES = (0.5, 5.0, 15.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", type=int, default=200)
    args = parser.parse_args()
    tracemalloc.start(4)
    from oomguard.exporter.model import Observation, TrendKey, TrendSettings
    from oomguard.exporter.trend.sampler import TrendTracker

    settings = TrendSettings()
    tracker = TrendTracker(settings)
    n = args.series
    keys = [TrendKey("target", f"llm/vllm-{i:04d}", "gpu") for i in range(n)]
    rng = random.Random(1)
    values = [0.9] * n
    gc.collect()
    empty = tracemalloc.take_snapshot()
    full = int(settings.long_window_seconds / settings.interval_seconds) + 20
    marks = {round(m * 60 / settings.interval_seconds) for m in MARKS_MINUTES} | {full}
    t = 1_000_000.0
    held: dict[int, float] = {}
    top: list[tuple[str, float]] = []
    for tick in range(1, full + 1):
        for i in range(n):
            values[i] = min(0.99, max(0.5, values[i] + rng.gauss(0, 0.002)))
        tracker.record(t, {key: Observation(values[i] * 80e9, 80e9) for i, key in enumerate(keys)})
        t += settings.interval_seconds
        if tick in marks:
            gc.collect()
            diff = tracemalloc.take_snapshot().compare_to(empty, "lineno")
            held[tick] = sum(d.size_diff for d in diff) / n / 1024
            if tick == full:
                top = [
                    (
                        f"{d.traceback[0].filename.split('/oomguard/')[-1]}:{d.traceback[0].lineno}",
                        d.size_diff / n / 1024,
                    )
                    for d in sorted(diff, key=lambda d: -d.size_diff)[:12]
                ]
    print(f"## The trend tracker's memory a series, {n} series, the shipped settings ({machine()})\n")
    print("| samples taken | uptime | KiB a series (traced) |\n|---:|---:|---:|")
    for tick, kib in held.items():
        print(f"| {tick} | {tick * settings.interval_seconds / 60:.1f} min | {kib:.1f} |")
    print("\nThe window full, by allocating line:\n\n| line | KiB a series |\n|---|---:|")
    for where, kib in top:
        print(f"| `{where}` | {kib:.2f} |")


if __name__ == "__main__":
    main()
