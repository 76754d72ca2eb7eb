"""What every simulated engine process does the same way: its scenario clock, its HTTP server and its end.

An engine's simulator (simulate/engines/<name>.py) says what it serves and what it writes; this runs it:
the clock starts with the process (as the exporter measures a startup from the process start, the seconds
spent importing count as loading, like a real engine's), and a life the scenario ends in CUDA OOM writes
its engine's traceback and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from aiohttp import web

from oomguard.common.process_start import start_time
from oomguard.common.time_scale import TimeScale
from oomguard.simulate.engine_args import simulator_parser
from oomguard.simulate.scenarios import SCENARIOS, Scenario

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# How often, in simulated seconds, a serving engine's `while_serving` is called.
TICK_SECONDS = 5.0


class SimulatedEngine:
    """One life of a simulated engine: the scenario, its clock, its listener."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.scenario: Scenario = SCENARIOS[args.scenario]
        self.time_scale = TimeScale(args.time_scale)  # the scenario's clock (--time-scale, refused by argparse if bad)
        self.launched = start_time(os.getpid()) or time.time()
        self._runner: web.AppRunner | None = None

    def now(self) -> float:
        """Simulated seconds since the process started."""
        return self.time_scale.simulated(time.time() - self.launched)

    async def sleep(self, simulated_seconds: float) -> None:
        await asyncio.sleep(self.time_scale.real(max(0.0, simulated_seconds)))

    @staticmethod
    def log(text: str) -> None:
        """A line (or lines, ending in a newline or not) of the engine's log: its stderr, flushed at once."""
        print(text, file=sys.stderr, end="" if text.endswith("\n") else "\n", flush=True)

    async def listen(self, routes: Mapping[str, Handler]) -> None:
        """Serves GET on each path of `routes` at the command line's host and port."""
        app = web.Application()
        for path, handler in routes.items():
            app.router.add_get(path, handler)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.args.host, self.args.port, reuse_address=True).start()

    async def serve_until_death(
        self, death_log: Callable[[], str], while_serving: Callable[[float], None] | None = None
    ) -> int:
        """Serves until the scenario's death of this life, writes `death_log()` and returns the exit code 1;
        serves for ever when this life does not die. `while_serving(t)` runs every TICK_SECONDS simulated."""
        death_at = self.scenario.death_at(self.args.life)
        if death_at is None and while_serving is None:
            await asyncio.Event().wait()
        while death_at is None or self.now() < death_at:
            await self.sleep(TICK_SECONDS if death_at is None else min(TICK_SECONDS, death_at - self.now()))
            if while_serving is not None:
                while_serving(self.now())
        self.log(death_log())
        return 1

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def run_simulator(
    serve: Callable[[SimulatedEngine], Coroutine[Any, Any, int]],
    description: str | None,
    argv: list[str] | None,
    told: tuple[str, str] | None = None,
) -> int:
    """The simulator's `main`: parses the supervisor's command line (engine_args.py; `told`: the engine's reservation
    and tensor-parallel flags, its plugin's `knobs.told_flags`) and serves one life."""

    async def life() -> int:
        engine = SimulatedEngine(simulator_parser(description, told).parse_args(argv))
        try:
            return await serve(engine)
        finally:
            await engine.close()

    return asyncio.run(life())
