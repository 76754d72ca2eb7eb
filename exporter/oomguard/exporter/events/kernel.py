"""Kernel OOM kills, from /dev/kmsg where readable: the host-memory side of the diagnosis.

Each read of /dev/kmsg returns one record, `PRIORITY,SEQ,USEC,FLAGS;MESSAGE`. The
sequence number of the last record read is the resume position, valid for one boot (the
kernel's boot id is saved beside it: after a reboot the log is read from its beginning).
The kernel writes several records for one kill; kernel_records.py folds them into one
`kernel_oom_kill` event of the host, which carries the victim's pid and memory cgroup so
that the runner can count it for the target it belongs to (kill_owners.py).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from oomguard.common.kinds import KERNEL_OOM_KILL
from oomguard.exporter.events.kernel_records import Kill, KillDedupe, parse
from oomguard.exporter.events.source import POSITIONS, ErrorReport, source_health
from oomguard.exporter.model import HOST, Event, EventSourceHealth, ReadStats

KMSG = "/dev/kmsg"
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def read_boot_id(path: str = BOOT_ID) -> str | None:
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


class KmsgReader:
    """The kernel log's new records, each as (usec, message); resumes after the last sequence number read."""

    def __init__(
        self, path: str = KMSG, *, state: dict | None = None, from_start: bool = False, boot_id_path: str = BOOT_ID
    ) -> None:
        saved = state if isinstance(state, dict) else {}
        self.path = path
        self.stats = ReadStats()
        self.boot_id = read_boot_id(boot_id_path)
        last_seq = saved.get("last_seq")
        self.last_seq: int | None = last_seq if isinstance(last_seq, int) and last_seq >= 0 else None
        self._from_start = from_start
        rebooted = saved.get("boot_id") is not None and saved.get("boot_id") != self.boot_id
        if rebooted:
            # Another boot's position means nothing here; what this boot logged before we started was never read.
            self.last_seq = None
            self._from_start = True
        self.kills = saved.get("kills") if not rebooted and isinstance(saved.get("kills"), list) else None
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

    def poll(self) -> list[tuple[int, str]]:
        fd = self._open()
        if fd is None:
            return []
        records = []
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
                seq, usec = int(fields[1]), int(fields[2])
            except (IndexError, ValueError):
                self.stats.lines_malformed += 1
                continue
            if self.last_seq is not None and seq <= self.last_seq:
                continue  # already read before the exporter restarted
            self.last_seq = seq
            self.stats.lines_read += 1
            self.stats.bytes_read += len(record)
            records.append((usec, message.splitlines()[0] if message else ""))
        return records

    def state(self) -> dict:
        return {"last_seq": self.last_seq, "boot_id": self.boot_id}

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class KernelLogSource:
    """The host's kernel OOM kills: one event per kill, however many records the kernel wrote for it."""

    kinds: tuple[str, ...] = (KERNEL_OOM_KILL,)

    def __init__(self, reader: KmsgReader) -> None:
        self.target = HOST
        self.name = f"kernel:{reader.path}"
        self.reader = reader
        self.dedupe = KillDedupe(reader.kills)
        self._report = ErrorReport()

    def poll(self, now: float) -> list[Event]:
        records = self.reader.poll()
        self._report(self, self.reader.stats.last_error)
        kills: list[Kill] = []
        for usec, message in records:
            if (record := parse(message, usec)) is not None and (kill := self.dedupe.feed(record)) is not None:
                kills.append(kill)
        # Built after the whole read: a later record of the same kill may have told its cgroup.
        return [Event(KERNEL_OOM_KILL, now, pid=k.victim, cgroup=k.memcg) for k in kills]

    def health(self) -> EventSourceHealth:
        return source_health(self, self.reader.stats)

    def state(self) -> dict[str, Any]:
        return {POSITIONS: {**self.reader.state(), "kills": self.dedupe.state()}}

    def close(self) -> list[Event]:
        self.reader.close()
        return []
