"""Exporter memory over 10,000 scrapes (8 fake GPUs, 16 targets): RSS of the exporter process alone.

Goals: RSS under 80 MB, and flat. Targets answer at once (no delay): the
delays matter for latency, not memory, and 10k scrapes should not take an hour.
Run: python bench/bench_memory.py [--scrapes 10000] [--every 1000] [--local-process no|auto]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp
import psutil
from _common import N_GPUS, N_TARGETS, cpu_mark, machine, other_load, start_exporter, start_targets

GOAL_MB = 80.0
FLAT_MB = 1.0  # growth allowed from the 1st sample after warm-up (1k scrapes) to the last
MB = 1024 * 1024


async def run(port: int, pid: int, scrapes: int, every: int) -> tuple[list[tuple[int, float]], float]:
    """(scrapes done, RSS in MB) samples, and the seconds the scrapes took."""
    exporter = psutil.Process(pid)
    samples = []
    async with aiohttp.ClientSession() as session:
        base = f"http://127.0.0.1:{port}"
        # Sample 0 after the start-up collection, so it is the exporter at rest with data.
        while True:
            async with session.get(base + "/-/ready") as response:
                if response.status == 200:
                    break
            await asyncio.sleep(0.05)
        samples.append((0, exporter.memory_info().rss / MB))
        started = time.perf_counter()
        for done in range(1, scrapes + 1):
            async with session.get(base + "/metrics") as response:
                await response.read()
                assert response.status == 200, response.status
            if done % every == 0:
                samples.append((done, exporter.memory_info().rss / MB))
        elapsed = time.perf_counter() - started
    return samples, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scrapes", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=1_000, help="sample RSS every this many scrapes")
    parser.add_argument(
        "--local-process",
        choices=["no", "auto"],
        default="no",
        help="no (default): ~30 ms a scrape; auto looks up the targets' processes, ~10x slower per scrape",
    )
    args = parser.parse_args()
    where = machine()

    targets, ports = start_targets([0.0] * N_TARGETS)
    mark = cpu_mark()
    exporter, port = start_exporter(ports, args.local_process)
    try:
        samples, elapsed = asyncio.run(run(port, exporter.pid, args.scrapes, args.every))
        other = other_load(mark)
    finally:
        exporter.terminate()
        targets.terminate()

    print(
        f"## Exporter RSS: {N_GPUS} GPUs x {N_TARGETS} targets, local_process={args.local_process}, "
        f"{args.scrapes} sequential scrapes in {elapsed:.0f} s ({elapsed / args.scrapes * 1000:.1f} ms each; {where}; "
        f"other processes used {other:.0f} % of the CPUs meanwhile)\n"
    )
    print("| scrapes | RSS MB |")
    print("|---:|---:|")
    for done, rss in samples:
        print(f"| {done} | {rss:.1f} |")
    peak = max(rss for _, rss in samples)
    # Growth is taken from the first sample after warm-up: the first scrapes fill caches and allocator arenas.
    start_at, start_rss = samples[1] if len(samples) > 2 else samples[0]
    growth = samples[-1][1] - start_rss
    print(f"| **peak** (goal < {GOAL_MB:g} MB) | **{peak:.1f}** ({'met' if peak < GOAL_MB else 'not met'}) |")
    flat = "met" if growth <= FLAT_MB else "not met"
    span = f"{start_at} -> {samples[-1][0]}"
    print(f"| **growth {span}** (goal: flat, <= {FLAT_MB:g} MB) | **{growth:+.1f}** ({flat}) |")


if __name__ == "__main__":
    main()
