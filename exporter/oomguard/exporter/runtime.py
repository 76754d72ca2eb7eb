"""The composition root: everything oomguard runs, built from one configuration.

`serve`, `serve --simulate` and the drill all build a `Runtime` (a simulation is built by the caller and handed
in, `Simulated`: the exporter imports no simulator); the web layer only calls `start` and `stop` and reads
`collection`. Who owns what:

- the event loop: the collection (scrapes of the targets, coalesced), the trend
  sampler's loop, the event poller's loop, the startup watch (/health of the targets
  not up, between scrapes), the garbage collector's freezer (TargetFreezer: what the
  targets hold, frozen once the target set has settled), the simulation's supervisor;
- the GPU source (sources/gpu_source.py): NVML's thread (sources/nvml_reader.py), every NVML read one at a time, or
  dcgm-exporter's requests on the event loop (sources/dcgm.py);
- worker threads (asyncio.to_thread): the process lookup, the trend analysis, each
  poll of the event sources, the event state file;
- the XID thread (events/xid.py): waits for NVML's XID events, which the event poller takes.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Any, Protocol

from oomguard import __version__
from oomguard.common import descriptors
from oomguard.common.engine_client import EngineClient
from oomguard.common.thresholds import Thresholds
from oomguard.common.time_scale import REAL, TimeScale
from oomguard.exporter.collection import Collection
from oomguard.exporter.config import Config, TargetConfig
from oomguard.exporter.events.kill_owners import KillOwners
from oomguard.exporter.events.kubernetes import PodEvents
from oomguard.exporter.events.runner import EventRunner
from oomguard.exporter.model import TrendSettings
from oomguard.exporter.sources.gpu_source import NVML, GpuSource, GpuSourceContext, build_gpu_source, chosen_gpu_source
from oomguard.exporter.sources.kubernetes.discovery import KubernetesDiscovery
from oomguard.exporter.sources.local.discovery import LocalDiscovery
from oomguard.exporter.sources.local.settings import SettingsReader
from oomguard.exporter.sources.process_lookup import ProcessLookup
from oomguard.exporter.sources.processes import ProcessFinder
from oomguard.exporter.sources.source_runs import SourceRuns
from oomguard.exporter.sources.target_set import TargetSet
from oomguard.exporter.sources.targets import TargetScraper
from oomguard.exporter.trend.observe import TrendObserver
from oomguard.exporter.trend.sampler import Sampler, TrendTracker
from oomguard.exporter.web_config.server import scrape_connection_limit

log = logging.getLogger(__name__)

_REAL_NVML = object()  # default of nvml_lib: pynvml, or the simulation's fake GPUs
# How often the targets not up have their /health asked between scrapes: a measured startup is good to this, whatever
# the scrape interval. On a simulation's clock a simulated second, no shorter than the floor (real seconds).
STARTUP_WATCH_SECONDS = 1.0
STARTUP_WATCH_FLOOR_SECONDS = 0.25
# The garbage collector and the targets (docs/performance.md, "Garbage collection and the idle cost").
FREEZE_SETTLE_SECONDS = 5.0  # the target set unchanged this long: discovery has settled, what it made is frozen
REFREEZE_SECONDS = 600.0  # a target gone: at most this often, everything is thawed, collected and frozen again
FREEZE_CHECK_SECONDS = 1.0
# Whose processes and pods a kernel OOM kill may be, told again this often when nothing changed (a process seen is
# remembered for kill_owners.REMEMBER_SECONDS): not at every poll of the events.
OWNERS_REFRESH_SECONDS = 30.0


class TargetFreezer:
    """What lives as long as a target (its scraper, its series, its trend, its log's follower and sources) is kept
    out of the garbage collector's full passes: frozen (`gc.freeze`) once the target set has not changed for
    FREEZE_SETTLE_SECONDS. A full pass walks every object not frozen, and at 1,000 discovered targets it held every
    thread, the event loop's, for 120 to 245 ms about once a scrape; the runtime froze only what existed at its
    start, which in the cluster mode is none of its targets.

    A frozen object that becomes garbage is still freed by its reference count, but one in a reference cycle stays
    until it is thawed: a removed target's (its tasks, its scraper's callbacks), and whatever short-lived cycle a
    freeze caught (a scrape in flight). So after the set changed, at most every REFREEZE_SECONDS, everything is
    thawed, collected and frozen again (one full pass, as long as those it replaces); until then a freeze only adds
    what is new (a pass over what is not frozen yet). A set that does not change costs nothing more."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._changed_at: float | None = None  # the last change of the target set not frozen yet
        self._thaw = False  # frozen since the last full refreeze: a target gone, or a cycle caught, may be held
        self._refrozen_at = clock()
        self.freezes = 0  # freezes of what was new
        self.refreezes = 0  # full ones: thawed, collected, frozen again

    def changed(self, *, gone: bool = False) -> None:
        """The target set changed (on the event loop): `gone`, a target or its scraper went away (what it held is
        freed by the next full refreeze, as what any freeze caught)."""
        self._changed_at = self._clock()

    def step(self) -> None:
        """Freeze what is due: called every FREEZE_CHECK_SECONDS on the event loop (a collection holds every thread
        whichever thread runs it)."""
        now = self._clock()
        settled = self._changed_at is not None and now - self._changed_at >= FREEZE_SETTLE_SECONDS
        refreeze = self._thaw and now - self._refrozen_at >= REFREEZE_SECONDS and (settled or self._changed_at is None)
        if refreeze:
            gc.unfreeze()
            self._thaw, self._refrozen_at = False, now
            self.refreezes += 1
        elif not settled:
            return
        else:
            self._thaw = True
            self.freezes += 1
        self._changed_at = None
        gc.collect()
        gc.freeze()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(FREEZE_CHECK_SECONDS)
            self.step()


class OwnersFeed:
    """Tells the event runner's kill owners (events/kill_owners.py) each target's processes and pod: when the target
    set or the process lookup changed, else every OWNERS_REFRESH_SECONDS. Told at every poll, a thousand pods cost
    more than the polls themselves (issue 50, item 5)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._version = -1
        self._found: Any = None  # the process lookup last told (kept: its identity tells a new one)
        self._told_at = 0.0

    def feed(self, targets: TargetSet, processes: ProcessLookup, owners: KillOwners) -> bool:
        """Whether the owners were told."""
        found, now = processes.latest(), self._clock()
        same = targets.version == self._version and (found is self._found or not (found or self._found))
        if same and now - self._told_at < OWNERS_REFRESH_SECONDS:
            return False
        for name, pids, pod_uid in targets.owners(found):
            owners.update(name, pids, pod_uid)
        owners.keep_only(targets.names())
        self._version, self._found, self._told_at = targets.version, found, now
        return True


class Simulated(Protocol):
    """A simulation the composition root builds and hands the runtime (`serve --simulate`, the drill:
    simulate/host.py's `SimulatedHost`). The exporter knows no simulator, only this: the configuration it runs, the
    clock its durations are judged on, the GPUs, and a start and a stop beside its own."""

    clock: TimeScale  # every duration the exporter judges runs on it (common/time_scale.py)

    @property
    def nvml(self) -> Any:
        """Its GPUs, through NVML's API."""

    def configure(self, config: Config) -> Config:
        """The configuration the exporter runs: the simulated engine a target, the events' timings on the clock."""

    def trend_settings(self, config: Config) -> TrendSettings:
        """The trend's settings of `config` on the clock."""

    async def start(self, config: Config) -> Config:
        """Started before the sources; `config` with the simulation's GPU source where it is not NVML (a simulated
        dcgm-exporter's URL)."""

    async def stop(self) -> None:
        """Stopped after the sources."""


class Runtime:
    def __init__(
        self,
        config: Config,
        *,
        nvml_lib: ModuleType | Any | None = _REAL_NVML,
        simulated: Simulated | None = None,
        thresholds: Thresholds | None = None,
    ) -> None:
        """`nvml_lib`: pynvml or a stand-in with its API; None for no GPUs. `simulated`: the simulation that the
        configuration's `simulation:` names, built by the caller (simulate/host.py). `thresholds`: what the status
        page judges its pages with (the bundle's, common/thresholds.py); None: no pages judged."""
        if config.simulation.scenario and simulated is None:
            raise ValueError(
                f"the configuration simulates {config.simulation.scenario!r}: hand the runtime its simulation "
                "(simulated=oomguard.simulate.host.SimulatedHost(config))"
            )
        self.simulated = simulated
        # The clock every judged duration runs on: the simulation's, built once by it and handed to what judges
        # (the scrapers, the trend's and the events' settings, the status page's sparkline); life's outside one.
        self.clock: TimeScale = simulated.clock if simulated is not None else REAL
        if simulated is not None:
            config = simulated.configure(config)
        self.config = config
        self.thresholds = thresholds
        self._nvml_lib = nvml_lib
        self.source_runs = SourceRuns()
        self.collection: Collection | None = None  # set by start()
        self.targets: TargetSet | None = None  # set by start()
        self.tracker: TrendTracker | None = None  # set by start() where trends are on: the status page's sparklines
        self.freezer: TargetFreezer | None = None  # set by start()
        self._client: EngineClient | None = None
        self._gpus: GpuSource | None = None
        self._events: EventRunner | None = None
        self.discovery: KubernetesDiscovery | None = None
        self.local_discovery: LocalDiscovery | None = None
        self._tasks: list[asyncio.Future[Any]] = []

    def _lib(self) -> ModuleType | Any | None:
        if chosen_gpu_source(self.config) is not NVML:
            return None  # no GPUs read, or read from another source: NVML's library is the XID events' too
        if self._nvml_lib is not _REAL_NVML:
            return self._nvml_lib
        if self.simulated is not None:
            return self.simulated.nvml
        import pynvml

        return pynvml

    async def start(self) -> None:
        if self.simulated is not None:
            self.config = await self.simulated.start(self.config)
        config = self.config
        _say_descriptors(descriptors.budget())
        # One client for every target, for the life of the runtime.
        self._client = EngineClient(limit=scrape_connection_limit(), user_agent=f"oomguard/{__version__}")
        lib = self._lib()
        finder = ProcessFinder()

        def make_scraper(t: TargetConfig) -> TargetScraper:
            return TargetScraper(
                t,
                timeout=config.target_timeout(t),
                max_body_bytes=config.scrape.max_body_bytes,
                finder=finder,
                limits=config.target_limits(t),
                clock=self.clock,
            )

        # The one set of targets: discovery changes it, on the event loop; the others read it. What each target
        # holds is frozen out of the garbage collector's full passes once a change of the set has settled.
        freezer = self.freezer = TargetFreezer()
        targets = self.targets = TargetSet(make_scraper, config.targets, on_change=freezer.changed)
        processes = ProcessLookup(finder, targets.local_ports(), self.source_runs)
        trend = self.simulated.trend_settings(config) if self.simulated is not None else config.trend.settings()
        tracker = self.tracker = TrendTracker(trend) if config.trend.enabled else None
        # Reads the saved state file: not on the event loop.
        events = self._events = await asyncio.to_thread(partial(EventRunner, config, nvml=lib))
        discovery = self.discovery = (
            KubernetesDiscovery(
                config, source_runs=self.source_runs, targets=targets, pod_events=PodEvents(events, config.events)
            )
            if config.kubernetes is not None
            else None
        )
        gpus = self._gpus = build_gpu_source(
            config,
            GpuSourceContext(self._client, lib, discovery.dcgm_endpoints if discovery is not None else None),
        )
        local = self.local_discovery = (
            LocalDiscovery(config, source_runs=self.source_runs, targets=targets, processes=processes)
            if config.discovers_local
            else None
        )
        self.collection = collection = Collection(
            source_runs=self.source_runs, client=self._client, gpu_source=gpus, targets=targets, processes=processes,
            tracker=tracker, events=events, attribute=discovery.attribute if discovery else None,
            settings=SettingsReader(), local_node=config.local_node,
            dcgm_refusals=discovery.dcgm_refusals if discovery and config.dcgm and config.dcgm.discover else None,
            dcgm_node_pods=discovery.dcgm_node_pods if discovery and config.dcgm and config.dcgm.discover else None,
            log_streams=discovery.log_streams if discovery and discovery.cluster else None,
        )  # fmt: skip
        # What exists at start lives as long as the runtime: keep it out of the garbage collector's
        # full passes, which otherwise stall a scrape for tens of milliseconds now and then. What comes later (the
        # discovered targets) is frozen by the freezer, once each change of the target set has settled.
        gc.collect()
        gc.freeze()
        self._tasks.append(asyncio.ensure_future(freezer.run()))
        if local is not None:
            await local.poll()  # the engines running now are targets of the first collection
            self._tasks.append(asyncio.ensure_future(local.run()))
        # A first collection at start, so /-/ready means "has data" and the first real
        # scrape finds NVML initialised and the targets' states known.
        self._tasks.append(asyncio.ensure_future(collection.snapshot()))
        if tracker is not None:
            pod_processes = discovery.pod_processes if discovery is not None else None
            observer = TrendObserver(gpus, processes, targets.views, tracker, pod_processes, config.local_node)
            sampler = Sampler(tracker, observer.observe)
            self._tasks.append(asyncio.ensure_future(sampler.run()))
        self._tasks.append(asyncio.ensure_future(self._watch_startups(targets)))
        if events.sources or discovery is not None:
            self._tasks.append(asyncio.ensure_future(self._follow_events(events, targets, processes)))
        if discovery is not None:
            self._tasks.append(asyncio.ensure_future(discovery.run()))

    async def _follow_events(self, events: EventRunner, targets: TargetSet, processes: ProcessLookup) -> None:
        """The background loop reading logs, journals, cgroups and the kernel log; the engines' starts read there
        go to their targets' restart trackers (a life that never serves is seen nowhere else)."""
        interval = self.config.events.poll_interval_seconds
        owners = OwnersFeed()
        while True:
            # Whose processes and pods a kernel OOM kill may be (events/kill_owners.py).
            owners.feed(targets, processes, events.kill_owners)
            if events.due():  # else every source is quiet and none is due: no thread woken for nothing
                await asyncio.to_thread(self.source_runs.run_blocking, "events", events.poll)
            for target, at, pid in events.take_starts():
                targets.log_start(target, at, pid)
            await asyncio.sleep(interval)

    async def _watch_startups(self, targets: TargetSet) -> None:
        """The /health of each target not up, every STARTUP_WATCH_SECONDS: a startup ends at its first 200, timed to
        this interval rather than to the scrapes' (sources/targets.py, watch_startup). A target whose answer is still
        awaited (up to its timeout) is skipped, not waited for: a hanging one delays no other's."""
        interval = self.clock.real(STARTUP_WATCH_SECONDS, floor=STARTUP_WATCH_FLOOR_SECONDS)
        in_flight: dict[TargetScraper, asyncio.Task[None]] = {}
        try:
            while True:
                assert self._client is not None
                for scraper in targets.scrapers():
                    # Up (nearly every target, nearly always): no task at all, so the watch costs a fleet nothing.
                    if scraper.status.state != "up" and scraper not in in_flight:
                        task = in_flight[scraper] = asyncio.ensure_future(scraper.watch_startup(self._client))
                        task.add_done_callback(lambda _, s=scraper: in_flight.pop(s, None))
                await asyncio.sleep(interval)
        finally:
            for task in list(in_flight.values()):
                task.cancel()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await asyncio.to_thread(self._close_blocking)
        if self.discovery is not None:
            await self.discovery.close()  # after the event sources: a sharded node is let go where they stopped
        if self._client is not None:
            await self._client.close()
        if self.simulated is not None:
            await self.simulated.stop()

    def _close_blocking(self) -> None:
        if self._events is not None:
            self._events.close()
        if self._gpus is not None:
            self._gpus.close()


def _say_descriptors(shares: descriptors.Budget) -> None:
    """The descriptor budget, once at start (descriptors.py): what each use may hold."""
    log.info(
        "file descriptors: %d (RLIMIT_NOFILE): %d for the server's connections, %d for the engines' and "
        "dcgm-exporters' requests, %d log streams and %d short log reads (the cluster mode), %d kept for files",
        shares.limit, shares.server, shares.scrapes, shares.log_streams, shares.log_reads, shares.files,
    )  # fmt: skip
    if shares.overbooked:
        log.warning("file descriptors: a limit of %d is below what the shares' minimums need (256): raise it "
                    "(systemd LimitNOFILE=, ulimit -n)", shares.limit)  # fmt: skip
