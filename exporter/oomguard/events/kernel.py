"""Kernel OOM kills, from /dev/kmsg where readable: the host-memory side of the diagnosis.

Each read of /dev/kmsg returns one record, `PRIORITY,SEQ,USEC,FLAGS;MESSAGE`. The
sequence number of the last record read is the resume position. Each OOM-kill line
is one `kernel_oom_kill` event of the host: the kernel prints one per kill.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from oomguard.events.kinds import KERNEL_OOM_KILL
from oomguard.events.source import POSITIONS, ErrorReport, source_health
from oomguard.model import HOST, Event, EventSourceHealth, ReadStats

KMSG = "/dev/kmsg"
# "Out of memory: Killed process 1234 (python3)", "oom-kill:constraint=...", "Memory cgroup out of memory: Killed ..."
OOM_KILL_MARKERS = ("Killed process", "oom-kill:")


class KmsgReader:
    def __init__(self, path: str = KMSG, *, state: dict | None = None, from_start: bool = False) -> None:
        self.path = path
        self.stats = ReadStats()
        self.last_seq: int | None = (state or {}).get("last_seq")
        self._from_start = from_start
        self._fd: int | None = None

    def _open(self) -> int | None:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as exc:
                self.stats.read_errors += 1
                self.stats.last_error = f"cannot read {self.path}: {exc.strerror} (kernel OOM kills are not counted)"
                return None
            if self.last_seq is None and not self._from_start:
                os.lseek(self._fd, 0, os.SEEK_END)  # first start: only what happens from now on
        return self._fd

    def poll(self) -> list[str]:
        fd = self._open()
        if fd is None:
            return []
        lines = []
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # the ring buffer overwrote records we had not read
                    self.stats.read_errors += 1
                    self.stats.last_error = "kernel log records were overwritten before being read"
                    continue
                self.stats.read_errors += 1
                self.stats.last_error = str(exc)
                break
            if not record:
                break
            text = record.decode("utf-8", errors="replace")
            header, _, message = text.partition(";")
            fields = header.split(",")
            try:
                seq = int(fields[1])
            except (IndexError, ValueError):
                continue
            if self.last_seq is not None and seq <= self.last_seq:
                continue  # already read before the exporter restarted
            self.last_seq = seq
            self.stats.lines_read += 1
            self.stats.bytes_read += len(record)
            lines.append(message.splitlines()[0] if message else "")
        return lines

    def state(self) -> dict:
        return {"last_seq": self.last_seq}

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def is_oom_kill(line: str) -> bool:
    return any(marker in line for marker in OOM_KILL_MARKERS) and ("emory" in line or "oom" in line)


class KernelLogSource:
    """The host's kernel OOM kills: one event per OOM-kill line of the kernel log."""

    kinds: tuple[str, ...] = (KERNEL_OOM_KILL,)

    def __init__(self, reader: KmsgReader) -> None:
        self.target = HOST
        self.name = f"kernel:{reader.path}"
        self.reader = reader
        self._report = ErrorReport()

    def poll(self, now: float) -> list[Event]:
        lines = self.reader.poll()
        self._report(self, self.reader.stats.last_error)
        return [Event(KERNEL_OOM_KILL, now) for line in lines if is_oom_kill(line)]

    def health(self) -> EventSourceHealth:
        return source_health(self, self.reader.stats)

    def state(self) -> dict[str, Any]:
        return {POSITIONS: self.reader.state()}

    def close(self) -> list[Event]:
        self.reader.close()
        return []
