"""The engines' HTTP client alone: CPU per target for the two requests a scrape sends (/metrics and /health at once),
oomguard's own client (engine_client.py) against aiohttp's, which it replaced.

100 stand-in targets (one process, the real 50 kB vLLM body) are read in rounds, every target at once, by this
process; its CPU time (time.process_time: user and system) is divided by the targets and rounds. The two clients
take turns, three times each, so both see the same load. `--close`: no connection kept between rounds (each
request on a new connection), as when Prometheus scrapes every 15 s an engine that closes idle connections
after 5 s (uvicorn's and cpp-httplib's keep-alive): what a scrape costs there.
Run: python bench/bench_client.py [--targets 100] [--rounds 30] [--close]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp
from _common import machine, median, start_targets

from oomguard.common import engine_client
from oomguard.common.engine_client import EngineClient

CAP = 8 * 1024 * 1024


async def with_aiohttp(ports: list[int], rounds: int, close: bool) -> float:
    connector = aiohttp.TCPConnector(limit=1024, limit_per_host=4, force_close=close)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def get(url: str) -> bytes:
            async with asyncio.timeout(5), session.get(url, allow_redirects=False) as response:
                return await response.read()

        async def target(port: int) -> None:
            health = asyncio.ensure_future(get(f"http://127.0.0.1:{port}/health"))
            await get(f"http://127.0.0.1:{port}/metrics")
            await health

        return await _timed(ports, rounds, target)


async def with_engine_client(ports: list[int], rounds: int, close: bool) -> float:
    async with EngineClient(limit=1024, idle_per_host=0 if close else engine_client.PER_HOST_IDLE) as client:

        async def target(port: int) -> None:
            health = asyncio.ensure_future(
                engine_client.get(client, f"http://127.0.0.1:{port}/health", timeout=5, cap=4096, truncate=True)
            )
            await engine_client.get(client, f"http://127.0.0.1:{port}/metrics", timeout=5, cap=CAP)
            await health

        return await _timed(ports, rounds, target)


async def _timed(ports: list[int], rounds: int, target) -> float:  # type: ignore[no-untyped-def]
    for _ in range(3):  # connections opened, caches warm
        await asyncio.gather(*(target(port) for port in ports))
    started = time.process_time()
    for _ in range(rounds):
        await asyncio.gather(*(target(port) for port in ports))
    return (time.process_time() - started) / rounds / len(ports) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--close", action="store_true", help="no connection kept: each request on a new one")
    args = parser.parse_args()
    targets, ports = start_targets([0.0] * args.targets)
    results: dict[str, list[float]] = {"aiohttp": [], "engine_client.py": []}
    try:
        for _ in range(3):
            results["aiohttp"].append(asyncio.run(with_aiohttp(ports, args.rounds, args.close)))
            results["engine_client.py"].append(asyncio.run(with_engine_client(ports, args.rounds, args.close)))
    finally:
        targets.terminate()
    kept = "each request on a new connection" if args.close else "connections kept"
    print(f"## The engines' client: /metrics (50 kB) and /health of {args.targets} targets at once, "
          f"{args.rounds} rounds, 3 turns each, {kept} ({machine()})\n")  # fmt: skip
    print("| client | CPU ms per target (median of 3 turns) | turns |")
    print("|---|---:|---|")
    for name, values in results.items():
        print(f"| {name} | {median(values):.3f} | {', '.join(f'{v:.3f}' for v in values)} |")


if __name__ == "__main__":
    main()
