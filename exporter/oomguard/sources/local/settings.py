"""The engines' settings as started, read from each local target's process (its command line, its environment
for the engines that read one, its installed version for the defaults that depend on it).

Only a process whose command line is the engine's (engines/<name>/cmdline.py `matches`) is read: a docker-proxy
or a wrapper listening for it has no flags of its own. One read per engine life (a process's pid and start
time): the command line of a running process does not change. The reads of /proc run in a worker thread. A
target whose process is gone keeps its last settings: what it was started with is what an OOM's diagnosis
needs, and it is the same life until another starts."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from oomguard.engines import ENGINES
from oomguard.engines.cmdline import Cmdline, Settings
from oomguard.model import ProcessTree, TargetReading
from oomguard.sources.local.cmdline import environ, installed_version

Life = tuple[str, int, float]  # (engine, root pid, start time)


def read_settings(engine: str, pid: int, argv: Cmdline) -> Settings:
    """One engine process's settings (blocking: reads /proc)."""
    plugin = ENGINES[engine]
    if plugin.settings is None or plugin.matches is None or not plugin.matches(argv):
        return {}  # not the engine's own command line (a proxy, a wrapper): its flags would be no one's
    version = installed_version(pid, argv, plugin.distributions) if plugin.distributions else None
    return plugin.settings(argv, version, environ(pid))


class SettingsReader:
    def __init__(self) -> None:
        self._by_life: dict[Life, Settings] = {}
        self._last: dict[str, Settings] = {}  # by target name: its last life's

    async def add(self, targets: tuple[TargetReading, ...]) -> tuple[TargetReading, ...]:
        """The targets with their settings, where their process on this host is known (now or before)."""
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


def _life(engine: str, process: ProcessTree) -> Life:
    return (engine, process.root_pid, process.start_time_seconds)


def _read_all(new: dict[Life, ProcessTree | None]) -> dict[Life, Settings]:
    return {life: read_settings(life[0], life[1], p.cmdline) for life, p in new.items() if p is not None}
