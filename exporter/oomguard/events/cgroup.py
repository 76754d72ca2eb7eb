"""Kernel OOM kills inside one cgroup (v2): the `oom_kill` counter of its memory.events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oomguard.events.kinds import CGROUP_OOM_KILL
from oomguard.events.source import POSITIONS, ErrorReport, source_health
from oomguard.model import Event, EventSourceHealth, ReadStats


class CgroupOomReader:
    """New OOM kills since the last read; the counter's last value is the resume position."""

    def __init__(self, cgroup_dir: str, *, state: dict | None = None) -> None:
        self.directory = cgroup_dir
        self.path = Path(cgroup_dir) / "memory.events"
        self.last: int | None = (state or {}).get("oom_kill")
        self.stats = ReadStats()  # only its read errors: the file is read whole each time

    def read_new(self) -> int:
        try:
            text = self.path.read_text()
        except OSError as exc:
            self.stats.read_errors += 1
            self.stats.last_error = f"cannot read {self.path}: {exc.strerror} (is it a cgroup v2 directory?)"
            return 0
        values = dict(line.split(maxsplit=1) for line in text.splitlines() if " " in line)
        try:
            current = int(values["oom_kill"])
        except (KeyError, ValueError):
            self.stats.read_errors += 1
            self.stats.last_error = f"{self.path} has no oom_kill line (kernel older than 4.13?)"
            return 0
        if self.last is None or current < self.last:
            # First read (we count from now on) or a new cgroup of the same name: a new baseline.
            self.last = current
            return 0
        new, self.last = current - self.last, current
        return new

    def state(self) -> dict:
        return {"oom_kill": self.last}


class CgroupSource:
    """A target's cgroup: each poll's new kills are one event whose count is their number."""

    kinds: tuple[str, ...] = (CGROUP_OOM_KILL,)

    def __init__(self, target: str, reader: CgroupOomReader) -> None:
        self.target = target
        self.name = f"cgroup:{reader.directory}"
        self.reader = reader
        self._report = ErrorReport()

    def poll(self, now: float) -> list[Event]:
        new = self.reader.read_new()
        self._report(self, self.reader.stats.last_error)
        return [Event(CGROUP_OOM_KILL, now, count=new)] if new else []

    def health(self) -> EventSourceHealth:
        return source_health(self, self.reader.stats)

    def state(self) -> dict[str, Any]:
        return {POSITIONS: self.reader.state()}

    def close(self) -> list[Event]:
        return []
