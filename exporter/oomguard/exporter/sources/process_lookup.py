"""The engines' processes on this host, looked up once for all local targets and shared.

Concurrent callers share the lookup in flight. A scrape always looks again (an engine
killed a moment ago must not be reported); the trend sampler passes max_age and reuses
a recent lookup, but only one that found every engine: one loading may listen any moment.
"""

from __future__ import annotations

import asyncio
import logging
import time

from oomguard.exporter.model import ProcessTree
from oomguard.exporter.sources.processes import ProcessFinder
from oomguard.exporter.sources.source_runs import SourceRuns

log = logging.getLogger(__name__)

Lookup = dict[int, ProcessTree | None]  # port -> the engine listening there, None when none


class ProcessLookup:
    name = "processes"

    def __init__(self, finder: ProcessFinder, ports: list[int], source_runs: SourceRuns) -> None:
        self.finder = finder
        self.ports = sorted(set(ports))
        self.source_runs = source_runs
        self._last: tuple[float, Lookup] | None = None  # (monotonic time, lookup)
        self._in_flight: asyncio.Future[Lookup | None] | None = None

    def set_ports(self, ports: list[int]) -> None:
        """The ports looked up from now on (local discovery adds and removes engines); a cached lookup of
        other ports is dropped."""
        ports = sorted(set(ports))
        if ports != self.ports:
            self.ports = ports
            self._last = None

    async def get(self, max_age: float = 0.0) -> Lookup:
        if not self.ports:
            return {}
        cached = self._last
        if cached is not None and time.monotonic() - cached[0] < max_age and all(cached[1].values()):
            return cached[1]
        if self._in_flight is None:
            lookup = self.source_runs.run(self.name, asyncio.to_thread(self.finder.find_all, self.ports))
            self._in_flight = asyncio.ensure_future(lookup)
            self._in_flight.add_done_callback(self._keep)
        found = await asyncio.shield(self._in_flight)
        # A failed lookup (logged by the run record): the engines' metrics still go out, without their processes.
        return found if found is not None else {}

    def latest(self) -> Lookup:
        """The last lookup that completed, without looking again ({} before the first)."""
        return self._last[1] if self._last is not None else {}

    def _keep(self, lookup: asyncio.Future[Lookup | None]) -> None:
        self._in_flight = None
        if not lookup.cancelled() and lookup.exception() is None and lookup.result() is not None:
            self._last = (time.monotonic(), lookup.result())  # type: ignore[assignment]
