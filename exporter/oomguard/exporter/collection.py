"""One collection = one snapshot of every source, gathered concurrently, off the event loop.

Concurrent scrapes share the collection in flight instead of starting their own: ten
Prometheis scraping at once cost one round of NVML calls and one request per target.
Each source runs through the sources' run record (`SourceRuns`), timed and isolated: a failing or hung source
yields `success=0` for that source, and the scrape goes on with the others. What the
background services keep (trends, event counts, XIDs) is read as it stands.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from oomguard.common.engine_client import EngineClient
from oomguard.exporter.events.runner import EventRunner
from oomguard.exporter.join import join_gpus, join_targets
from oomguard.exporter.model import GpuReadings, LogStreams, Snapshot, TargetReading
from oomguard.exporter.sources.gpu_source import GpuSource
from oomguard.exporter.sources.local.settings import SettingsReader
from oomguard.exporter.sources.process_lookup import ProcessLookup
from oomguard.exporter.sources.source_runs import SourceRuns
from oomguard.exporter.sources.target_set import TargetSet
from oomguard.exporter.trend.sampler import TrendTracker

# The `source` label of oomguard_source_success of the local engines' settings from their command lines.
SETTINGS = "settings"


class Collection:
    def __init__(
        self,
        *,
        source_runs: SourceRuns,
        client: EngineClient,
        gpu_source: GpuSource | None,
        targets: TargetSet,
        processes: ProcessLookup,
        tracker: TrendTracker | None = None,
        events: EventRunner | None = None,
        attribute: Callable[[GpuReadings | None, tuple[TargetReading, ...]], Awaitable[tuple[TargetReading, ...]]]
        | None = None,
        settings: SettingsReader | None = None,
        local_node: str = "",
        dcgm_refusals: Callable[[], dict[tuple[str, str, str, str], int]] | None = None,
        dcgm_node_pods: Callable[[], dict[str, int]] | None = None,
        log_streams: Callable[[], LogStreams | None] | None = None,
    ) -> None:
        """`attribute`: gives discovered targets their pod and its processes on the GPUs (sources/kubernetes/);
        `settings`: gives local targets their engine's settings from their process's command line (sources/local/);
        `dcgm_refusals`: the pods refused as a node's dcgm-exporter (sources/kubernetes/trusted_dcgm.py);
        `dcgm_node_pods`: the pods taken as each node's dcgm-exporter at the last read (the same);
        `log_streams`: the cluster mode's log streams against their budget (sources/kubernetes/log_budget.py)."""
        self.source_runs = source_runs
        self.client = client
        self.gpu_source = gpu_source  # the GPUs' reader (sources/gpu_source.py), whichever the configuration chose
        self.targets = targets
        self.processes = processes
        self.tracker = tracker
        self.events = events
        self.attribute = attribute
        self.settings = settings
        self.local_node = local_node  # the exporter's node: its configured targets' and its NVML GPUs'
        self.dcgm_refusals = dcgm_refusals
        self.dcgm_node_pods = dcgm_node_pods
        self.log_streams = log_streams
        self._in_flight: asyncio.Future[Snapshot] | None = None
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
        targets, gpus = await asyncio.gather(
            self.source_runs.run("targets", self._scrape_targets()),
            # a source's reading is up while any of its nodes answers (dcgm-exporter's); its success wants all
            self.source_runs.run(self.gpu_source.name, self._read_gpus(), ok=lambda r: r.up and not r.error)
            if self.gpu_source
            else _none(),
        )
        targets = tuple(targets or ())
        if self.attribute is not None:  # its /proc reads are a source of their own (pod_processes); never raises
            targets = await self.attribute(gpus, targets)
        # A source like the others: timed, its success recorded; a failure leaves the readings as they were.
        if self.settings is not None:
            targets = await self.source_runs.run(SETTINGS, self.settings.add(targets)) or targets
        self.targets.note_reservations(targets)
        memory = join_targets(gpus, targets, self.local_node)
        tracker, events = self.tracker, self.events
        # As the last poll left them: no lock taken on the loop, no dict read while a poll changes it.
        seen = events.view if events else None
        snapshot = Snapshot(
            gpus=gpus,  # whichever GPU source read them
            targets=targets,
            sources=self.source_runs.results(),
            collected_at=time.time(),
            memory=memory,
            gpu_memory=join_gpus(gpus, targets, memory),
            trends=dict(tracker.latest) if tracker else {},
            trend_samples_total=tracker.samples_total if tracker else None,
            trend_errors_total=tracker.errors_total if tracker else 0,
            events=seen.counts if seen else {},
            event_sources=seen.health if seen else (),
            event_state_write_errors=events.state_write_errors if events and events.has_state else None,
            event_state_read_errors=events.state_read_errors if events and events.has_state else None,
            xid=seen.xid if seen else {},
            xid_last=seen.xid_last if seen else {},
            xid_read_errors=seen.xid_read_errors if seen else None,
            node=self.local_node,
            dcgm_refusals=dict(self.dcgm_refusals()) if self.dcgm_refusals else None,
            dcgm_node_pods=dict(self.dcgm_node_pods()) if self.dcgm_node_pods else None,
            log_streams=self.log_streams() if self.log_streams else None,
        )
        self.last = snapshot
        return snapshot

    async def _read_gpus(self) -> GpuReadings:
        # The targets' requests leave first: the slowest target bounds the scrape, and the read's thread, started
        # first, held the GIL while they were being sent (0.7 ms before the first left, bench/bench_scrape.py).
        await asyncio.sleep(0)
        assert self.gpu_source is not None
        return await self.gpu_source.read()

    async def _scrape_targets(self) -> list[TargetReading]:
        # The process lookup runs in a thread while the requests are out, not after them.
        lookup = asyncio.ensure_future(self.processes.get()) if self.processes.ports else None
        try:
            return list(await asyncio.gather(*(s.scrape(self.client, lookup) for s in self.targets.scrapers())))
        finally:
            if lookup is not None and not lookup.done():
                lookup.cancel()


async def _none() -> GpuReadings | None:
    return None
