"""`oomguard serve --simulate SCENARIO` on a virtual clock: the exporter's exposition at any simulated instant, in
milliseconds rather than the scenario's minutes.

What runs is the exporter's own code, as `Runtime` wires it for a simulation: the target's scraper (/metrics and
/health over HTTP, its state, its restarts, an engine's reservation asked apart), the fake NVML read by the NVML
source, the process lookup, the join, the trend tracker fed by its observer, the event runner reading the engine's
log through its detector, the collection and the exposition. What runs the scenario is its engine's own simulator
(`serve` of simulate/engines/<name>.py: its routes, its figures, its log lines), each life as the simulation's
supervisor (simulate/supervisor.py) launches, kills and relaunches it. Only time is not real:

- one `VirtualClock` stands for every clock: the simulator's scenario time and its sleeps, its log's timestamps,
  the scraper's wall clock (restarts, startups), the event runner's clock, the trend's sample times;
- an engine's life is a coroutine, not a process: its pid is made up (no process on a host has it), and the
  process lookup (`VirtualFinder`) answers from the life's record what /proc would say of the process (the pid, its
  start, listening or not); the settings from its command line are parsed from the command line the supervisor
  would give it, where the settings reader would read it from /proc;
- an engine listens only while its life does (vLLM once loaded, SGLang from its start), on one port: a request
  while none listens is refused, as a real one is.

The clock counts the exporter's seconds from the first launch (`now`); `wall()` is them on a Unix clock that starts
at `base` (hours in the past, so that a Prometheus backfilled with what was read loads it at once). A simulation
`time_scale` times faster than life (`serve --simulate --simulate.time-scale`, `make run`'s 10) has its scenario
run that many simulated seconds per second of it, and the exporter judge on the simulation's clock
(simulate/clock.py), as `Runtime` does.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import importlib
import itertools
import os
import sys
import time
import types
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from aiohttp import web

from oomguard.common.engine_client import EngineClient
from oomguard.common.time_scale import TimeScale
from oomguard.exporter.collection import Collection
from oomguard.exporter.config import Config
from oomguard.exporter.config_loader import load_config
from oomguard.exporter.engines import ENGINES
from oomguard.exporter.events.runner import EventRunner
from oomguard.exporter.exposition import render
from oomguard.exporter.model import ProcessTree, TargetReading
from oomguard.exporter.sources.local.cmdline import is_engine
from oomguard.exporter.sources.nvml import NvmlSource
from oomguard.exporter.sources.nvml_reader import NvmlReader
from oomguard.exporter.sources.process_lookup import ProcessLookup
from oomguard.exporter.sources.source_runs import SourceRuns
from oomguard.exporter.sources.target_set import TargetSet
from oomguard.exporter.sources.targets import TargetScraper
from oomguard.exporter.trend.observe import TrendObserver
from oomguard.exporter.trend.sampler import TrendTracker
from oomguard.simulate.clock import events_on_clock, trend_on_clock
from oomguard.simulate.engine_args import simulator_parser
from oomguard.simulate.scenarios import SCENARIOS
from oomguard.simulate.serve import SimulatedEngine
from oomguard.simulate.supervisor import Simulation, simulation

# Made-up pids of the engine's lives: above any pid_max (2^22), so no process on this host is taken for one.
FIRST_PID = 4_194_304 + 1000


class VirtualClock:
    """The exporter's seconds since the first launch (a simulation `time_scale` times faster runs its scenario that
    many times as many); coroutines sleep on it, and `advance` wakes them in order, each at its own time."""

    def __init__(self, base: float) -> None:
        self.base = base
        self.now = 0.0
        self._waiting: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def wall(self) -> float:
        return self.base + self.now

    async def sleep_until(self, at: float) -> None:
        if at <= self.now:
            await asyncio.sleep(0)
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (at, next(self._order), future))
        await future

    async def advance(self, to: float) -> None:
        """Wakes, in order, every coroutine asleep until `to` or before, each at its own time."""
        while self._waiting and self._waiting[0][0] <= to:
            at, _, future = heapq.heappop(self._waiting)
            self.now = max(self.now, at)
            if not future.done():
                future.set_result(None)
            await _settle()
        self.now = max(self.now, to)
        await _settle()


async def _settle() -> None:
    # A woken life runs to its next sleep on the clock: its own code awaits nothing else (its log is written at once,
    # its routes taken by `listen`), so a few turns of the loop are enough.
    for _ in range(5):
        await asyncio.sleep(0)


class VirtualEngine(SimulatedEngine):
    """One life of the engine's simulator, its clock the virtual one, its log a file, its listener `Listener`'s."""

    def __init__(self, args: argparse.Namespace, clock: VirtualClock, log: Path) -> None:
        self.args = args
        self.scale = float(args.time_scale)
        self.scenario = SCENARIOS[args.scenario]
        self.clock = clock
        self.launched_at = clock.now
        self.launched = clock.wall()
        self.log_path = log
        self.routes: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]] | None = None
        self._runner = None

    def now(self) -> float:
        """Simulated seconds since its launch."""
        return (self.clock.now - self.launched_at) * self.scale

    async def sleep(self, simulated_seconds: float) -> None:
        await self.clock.sleep_until(self.clock.now + max(0.0, simulated_seconds) / self.scale)

    def log(self, text: str) -> None:
        with self.log_path.open("a") as f:
            f.write(text if text.endswith("\n") else text + "\n")

    async def listen(self, routes) -> None:  # type: ignore[no-untyped-def]
        self.routes = dict(routes)

    async def close(self) -> None:
        self.routes = None


@dataclass
class Life:
    number: int  # the simulation's life number: 0 the first
    pid: int
    engine: VirtualEngine
    cmdline: tuple[str, ...]
    alive: bool = True

    def tree(self) -> ProcessTree:
        return ProcessTree(self.pid, frozenset({self.pid}), 1e9, self.engine.launched, self.cmdline)


class Listener:
    """The engine's port: one HTTP server that answers with the routes of the life listening, and is closed while
    none listens (a request is refused then, as a real closed port refuses it)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.routes: dict | None = None
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        handler = (self.routes or {}).get(request.path)
        if handler is None:
            return web.Response(status=404)
        return await handler(request)

    async def serve(self, routes: dict | None) -> None:
        self.routes = routes
        if routes is not None and self._runner is None:
            app = web.Application()
            app.router.add_route("GET", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()
        elif routes is None and self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()


class VirtualFinder:
    """The process lookup's finder, answering from the lives: the process listening on the port (vLLM once loaded,
    SGLang from its start), and whether a new life with the last listener's command line runs (`restarted`)."""

    def __init__(self, run: VirtualRun) -> None:
        self.run = run
        self.last_listener: int | None = None

    def find_all(self, ports) -> dict[int, ProcessTree | None]:  # type: ignore[no-untyped-def]
        life = self.run.life
        listening = life is not None and life.alive and life.engine.routes is not None
        if listening:
            self.last_listener = life.pid  # type: ignore[union-attr]
        return {port: life.tree() if listening else None for port in ports}  # type: ignore[union-attr]

    def restarted(self, port: int) -> bool:
        life = self.run.life
        return life is not None and life.alive and self.last_listener is not None and life.pid != self.last_listener


class VirtualSettings:
    """The settings reader's part: a loading target whose process does not listen is given the process whose command
    line names its port, and every target its engine's settings from its life's command line."""

    def __init__(self, run: VirtualRun) -> None:
        self.run = run

    async def add(self, targets: tuple[TargetReading, ...]) -> tuple[TargetReading, ...]:
        life = self.run.life
        if life is None or not life.alive:
            return targets
        plugin = ENGINES[self.run.engine]
        settings = plugin.settings(life.cmdline, None, {}) if plugin.settings is not None else {}
        if not is_engine(self.run.engine, life.cmdline, simulators=True):
            settings = {}
        out = []
        for t in targets:
            if t.process is None and t.state == "loading":
                t = replace(t, process=life.tree())
            out.append(replace(t, settings=settings) if settings else t)
        return tuple(out)


def _patched_time(clock: VirtualClock) -> types.SimpleNamespace:
    """The `time` the simulators and the scraper see: the virtual wall clock, its local time for log stamps."""
    return types.SimpleNamespace(
        time=clock.wall,
        perf_counter=time.perf_counter,
        monotonic=clock.wall,  # the process lookup's reuse of a recent lookup: on the clock its lives change on
        strftime=lambda fmt, t=None: time.strftime(fmt, time.localtime(clock.wall() if t is None else t)),
        localtime=lambda t=None: time.localtime(clock.wall() if t is None else t),
        gmtime=time.gmtime,
    )


class VirtualRun:
    """One scenario on one engine, from its first launch: `step(to)` moves it on; `exposition()` reads it."""

    def __init__(self, scenario: str, engine: str, workdir: Path, base: float, time_scale: float = 1.0) -> None:
        self.engine = engine
        self.time_scale = time_scale
        self.scale = TimeScale(time_scale)  # what the exporter judges runs on it, as Runtime's clock
        self.clock = VirtualClock(base)
        self.log_path = workdir / f"{scenario}-{engine}-x{time_scale:g}.log"
        self.log_path.write_text("")
        self.sim: Simulation = simulation(scenario, engine=engine, time_scale=time_scale, log_path=self.log_path)
        self.scenario = self.sim.scenario
        self.sim.nvml.before_call = self._refresh
        self.listener = Listener(self.sim.port)
        self.life: Life | None = None
        self.lives = 0
        self.deaths: list[float] = []  # simulated seconds at which a life ended by itself (its OOM, a failed start)
        self._tasks: list[asyncio.Task[Any]] = []
        target = self.sim.target()
        config = load_config(None, {"events": {"kernel_log": False, "xid": False}, "state_dir": None})
        # As Runtime builds a simulation's: the event timings on its clock.
        self.config: Config = events_on_clock(config.model_copy(update={"targets": (target,)}), self.scale)
        self.target = target.name

    # -- the NVML the exporter reads -------------------------------------------------------------------
    def _refresh(self, call: str) -> None:
        if call != "nvmlDeviceGetCount":
            return
        foreign = self.scenario.foreign_ratio(self.seconds)
        life = self.life
        if life is None or not life.alive:
            self.sim.show(None, foreign=foreign)
        else:
            self.sim.show(life.engine.now(), pid=life.pid, life=life.number, foreign=foreign)

    @property
    def seconds(self) -> float:
        """Simulated seconds since the first launch."""
        return self.clock.now * self.time_scale

    # -- the supervisor (supervisor.py, on the virtual clock) --------------------------------------------
    def _args(self, number: int) -> tuple[argparse.Namespace, tuple[str, ...]]:
        plugin = ENGINES[self.engine]
        argv = ["--scenario", self.scenario.name, "--port", str(self.sim.port), "--time-scale", f"{self.time_scale:g}",
                "--gpu-total-bytes", str(self.sim.gpu_total), *self.sim.told_args()]  # fmt: skip
        args = simulator_parser(None, plugin.knobs.told_flags).parse_args(argv)
        args.life = number
        args.foreign = self.scenario.foreign_ratio(self.seconds)
        return args, (sys.executable, "-m", str(plugin.simulator), *argv)

    async def _supervise(self) -> None:
        serve: Callable[[SimulatedEngine], Coroutine[Any, Any, int]] = importlib.import_module(
            str(ENGINES[self.engine].simulator)
        ).serve
        while True:
            number = self.lives
            args, cmdline = self._args(number)
            engine = VirtualEngine(args, self.clock, self.log_path)
            self.life = life = Life(number, FIRST_PID + number, engine, cmdline)
            self.lives += 1
            task = asyncio.ensure_future(serve(engine))
            kill_after = self.scenario.kill_after_serving
            if kill_after is not None:
                killed_at = engine.launched_at + (self.scenario.load_seconds + kill_after) / self.time_scale
                killer = asyncio.ensure_future(self.clock.sleep_until(killed_at))
                await asyncio.wait({task, killer}, return_when=asyncio.FIRST_COMPLETED)
                for pending in (task, killer):
                    pending.cancel()
            else:
                await asyncio.wait({task})
            if task.done() and not task.cancelled():
                self.deaths.append(self.seconds)
            life.alive = False
            await engine.close()
            await self.clock.sleep_until(self.clock.now + self.scenario.restart_delay / self.time_scale)

    # -- the exporter (runtime.py's, on the virtual clock) ---------------------------------------------
    async def start(self) -> None:
        config = self.config
        self.client = EngineClient(limit=16, user_agent="oomguard/virtual")
        self.source_runs = SourceRuns()
        self.nvml = NvmlReader(NvmlSource(self.sim.nvml, per_process=True, node=config.local_node), 10.0)
        finder = VirtualFinder(self)

        def make_scraper(t):  # type: ignore[no-untyped-def]
            scraper = TargetScraper(t, timeout=config.target_timeout(t), max_body_bytes=config.scrape.max_body_bytes,
                                    finder=finder, limits=config.target_limits(t),  # type: ignore[arg-type]
                                    clock=self.scale)  # fmt: skip
            if scraper.reservation is not None:  # its retry after a failed fetch, on the lives' clock
                scraper.reservation.clock = self.clock.wall
            return scraper

        self.targets = TargetSet(make_scraper, config.targets)
        self.processes = ProcessLookup(finder, self.targets.local_ports(), self.source_runs)  # type: ignore[arg-type]
        self.tracker = TrendTracker(trend_on_clock(config, self.scale))
        self.events = EventRunner(config, clock=self.clock.wall)
        self.observer = TrendObserver(self.nvml, self.processes, self.targets.views, self.tracker)
        self.collection = Collection(
            source_runs=self.source_runs, client=self.client, gpu_source=self.nvml, targets=self.targets,
            processes=self.processes, tracker=self.tracker, events=self.events,
            settings=VirtualSettings(self),  # type: ignore[arg-type]
            local_node=config.local_node,
        )  # fmt: skip
        self._tasks.append(asyncio.ensure_future(self._supervise()))
        await _settle()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.life is not None:
            await self.life.engine.close()
        await self.listener.serve(None)
        await self.client.close()
        self.events.close()
        self.nvml.close()

    async def advance(self, to: float) -> None:
        await self.clock.advance(to)
        life = self.life
        await self.listener.serve(life.engine.routes if life is not None and life.alive else None)

    def poll_events(self) -> None:
        self.events.poll()
        for target, at, pid in self.events.take_starts():
            self.targets.log_start(target, at, pid)

    async def sample_trend(self) -> None:
        self.tracker.record(self.clock.wall(), await self.observer.observe())

    async def exposition(self) -> str:
        return render(await self.collection.snapshot()).decode()


class _LifeOs:
    """The `os` a simulator sees: the life's pid, the rest the real module's."""

    def __init__(self, run: VirtualRun) -> None:
        self._run = run

    def getpid(self) -> int:
        return self._run.life.pid if self._run.life is not None else FIRST_PID

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


def patch(monkeypatch, run: VirtualRun) -> None:  # type: ignore[no-untyped-def]
    """Every `time` the path reads on the run's clock (the scraper's, the collection's, the process lookup's, the
    simulators'), and the simulators' own pid their life's."""
    fake = _patched_time(run.clock)
    simulators = [str(p.simulator) for p in ENGINES.values() if p.simulator]
    patched = ("oomguard.exporter.sources.targets", "oomguard.exporter.collection",
               "oomguard.exporter.sources.process_lookup", "oomguard.simulate.serve")  # fmt: skip
    for module in (*patched, *simulators):
        imported = importlib.import_module(module)
        if hasattr(imported, "time"):
            monkeypatch.setattr(imported, "time", fake)
    for module in simulators:
        imported = importlib.import_module(module)
        if hasattr(imported, "os"):
            monkeypatch.setattr(imported, "os", _LifeOs(run))
