"""Many Prometheis at once: 200 concurrent GET /metrics of the exporter (8 fake GPUs, 16 targets).

Concurrent scrapes share the collection in flight (collection.py): 200 at once must cost one round of
requests to the targets, not 200. This counts the collections (the /metrics requests the targets served
during each burst, divided by the number of targets) and times every scrape of the burst: median, p99
and max, against one scrape alone taken between bursts.
Run: python bench/bench_concurrent_scrapes.py [--concurrency 200] [--bursts 20]
"""

from __future__ import annotations

import argparse
import asyncio
import time

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


async def measure(exporter_port: int, target_port: int, concurrency: int, bursts: int) -> dict[str, object]:
    connector = aiohttp.TCPConnector(limit=0)  # every scrape on its own connection, as 200 Prometheis would
    async with aiohttp.ClientSession(connector=connector) as session:
        url = f"http://127.0.0.1:{exporter_port}/metrics"

        async def scrape() -> float:
            started = time.perf_counter()
            async with session.get(url) as response:
                assert response.status == 200
                await response.read()
            return (time.perf_counter() - started) * 1000

        async def served() -> int:
            async with session.get(f"http://127.0.0.1:{target_port}/requests") as response:
                return int(await response.text())

        for _ in range(10):  # warm-up: connections, NVML, the process scan
            await scrape()
        burst_ms: list[float] = []
        alone_ms: list[float] = []
        collections: list[float] = []
        for _ in range(bursts):
            alone_ms.append(await scrape())
            before = await served()
            burst_ms += await asyncio.gather(*(scrape() for _ in range(concurrency)))
            collections.append((await served() - before) / N_TARGETS)
        return {"burst": burst_ms, "alone": alone_ms, "collections": collections}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--bursts", type=int, default=20)
    args = parser.parse_args()
    targets, ports = start_targets(default_delays())
    exporter, port = start_exporter(ports, "no")
    try:
        mark = cpu_mark()
        cpu_before = psutil.Process(exporter.pid).cpu_times()
        result = asyncio.run(measure(port, ports[0], args.concurrency, args.bursts))
        cpu_after = psutil.Process(exporter.pid).cpu_times()
        other = other_load(mark)
    finally:
        exporter.kill()
        targets.kill()
    burst, alone, collections = result["burst"], result["alone"], result["collections"]
    assert isinstance(burst, list) and isinstance(alone, list) and isinstance(collections, list)
    cpu_ms = (cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system) * 1000
    print(
        f"## {args.bursts} bursts of {args.concurrency} concurrent scrapes: {N_GPUS} GPUs x {N_TARGETS} targets, "
        f"slowest 20 ms, local_process=no ({machine()}; other processes used {other:.0f} % of the CPUs)\n"
    )
    print("| measure | value |")
    print("|---|---:|")
    print(f"| collections per burst (target requests / {N_TARGETS}), max | {max(collections):g} |")
    print(f"| scrape in a burst, median ms | {median(burst):.1f} |")
    print(f"| scrape in a burst, p99 ms | {percentile(burst, 99):.1f} |")
    print(f"| scrape in a burst, max ms | {max(burst):.1f} |")
    print(f"| one scrape alone (between bursts), median ms | {median(alone):.1f} |")
    print(f"| exporter CPU per burst ms | {cpu_ms / args.bursts:.0f} |")


if __name__ == "__main__":
    main()
