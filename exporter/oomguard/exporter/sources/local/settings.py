"""The engines' settings as started, read from each local target's process (its command line, its environment
for the engines that read one, its installed version for the defaults that depend on it).

Only a process whose command line is the engine's (engines/<name>/cmdline.py `matches`, or oomguard's simulator
of it) is read: a docker-proxy or a wrapper listening for it has no flags of its own. One read per engine life (a
process's pid and start time): the command line of a running process does not change. The reads of /proc run in
a worker thread. A target whose process is gone keeps its last settings: what it was started with is what an
OOM's diagnosis needs, and it is the same life until another starts.

A loading engine is found here too: vLLM does not listen while it loads and warms up (minutes, its KV cache
allocated early), so the process lookup by port finds nothing. A loading target on this host with no process is
given the engine process whose command line names its port (`--port`, else its environment's, else the engine's
default): its processes (which GPUs, its own bytes) and its settings, the reservation it was told among them
(join.py judges the GPU above it until the engine reports its own). That look lists /proc (14 ms for 96
processes) once per collection while a target loads unseen.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
from dataclasses import replace
from urllib.parse import urlsplit

import psutil

from oomguard.common.ports import url_port
from oomguard.common.process_start import start_time
from oomguard.exporter.engines import ENGINES
from oomguard.exporter.engines.cmdline import Cmdline, Settings
from oomguard.exporter.model import ProcessTree, TargetReading
from oomguard.exporter.sources.local.cmdline import (
    EngineProcess,
    environ,
    find_engines,
    installed_version,
    is_engine,
    wanted_port,
)

Life = tuple[str, int, float]  # (engine, root pid, start time)
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def read_settings(engine: str, pid: int, argv: Cmdline) -> Settings:
    """One engine process's settings (blocking: reads /proc)."""
    plugin = ENGINES[engine]
    if plugin.settings is None or not is_engine(engine, argv, simulators=True):
        return {}  # not the engine's own command line (a proxy, a wrapper): its flags would be no one's
    version = installed_version(pid, argv, plugin.distributions) if plugin.distributions else None
    return plugin.settings(argv, version, environ(pid))


class SettingsReader:
    def __init__(self) -> None:
        self._by_life: dict[Life, Settings] = {}
        self._last: dict[str, Settings] = {}  # by target name: its last life's

    async def add(self, targets: tuple[TargetReading, ...]) -> tuple[TargetReading, ...]:
        """The targets with their settings, where their process on this host is known (now or before); a loading
        target on this host without one, with its engine's process found by its command line."""
        unseen = {t.name: ((t.engine, port), t.url) for t in targets if (port := _unseen_loading(t)) is not None}
        if unseen:
            found = await asyncio.to_thread(find_loading, unseen)
            targets = tuple(replace(t, process=found[t.name]) if t.name in found else t for t in targets)
        lives = {t.name: _life(t.engine, t.process) for t in targets if t.process is not None and t.process.cmdline}
        new = {life: t.process for t in targets if (life := lives.get(t.name)) and life not in self._by_life}
        if new:
            read = await asyncio.to_thread(_read_all, new)
            self._by_life.update(read)
        current = set(lives.values())
        self._by_life = {life: s for life, s in self._by_life.items() if life in current}
        names = {t.name for t in targets}
        self._last = {name: s for name, s in self._last.items() if name in names}
        out = []
        for target in targets:
            life = lives.get(target.name)
            if life is not None:
                self._last[target.name] = self._by_life.get(life, {})
            settings = self._last.get(target.name)
            out.append(replace(target, settings=settings) if settings else target)
        return tuple(out)


def _unseen_loading(t: TargetReading) -> int | None:
    """The port of a loading target that may run on this host and whose process the lookup did not find."""
    if t.process is not None or t.state != "loading" or t.pod:
        return None  # a pod's processes come from its cgroups (sources/kubernetes/)
    try:
        return url_port(t.url)
    except ValueError:
        return None


def find_loading(unseen: dict[str, tuple[tuple[str, int], str]]) -> dict[str, ProcessTree]:
    """Target name -> the process of the engine (`unseen`: name -> ((engine, port), URL)) whose command line names that
    port, for targets whose URL is on this host (blocking: lists /proc)."""
    local = {name: want for name, (want, url) in unseen.items() if on_this_host(url)}
    if not local:
        return {}
    by_want: dict[tuple[str, int], EngineProcess] = {}
    for engine in find_engines(simulators=True):
        port = wanted_port(engine, environ(engine.pid))
        if port is not None:
            by_want.setdefault((engine.engine, port), engine)
    out = {}
    for name, want in local.items():
        engine = by_want.get(want)
        if engine is not None and (tree := _tree(engine)) is not None:
            out[name] = tree
    return out


def on_this_host(url: str) -> bool:
    """Whether `url`'s host is this host: a loopback address, localhost, or one of its interfaces' addresses."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if address.is_loopback or address.is_unspecified:
        return True
    return any(a.address.split("%")[0] == str(address) for addrs in psutil.net_if_addrs().values() for a in addrs)


def _tree(engine: EngineProcess) -> ProcessTree | None:
    started = start_time(engine.pid)
    if started is None:
        return None  # gone since the listing
    resident = 0.0
    for pid in engine.pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                resident += int(f.read().split()[1]) * _PAGE_SIZE
        except (OSError, ValueError, IndexError):
            continue  # exited since the listing
    return ProcessTree(engine.pid, engine.pids, resident, started, engine.cmdline)


def _life(engine: str, process: ProcessTree) -> Life:
    return (engine, process.root_pid, process.start_time_seconds)


def _read_all(new: dict[Life, ProcessTree | None]) -> dict[Life, Settings]:
    return {life: read_settings(life[0], life[1], p.cmdline) for life, p in new.items() if p is not None}
