"""Scrape latency: one GET /metrics of the exporter (8 fake GPUs, 16 targets) vs the slowest target alone.

Goal (from the issue): a scrape within 5 ms of the slowest target.
Run: python bench/bench_scrape.py [--scrapes 300] [--slowest-ms 20] [--local-process auto|no]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp
from _common import (
    N_GPUS,
    N_TARGETS,
    default_delays,
    machine,
    median,
    percentile,
    start_exporter,
    start_targets,
)

GOAL_MS = 5.0


async def time_scrapes(session: aiohttp.ClientSession, url: str, n: int) -> list[float]:
    """Milliseconds per sequential GET of url, body read in full."""
    out = []
    for _ in range(n):
        started = time.perf_counter()
        async with session.get(url) as response:
            await response.read()
            assert response.status == 200, response.status
        out.append((time.perf_counter() - started) * 1000)
    return out


async def time_target(session: aiohttp.ClientSession, base: str, n: int) -> list[float]:
    """Milliseconds to read one target's /metrics and /health concurrently, as the exporter does."""

    async def get(path: str) -> None:
        async with session.get(base + path) as response:
            await response.read()

    out = []
    for _ in range(n):
        started = time.perf_counter()
        await asyncio.gather(get("/metrics"), get("/health"))
        out.append((time.perf_counter() - started) * 1000)
    return out


async def measure(exporter_port: int, slow_port: int, n: int) -> tuple[list[float], list[float]]:
    async with aiohttp.ClientSession() as session:
        exporter = f"http://127.0.0.1:{exporter_port}/metrics"
        await time_scrapes(session, exporter, 20)  # warm up: connections, NVML init, caches
        scrapes = await time_scrapes(session, exporter, n)
        target = f"http://127.0.0.1:{slow_port}"
        await time_target(session, target, 20)
        alone = await time_target(session, target, n)
    return scrapes, alone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--slowest-ms", type=float, default=20.0, help="delay of the slowest target's /metrics")
    parser.add_argument(
        "--local-process",
        choices=["auto", "no"],
        default="auto",
        help="auto: loopback targets count as local (process lookup on each scrape); no: as remote targets",
    )
    args = parser.parse_args()

    delays = default_delays(args.slowest_ms)
    targets, ports = start_targets(delays)
    exporter, port = start_exporter(ports, args.local_process)
    try:
        scrapes, alone = asyncio.run(measure(port, ports[0], args.scrapes))
    finally:
        exporter.terminate()
        targets.terminate()

    gap = median(scrapes) - median(alone)
    print(
        f"## Scrape latency: {N_GPUS} GPUs x {N_TARGETS} targets, slowest {args.slowest_ms:g} ms, "
        f"others 0-5 ms, local_process={args.local_process}, {args.scrapes} scrapes ({machine()})\n"
    )
    print("| measure | median ms | p99 ms |")
    print("|---|---:|---:|")
    print(f"| exporter GET /metrics | {median(scrapes):.2f} | {percentile(scrapes, 99):.2f} |")
    print(f"| slowest target alone (/metrics + /health) | {median(alone):.2f} | {percentile(alone, 99):.2f} |")
    verdict = "met" if gap <= GOAL_MS else "NOT met"
    print(f"| **difference of medians** (goal <= {GOAL_MS:g} ms) | **{gap:.2f}** ({verdict}) | |")


if __name__ == "__main__":
    main()
