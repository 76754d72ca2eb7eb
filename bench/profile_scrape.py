"""Where a scrape's CPU goes: the exporter of bench_scrape.py (8 fake GPUs, 16 targets) under yappi.

yappi (pip install yappi: a profiler, not a dependency of the exporter) counts CPU time in every thread, the
NVML reads and process lookups that run off the event loop included. The exporter runs in its own process, as
in bench_scrape.py; the client scrapes it, then asks it to write its profile.
Run: python bench/profile_scrape.py [--scrapes 300] [--mode auto|no] [--targets 16] [--top 25]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import io
import os
import signal
import time
from multiprocessing.connection import Connection

import aiohttp
from _common import _ctx, _started, default_delays, exporter_setup, serve, start_targets

WARMUP = 20


def _serve_profiled(ports: list[int], local_process: str, out: str, conn: Connection) -> None:
    import yappi

    from oomguard.exporter.runtime import Runtime
    from oomguard.exporter.web import make_app

    config, nvml = exporter_setup(ports, local_process)

    def dump(*_: object) -> None:
        yappi.stop()
        stats = yappi.get_func_stats()
        stats.save(out, type="pstat")
        os._exit(0)

    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGUSR2, lambda *_: (yappi.clear_stats(), yappi.start()))

    yappi.set_clock_type("cpu")
    asyncio.run(serve(make_app(Runtime(config, nvml_lib=nvml)), conn))


async def scrape(port: int, n: int) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                await response.read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--mode", default="auto", choices=("auto", "no"))
    parser.add_argument("--targets", type=int, default=16)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", default="/tmp/oomguard-scrape.pstat")
    args = parser.parse_args()
    if importlib.util.find_spec("yappi") is None:
        raise SystemExit("bench/profile_scrape.py needs yappi, a profiler that sees every thread: pip install yappi")
    delays = default_delays()
    delays = (delays * (args.targets // len(delays) + 1))[: args.targets]
    targets, ports = start_targets(delays)
    parent, child = _ctx.Pipe()
    proc = _ctx.Process(target=_serve_profiled, args=(ports, args.mode, args.out, child), daemon=True)
    proc.start()
    port: int = _started(proc, parent)  # type: ignore[assignment]
    asyncio.run(scrape(port, WARMUP))
    os.kill(proc.pid, signal.SIGUSR2)  # profile from here: the warm-up (imports, first connections) left out
    time.sleep(0.2)
    started = time.perf_counter()
    asyncio.run(scrape(port, args.scrapes))
    elapsed = time.perf_counter() - started
    os.kill(proc.pid, signal.SIGUSR1)
    proc.join(30)
    targets.terminate()

    import pstats

    text = io.StringIO()
    stats = pstats.Stats(args.out, stream=text)
    total = stats.total_tt  # type: ignore[attr-defined]
    print(f"# {args.scrapes} scrapes, {args.targets} targets, local_process {args.mode}: {elapsed:.1f} s wall, "
          f"exporter CPU {total * 1000 / args.scrapes:.2f} ms a scrape (yappi, all threads)\n")  # fmt: skip
    stats.sort_stats("tottime").print_stats(args.top)
    print(text.getvalue()[-12000:])


if __name__ == "__main__":
    main()
