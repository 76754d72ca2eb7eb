"""One collection = one snapshot of every source, gathered concurrently, off the event loop.

Concurrent scrapes share the collection in flight instead of starting their own:
ten Prometheis scraping at once cost one round of NVML calls and one request per
target. Each source is timed and isolated: a failing or hung source yields
`success=0` for that source, and the scrape goes on with the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import aiohttp

from oomguard.config import Config
from oomguard.events.runner import Counts, EventRunner, SourceHealth
from oomguard.events.xid import XidWatcher
from oomguard.snapshot import NvmlReading, ProcessTree, TargetReading
from oomguard.sources.nvml import NvmlSource
from oomguard.sources.processes import ProcessFinder
from oomguard.sources.targets import TargetScraper
from oomguard.trend.sampler import Key, Observation, TrendReading, TrendTracker, observations

log = logging.getLogger(__name__)

# A trend-sampler tick this soon after a scrape reuses the scrape's lookup of the engines' processes.
PROCESS_LOOKUP_MAX_AGE = 1.0


@dataclass(frozen=True, slots=True)
class SourceResult:
    success: bool
    duration_seconds: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    nvml: NvmlReading | None  # None when the NVML collector is turned off
    targets: tuple[TargetReading, ...]
    sources: dict[str, SourceResult]
    collected_at: float
    trends: dict[Key, TrendReading] = field(default_factory=dict)
    trend_samples_total: int | None = None  # None: trend sampling is off
    trend_errors_total: int = 0
    events: dict[str, Counts] = field(default_factory=dict)  # target ("" for the host) -> counts
    event_sources: tuple[SourceHealth, ...] = ()
    xid: dict[tuple[int, int], int] = field(default_factory=dict)
    xid_last: dict[int, float] = field(default_factory=dict)


class Collection:
    def __init__(self, config: Config, nvml: NvmlSource | None, session: aiohttp.ClientSession) -> None:
        self.config = config
        self.nvml = nvml
        self.session = session
        self.finder = finder = ProcessFinder()
        self.tracker = TrendTracker(config.trend.settings()) if config.trend.enabled else None
        self.events = EventRunner(config)
        self.xid = XidWatcher(nvml.lib) if nvml is not None and config.events.xid else None
        self.scrapers = [
            TargetScraper(
                t, timeout=config.target_timeout(t), max_body_bytes=config.scrape.max_body_bytes, finder=finder
            )
            for t in config.targets
        ]
        # One thread for NVML: a hung driver call blocks only this thread, and a
        # second read is not stacked behind it (see _read_nvml).
        self._nvml_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml")
        self._nvml_future: Future[NvmlReading] | None = None
        self._in_flight: asyncio.Future[Snapshot] | None = None
        self._local_ports = sorted({s.port for s in self.scrapers if s.finder is not None})
        self._processes: tuple[float, dict[int, ProcessTree | None]] | None = None  # (monotonic time, lookup)
        self._processes_in_flight: asyncio.Future[dict[int, ProcessTree | None]] | None = None
        self.last: Snapshot | None = None

    async def snapshot(self) -> Snapshot:
        if self._in_flight is None:
            self._in_flight = asyncio.ensure_future(self._collect())
            self._in_flight.add_done_callback(self._clear_in_flight)
        # shield: one scraper giving up must not cancel the collection the others wait on.
        return await asyncio.shield(self._in_flight)

    def _clear_in_flight(self, _: asyncio.Future[Snapshot]) -> None:
        self._in_flight = None

    async def _collect(self) -> Snapshot:
        sources: dict[str, SourceResult] = {}
        nvml_result, target_results = await asyncio.gather(
            self._timed("nvml", self._read_nvml(), sources) if self.nvml else _none(),
            self._timed("targets", self._scrape_targets(), sources),
        )
        tracker = self.tracker
        snapshot = Snapshot(
            nvml=nvml_result,
            targets=tuple(target_results or ()),
            sources=sources,
            collected_at=time.time(),
            trends=dict(tracker.latest) if tracker else {},
            trend_samples_total=tracker.samples_total if tracker else None,
            trend_errors_total=tracker.errors_total if tracker else 0,
            events={name: Counts(dict(c.total), dict(c.last)) for name, c in self.events.counts.items()},
            event_sources=tuple(self.events.health()),
            xid=dict(self.xid.counts) if self.xid else {},
            xid_last=dict(self.xid.last) if self.xid else {},
        )
        self.last = snapshot
        return snapshot

    async def _timed(self, name: str, work, sources: dict[str, SourceResult]):
        started = time.perf_counter()
        try:
            result = await work
            success = not (isinstance(result, NvmlReading) and not result.up)
        except Exception:  # a source must never fail the scrape
            log.exception("source %s failed", name)
            result, success = None, False
        sources[name] = SourceResult(success, time.perf_counter() - started)
        return result

    async def _read_nvml(self) -> NvmlReading:
        assert self.nvml is not None
        timeout = self.config.nvml.timeout_seconds
        if self._nvml_future is None or self._nvml_future.done():
            self._nvml_future = self._nvml_thread.submit(self.nvml.read)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self._nvml_future), timeout)
        except TimeoutError:
            # The read goes on in its thread; the next scrape waits on it rather than starting another.
            log.warning(
                "NVML read took longer than %gs (nvml.timeout_seconds): GPU metrics left out of this scrape", timeout
            )
            raise

    async def trend_observations(self) -> dict[Key, Observation]:
        """One tick of the trend sampler: GPUs, and each target's GPUs and local processes."""
        nvml = None
        if self.nvml is not None:
            try:
                nvml = await self._read_nvml()
            except TimeoutError:
                nvml = None  # the GPU series miss this tick; the sampler goes on

        trees = await self.local_processes(max_age=PROCESS_LOOKUP_MAX_AGE) if self._local_ports else {}
        targets = [(s.name, s.config.gpus, trees.get(s.port) if s.finder else None) for s in self.scrapers]
        return await asyncio.to_thread(observations, nvml, targets)

    async def _scrape_targets(self) -> list[TargetReading]:
        # The process lookup runs in a thread while the requests are out, not after them.
        processes = asyncio.ensure_future(self.local_processes()) if self._local_ports else None
        try:
            return list(await asyncio.gather(*(s.scrape(self.session, processes) for s in self.scrapers)))
        finally:
            if processes is not None and not processes.done():
                processes.cancel()

    async def local_processes(self, max_age: float = 0.0) -> dict[int, ProcessTree | None]:
        """The engines found on this host, by port: one lookup for all targets.

        Concurrent callers share the lookup in flight. A scrape always looks again (an engine
        killed a moment ago must not be reported); the trend sampler passes max_age and reuses
        a recent lookup, but only one that found every engine: one loading may listen any moment.
        """
        cached = self._processes
        if cached is not None and time.monotonic() - cached[0] < max_age and all(cached[1].values()):
            return cached[1]
        if self._processes_in_flight is None:
            lookup = asyncio.to_thread(self.finder.find_all, self._local_ports)
            self._processes_in_flight = asyncio.ensure_future(lookup)
            self._processes_in_flight.add_done_callback(self._keep_processes)
        try:
            return await asyncio.shield(self._processes_in_flight)
        except Exception:  # the engines' metrics still go out, without their host processes
            log.exception("looking up the engines' processes on this host failed")
            return {}

    def _keep_processes(self, lookup: asyncio.Future[dict[int, ProcessTree | None]]) -> None:
        self._processes_in_flight = None
        if not lookup.cancelled() and lookup.exception() is None:
            self._processes = (time.monotonic(), lookup.result())

    async def follow_events(self) -> None:
        """The background loop reading logs, journals, cgroups and the kernel log."""
        interval = self.config.events.poll_interval_seconds
        while True:
            await asyncio.to_thread(self.events.poll)
            await asyncio.sleep(interval)

    def close(self) -> None:
        self.events.close()
        if self.xid is not None:
            self.xid.stop()
        if self.nvml is not None:
            self._nvml_thread.submit(self.nvml.close)
        self._nvml_thread.shutdown(wait=False, cancel_futures=True)


async def _none() -> None:
    return None
