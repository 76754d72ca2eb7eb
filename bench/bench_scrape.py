"""Scrape latency: one GET /metrics of the exporter (8 fake GPUs, 16 targets) vs the slowest target alone.

Goals: a scrape within 3 ms (median) of the slowest target alone, its p99 within 10 ms
of the slowest's p99, and at most 8 ms of exporter CPU a scrape. The exporter runs twice:
with the default `local_process: auto` (loopback targets count as local, so their processes
are looked up on every scrape) and with `local_process: no` (as for targets on other hosts).
The slowest target is served by a process of its own, the other 15 by another (`--one-targets-process`: all by
one, which measures the targets' process as well; docs/performance.md says why).
Run: python bench/bench_scrape.py [--scrapes 300] [--slowest-ms 20] [--modes auto no] [--one-targets-process]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass

import aiohttp
import psutil
from _common import (
    N_GPUS,
    N_TARGETS,
    cpu_mark,
    default_delays,
    machine,
    median,
    other_load,
    percentile,
    start_exporter,
    start_targets,
)

GOAL_MS = 3.0  # the medians' gap
GOAL_P99_MS = 10.0  # the p99s' gap
GOAL_CPU_MS = 8.0  # exporter CPU a scrape
WARMUP = 20  # first scrapes open connections, start NVML and scan for processes


@dataclass
class Run:
    scrapes: list[float]  # ms per exporter GET /metrics
    alone: list[float]  # ms per slowest-target /metrics + /health, taken in turn with the scrapes
    cpu_ms: float  # exporter CPU (all threads) per scrape
    other: float  # % of the CPUs used by other processes meanwhile
    body: bytes  # the exporter's last answer


async def timed(work: asyncio.Future[object] | asyncio.Task[object]) -> float:
    started = time.perf_counter()
    await work
    return (time.perf_counter() - started) * 1000


async def measure(exporter_port: int, slow_port: int, n: int) -> tuple[list[float], list[float]]:
    """Exporter scrape and slowest-target fetch take turns, so both see the same load on a shared machine."""
    async with aiohttp.ClientSession() as session:

        async def get(url: str) -> bytes:
            async with session.get(url) as response:
                assert response.status == 200, (url, response.status)
                return await response.read()

        exporter = f"http://127.0.0.1:{exporter_port}/metrics"
        target = f"http://127.0.0.1:{slow_port}"
        scrapes, alone = [], []
        for i in range(WARMUP + n):
            scrape = await timed(asyncio.ensure_future(get(exporter)))
            # /metrics and /health at once, as the exporter reads a target.
            single = await timed(asyncio.gather(get(target + "/metrics"), get(target + "/health")))
            if i >= WARMUP:
                scrapes.append(scrape)
                alone.append(single)
    return scrapes, alone


async def last_answer(port: int) -> bytes:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
        return await response.read()


def run_mode(ports: list[int], mode: str, n: int) -> Run:
    # A fresh exporter per mode, so one mode's caches and threads do not serve the other.
    mark = cpu_mark()
    exporter, port = start_exporter(ports, mode)
    try:
        proc = psutil.Process(exporter.pid)
        cpu_before = sum(proc.cpu_times()[:2])
        scrapes, alone = asyncio.run(measure(port, ports[0], n))
        cpu = sum(proc.cpu_times()[:2]) - cpu_before
        other = other_load(mark)
        body = asyncio.run(last_answer(port))
    finally:
        exporter.terminate()
        exporter.join()
    return Run(scrapes, alone, cpu / (n + WARMUP) * 1000, other, body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--slowest-ms", type=float, default=20.0, help="delay of the slowest target's /metrics")
    parser.add_argument("--modes", nargs="+", choices=["auto", "no"], default=["auto", "no"], help="local_process")
    parser.add_argument(
        "--one-targets-process", action="store_true",
        help="serve the slowest target from the same process as the other 15 (this benchmark's layout before "
        "2026-12-05): its timer then wakes late after that process served the others, which the baseline never sees",
    )  # fmt: skip
    args = parser.parse_args()
    where = machine()

    delays = default_delays(args.slowest_ms)
    if args.one_targets_process:
        processes = [start_targets(delays)]
        ports = processes[0][1]
    else:  # the slowest in a process of its own, as an engine is: the others' answers do not delay its timer
        processes = [start_targets(delays[:1]), start_targets(delays[1:])]
        ports = [port for _, process_ports in processes for port in process_ports]
    try:
        runs = {mode: run_mode(ports, mode, args.scrapes) for mode in args.modes}
    finally:
        for process, _ in processes:
            process.terminate()

    print(
        f"## Scrape latency: {N_GPUS} GPUs x {N_TARGETS} targets, slowest {args.slowest_ms:g} ms, "
        f"others 0-5 ms, {args.scrapes} sequential scrapes, the slowest served "
        f"{'with the others' if args.one_targets_process else 'by a process of its own'} ({where})\n"
    )
    print(
        "| local_process | exporter median ms | exporter p99 ms | slowest alone median ms | slowest alone p99 ms "
        f"| exporter - slowest, medians (goal <= {GOAL_MS:g} ms) | p99s (goal <= {GOAL_P99_MS:g} ms) "
        f"| exporter CPU ms/scrape (goal <= {GOAL_CPU_MS:g}) | other load % |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode, run in runs.items():
        gap = median(run.scrapes) - median(run.alone)
        gap99 = percentile(run.scrapes, 99) - percentile(run.alone, 99)
        print(
            f"| {mode} | {median(run.scrapes):.2f} | {percentile(run.scrapes, 99):.2f} | {median(run.alone):.2f} "
            f"| {percentile(run.alone, 99):.2f} | **{gap:+.2f}** ({_met(gap <= GOAL_MS)}) "
            f"| {gap99:+.2f} ({_met(gap99 <= GOAL_P99_MS)}) | **{run.cpu_ms:.1f}** ({_met(run.cpu_ms <= GOAL_CPU_MS)}) "
            f"| {run.other:.0f} |"
        )
    body = next(iter(runs.values())).body
    samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    print(f"\nexporter answer: {samples} samples, {len(body) / 1000:.1f} kB.")
    print("exporter CPU: all its threads, background work (trend sampler) included, divided by the scrapes.")
    print("other load: share of the CPUs used by processes outside this benchmark during the run (approximate).")


def _met(ok: bool) -> str:
    return "met" if ok else "not met"


if __name__ == "__main__":
    main()
