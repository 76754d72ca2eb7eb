"""Kernel OOM kills inside one cgroup: the `oom_kill` counter of its memory.events (cgroup v2) or of its
memory.oom_control (cgroup v1's memory controller, kernel 4.13 on). Whichever of the two files the
directory holds is read; `check-config` says which (`counter_file`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oomguard.common.kinds import CGROUP_OOM_KILL
from oomguard.exporter.events.source import POSITIONS, ErrorReport, source_health
from oomguard.exporter.model import Event, EventSourceHealth, ReadStats

V2_FILE = "memory.events"
V1_FILE = "memory.oom_control"
MAX_BYTES = 4096  # both files are a few short lines


def counter_file(cgroup_dir: str) -> str | None:
    """The file of the directory that holds its oom_kill counter: v2's memory.events, else v1's
    memory.oom_control; None when it has neither (not a cgroup, or no memory controller)."""
    for name in (V2_FILE, V1_FILE):
        if (path := Path(cgroup_dir) / name).is_file():
            return str(path)
    return None


class CgroupOomReader:
    """New OOM kills since the last read; the counter's last value is the resume position."""

    def __init__(self, cgroup_dir: str, *, state: dict | None = None) -> None:
        self.directory = cgroup_dir
        self.path = Path(counter_file(cgroup_dir) or Path(cgroup_dir) / V2_FILE)
        last = (state or {}).get("oom_kill") if isinstance(state, dict) else None
        self.last: int | None = last if isinstance(last, int) and last >= 0 else None
        self.stats = ReadStats()  # only its read errors: the file is read whole each time

    def read_new(self) -> int:
        if not self.path.exists() and (found := counter_file(self.directory)) is not None:
            self.path = Path(found)  # the cgroup made since we started, or the host moved to the other version
        try:
            with self.path.open("rb") as f:
                text = f.read(MAX_BYTES).decode("ascii", errors="replace")
        except OSError as exc:
            self.stats.read_errors += 1
            self.stats.last_error = (
                f"cannot read {self.path}: {exc.strerror} (is {self.directory} a cgroup with the memory controller?)"
            )
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
