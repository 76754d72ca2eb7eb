"""Discovery of the engines on this host: each engine process found by its command line becomes a target.

Every `discovery.local.interval_seconds`, the processes are listed (in a worker thread) and matched against
the engine plugins; an engine that listens becomes a target `host:port` (its URL's, as a configured target
would be named), scraped like a configured one, its processes looked up by its port. An engine not listening yet
(vLLM loading its model and warming up, for minutes, its KV cache already allocated) becomes a target at the port
its command line tells (`--port`, else its environment's, else the engine's default; its `--host`, else
loopback), loading: so its GPUs are judged above the reservation it was told meanwhile (join.py), not on their
total; once it listens at another address, the target moves there. One whose command line names a `--config`
file (where its port may be) waits until it listens. A configured target
wins: an engine on a configured local target's port is left to it. A restart keeps the target: a relaunched
engine with the same command line and port is the same target, and while a process with its command line
exists (a vLLM loading does not listen) it stays; it goes `forget_after_seconds` after the last such process
went. Health: `oomguard_source_success{source="local_discovery"}`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from oomguard.common.process_start import start_ticks
from oomguard.exporter.config import Config, TargetConfig
from oomguard.exporter.engines.cmdline import Cmdline, flag, program
from oomguard.exporter.sources.local.cmdline import (
    EngineProcess,
    engine_port,
    environ,
    find_engines,
    listening_ports,
    url_host,
    wanted_port,
)
from oomguard.exporter.sources.process_lookup import ProcessLookup
from oomguard.exporter.sources.source_runs import SourceRuns
from oomguard.exporter.sources.target_set import TargetSet

log = logging.getLogger(__name__)
SOURCE = "local_discovery"  # the `source` label of oomguard_source_success

# Each engine, its port and address if it listens, and else the port and address its command line tells (or None).
Found = list[tuple[EngineProcess, tuple[int, str] | None, tuple[int, str] | None]]


@dataclass
class _Known:
    engine: str
    cmdline: Cmdline
    name: str  # its target's
    seen_at: float  # monotonic: the last poll that saw a process with its command line


class LocalDiscovery:
    def __init__(
        self,
        config: Config,
        *,
        source_runs: SourceRuns,
        targets: TargetSet,
        processes: ProcessLookup,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = config.discovery
        self.source_runs = source_runs
        self.targets = targets
        self.processes = processes
        self.clock = clock
        # Configured targets win: their names, and the ports of those on this host.
        self.static_names = {t.label for t in config.targets}
        self.static_ports = {t.port for t in config.targets if t.is_local}
        self.static_lookup = list(processes.ports)
        self.known: dict[int, _Known] = {}  # by port
        # (pid, start tick) -> its port and address: the socket table is read only for engines not seen listening.
        self._ports: dict[tuple[int, int], tuple[int, str]] = {}
        self._denied = False

    async def run(self) -> None:
        """Poll every interval; the runtime made the first poll at start."""
        while True:
            await asyncio.sleep(self.settings.interval_seconds)
            await self.poll()

    async def poll(self) -> None:
        found = await self.source_runs.run(SOURCE, asyncio.to_thread(self._scan))
        if found is not None:  # a failed listing (logged by the run record) changes nothing
            self._apply(found, self.clock())

    # -- blocking: in a worker thread -----------------------------------------------------------
    def _scan(self) -> Found:
        engines = find_engines()
        ticks = {e.pid: start_ticks(e.pid) for e in engines}
        lives = {(pid, t) for pid, t in ticks.items() if t is not None}  # None: gone since the listing
        unknown = [e for e in engines if (e.pid, ticks[e.pid]) not in self._ports]
        listening: dict[int, dict[int, str]] = {}
        if unknown:
            try:
                listening = listening_ports()
            except psutil.AccessDenied:
                if not self._denied:
                    log.warning("local discovery: cannot read which process owns which socket; run as the "
                                "engines' user or as root, or configure the engines under targets:")  # fmt: skip
                self._denied = True
                raise
        found: Found = []
        for engine in engines:
            started = ticks[engine.pid]
            if started is None:
                continue
            life = (engine.pid, started)
            port = self._ports.get(life)
            told = None
            if port is None:
                env = environ(engine.pid)
                if (port := engine_port(engine, listening, env)) is not None:
                    self._ports[life] = port
                else:
                    told = _told(engine, env)
            found.append((engine, port, told))
        self._ports = {life: port for life, port in self._ports.items() if life in lives}
        return found

    # -- on the event loop ----------------------------------------------------------------------
    def _apply(self, found: Found, now: float) -> None:
        running = {(engine.engine, engine.cmdline) for engine, _, _ in found}
        for engine, listen, told in found:
            at = listen or told
            if at is None:
                continue  # not listening, no port told: a known one is kept below by its command line
            port, address = at
            config = TargetConfig(url=f"http://{url_host(address)}:{port}", engine=engine.engine, local_process="yes")
            if port in self.static_ports or config.label in self.static_names:
                continue  # a configured target is there
            known = self.known.get(port)
            if known is not None and listen is None:
                continue  # not listening yet: the target there (this engine's, or another's) stays as it is
            if known is not None and known.engine != engine.engine:
                self._remove(port)  # another engine took the port
                known = None
            moved = known is not None and self.targets.url(known.name) != config.url
            if known is not None and moved and not self.targets.has_served(known.name):
                self._remove(port)  # taken at the address its command line told, it listens at another
                known = None
            if known is None:
                self.targets.add(config)
                self.known[port] = _Known(engine.engine, engine.cmdline, config.label, now)
                waiting = "" if listen else ", not listening yet"
                log.info("local discovery: %s at %s (pid %d%s)", engine.engine, config.url, engine.pid, waiting)
            elif known.cmdline != engine.cmdline:
                known.cmdline = engine.cmdline  # relaunched with other flags: the same target, its counts go on
        for port, known in list(self.known.items()):
            if (known.engine, known.cmdline) in running:
                known.seen_at = now
            elif now - known.seen_at >= self.settings.forget_after_seconds:
                self._remove(port)
        self.processes.set_ports([*self.static_lookup, *self.known])

    def _remove(self, port: int) -> None:
        known = self.known.pop(port)
        self.targets.remove(known.name)
        log.info("local discovery: target %s gone", known.name)


def _told(engine: EngineProcess, env: dict[str, str] | None) -> tuple[int, str] | None:
    """The port and address an engine not listening yet is told on its command line (or environment); None when
    it names a configuration file, where they may be instead (blocking: called in the scan's thread)."""
    args = program(engine.cmdline)[1]
    if flag(args, "--config") is not None:
        return None
    port = wanted_port(engine, env)
    return (port, flag(args, "--host", "--hostname") or "") if port is not None else None
