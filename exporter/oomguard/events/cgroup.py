"""Kernel OOM kills inside one cgroup (v2): the `oom_kill` counter of its memory.events."""

from __future__ import annotations

from pathlib import Path


class CgroupOomReader:
    """New OOM kills since the last read; the counter's last value is the resume position."""

    def __init__(self, cgroup_dir: str, *, state: dict | None = None) -> None:
        self.path = Path(cgroup_dir) / "memory.events"
        self.last: int | None = (state or {}).get("oom_kill")
        self.read_errors = 0
        self.last_error = ""

    def read_new(self) -> int:
        try:
            text = self.path.read_text()
        except OSError as exc:
            self.read_errors += 1
            self.last_error = f"cannot read {self.path}: {exc.strerror} (is it a cgroup v2 directory?)"
            return 0
        values = dict(line.split(maxsplit=1) for line in text.splitlines() if " " in line)
        try:
            current = int(values["oom_kill"])
        except (KeyError, ValueError):
            self.read_errors += 1
            self.last_error = f"{self.path} has no oom_kill line (kernel older than 4.13?)"
            return 0
        if self.last is None or current < self.last:
            # First read (we count from now on) or a new cgroup of the same name: a new baseline.
            self.last = current
            return 0
        new, self.last = current - self.last, current
        return new

    def state(self) -> dict:
        return {"oom_kill": self.last}
