"""Shared setup for the benchmarks: fake engine targets, the real exporter, timing helpers.

Each piece runs in its own process (multiprocessing, spawn): on a 2-core machine
the targets' serving cost and the client's reading cost must not be charged to
the exporter, and its RSS must be its own.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import platform
import statistics
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
from aiohttp import web

if TYPE_CHECKING:
    from oomguard.exporter.config import Config
    from oomguard.simulate.fake_nvml import FakeNvml

# Resolved from this file, so the benchmarks run from any working directory.
# The real vLLM 0.32 body under load, as copied into the test fixtures.
FIXTURE = Path(__file__).resolve().parents[1] / "tests/fixtures/vllm/vllm-0.32.0-cpu-under-load.txt"
N_GPUS = 8
N_TARGETS = 16
_ctx = mp.get_context("spawn")  # no event loop or thread state copied into children


def default_delays(slowest_ms: float = 20.0) -> list[float]:
    """Per-target /metrics delay in ms: target 0 is the slowest, the rest 0-5 ms."""
    return [slowest_ms] + [float(i % 6) for i in range(1, N_TARGETS)]


# -- the targets: one process, 16 aiohttp servers ----------------------------------------------
def _serve_targets(delays_ms: list[float], conn: Connection) -> None:
    body = FIXTURE.read_bytes()
    served = [0]  # /metrics requests served by all the targets: GET /requests on any of them

    def metrics_handler(delay: float) -> web.RequestHandler:
        async def handler(_: web.Request) -> web.Response:
            served[0] += 1
            if delay:
                await asyncio.sleep(delay / 1000)
            return web.Response(body=body, content_type="text/plain", charset="utf-8")

        return handler

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def requests(_: web.Request) -> web.Response:
        return web.Response(text=str(served[0]))

    async def main() -> None:
        ports = []
        for delay in delays_ms:
            app = web.Application()
            app.router.add_get("/metrics", metrics_handler(delay))
            app.router.add_get("/health", health)
            app.router.add_get("/requests", requests)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)  # port 0: the kernel picks a free one
            await site.start()
            ports.append(runner.addresses[0][1])
        conn.send(ports)
        await asyncio.Event().wait()

    asyncio.run(main())


def _started(proc: BaseProcess, conn: Connection) -> object:
    """What the child sends once it serves; an error, not a hang, when it dies first."""
    while not conn.poll(0.1):
        if not proc.is_alive():
            raise RuntimeError(f"{proc.name} exited with code {proc.exitcode} before serving (its traceback is above)")
    return conn.recv()


def start_targets(delays_ms: list[float]) -> tuple[BaseProcess, list[int]]:
    parent, child = _ctx.Pipe()
    proc = _ctx.Process(target=_serve_targets, args=(delays_ms, child), daemon=True)
    proc.start()
    return proc, _started(proc, parent)  # type: ignore[return-value]


# -- the exporter: the real app, fake NVML, in its own process ---------------------------------
def exporter_setup(ports: list[int], local_process: str) -> tuple[Config, FakeNvml]:
    """The benchmarks' exporter: its Config (a target per port, one GPU each in turn) and the fake NVML of
    N_GPUS GPUs with two engine processes each, so the per-process series are rendered too."""
    from oomguard.exporter.config import Config, TargetConfig
    from oomguard.simulate.fake_nvml import GIB, FakeGpu, FakeNvml, FakeProcess

    config = Config(
        targets=tuple(
            TargetConfig(
                url=f"http://127.0.0.1:{port}", name=f"t{i:02d}", gpus=(i % N_GPUS,), local_process=local_process
            )
            for i, port in enumerate(ports)
        )
    )
    gpus = [
        FakeGpu(
            i,
            used_bytes=60 * GIB,
            utilization_percent=70,
            processes=[FakeProcess(900_000 + 2 * i + k, 30 * GIB) for k in range(2)],
        )
        for i in range(N_GPUS)
    ]
    return config, FakeNvml(gpus)


def _serve_exporter(ports: list[int], local_process: str, conn: Connection) -> None:
    from oomguard.exporter.runtime import Runtime
    from oomguard.exporter.web import make_app

    config, nvml = exporter_setup(ports, local_process)
    asyncio.run(serve(make_app(Runtime(config, nvml_lib=nvml)), conn))


async def serve(app: web.Application, conn: Connection) -> None:
    """Serve `app` on a free port of 127.0.0.1, send the port through `conn`, serve until killed."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    conn.send(runner.addresses[0][1])
    await asyncio.Event().wait()


def start_exporter(ports: list[int], local_process: str = "auto") -> tuple[BaseProcess, int]:
    parent, child = _ctx.Pipe()
    proc = _ctx.Process(target=_serve_exporter, args=(ports, local_process, child), daemon=True)
    proc.start()
    return proc, _started(proc, parent)  # type: ignore[return-value]


# -- reporting -------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0-100)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def median(values: list[float]) -> float:
    return statistics.median(values)


def machine() -> str:
    # The load average says whether something else was competing for the 2 cores during the run.
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{len(os.sched_getaffinity(0))} CPUs, Python {platform.python_version()}, load average {load}"


# -- other load: this machine is shared, so say how busy it was with work not ours -------------
def _busy_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def cpu_mark() -> tuple[float, float, float]:
    """(wall clock, whole machine's busy CPU seconds, this benchmark's CPU seconds) now."""
    t = psutil.cpu_times()
    me = psutil.Process()
    return time.perf_counter(), t.user + t.nice + t.system + t.irq + t.softirq, _busy_seconds([me, *me.children()])


def other_load(mark: tuple[float, float, float]) -> float:
    """Percent of all CPUs used since `mark` by processes not of this benchmark; call before stopping children."""
    wall, system, ours = (now - then for now, then in zip(cpu_mark(), mark, strict=True))
    return max(0.0, (system - ours) / (wall * len(os.sched_getaffinity(0))) * 100)
