"""The cost of a scrape as the number of configured targets grows: 10, 50, 100, 500 stub targets.

Each size runs its own targets' process (every target an aiohttp server on 127.0.0.1 serving the real
50 kB vLLM body at once) and its own exporter (8 fake GPUs, local_process: no); the client scrapes
sequentially and reports the scrape's wall time (median, p99) and the exporter's CPU time per scrape (all
its threads: the trend sampler's ticks included, whose series grow with the targets too).
Run: python bench/bench_many_targets.py [--sizes 10 50 100 500] [--scrapes 30]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp
import psutil
from _common import N_GPUS, cpu_mark, machine, median, other_load, percentile, start_exporter, start_targets

WARMUP = 5
GOAL_AT, GOAL_MS_PER_TARGET = 500, 0.4  # at 500 targets, 0.4 ms of the exporter's CPU a target: 0.2 s a scrape


async def scrapes(port: int, n: int) -> tuple[list[float], int]:
    async with aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{port}/metrics"
        times = []
        size = 0
        for i in range(WARMUP + n):
            started = time.perf_counter()
            async with session.get(url) as response:
                assert response.status == 200
                size = len(await response.read())
            if i >= WARMUP:
                times.append((time.perf_counter() - started) * 1000)
        return times, size


def run(size: int, n: int) -> tuple[str, float]:
    targets, ports = start_targets([0.0] * size)
    exporter, port = start_exporter(ports, "no")
    try:
        mark = cpu_mark()
        proc = psutil.Process(exporter.pid)
        before = proc.cpu_times()
        times, body = asyncio.run(scrapes(port, n))
        after = proc.cpu_times()
        other = other_load(mark)
    finally:
        exporter.kill()
        targets.kill()
    cpu = (after.user + after.system - before.user - before.system) * 1000 / n
    row = (
        f"| {size} | {median(times):.1f} | {percentile(times, 99):.1f} | {cpu:.1f} | {cpu / size:.2f} "
        f"| {body / 1024:.0f} | {other:.0f} |"
    )
    return row, cpu / size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 50, 100, 500])
    parser.add_argument("--scrapes", type=int, default=30)
    args = parser.parse_args()
    results = {size: run(size, args.scrapes) for size in args.sizes}
    print(f"## Scrape cost by number of targets: {N_GPUS} GPUs, local_process=no, {args.scrapes} sequential scrapes")
    print(f"each ({machine()})\n")
    print(
        "| targets | scrape median ms | scrape p99 ms | exporter CPU ms/scrape | per target | answer kB "
        "| other load % |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(row for row, _ in results.values()))
    if GOAL_AT in results:
        per_target = results[GOAL_AT][1]
        verdict = "met" if per_target <= GOAL_MS_PER_TARGET else "not met"
        print(
            f"\ngoal: at most {GOAL_MS_PER_TARGET:g} ms of exporter CPU per target at {GOAL_AT}: "
            f"{per_target:.2f} ({verdict})"
        )


if __name__ == "__main__":
    main()
