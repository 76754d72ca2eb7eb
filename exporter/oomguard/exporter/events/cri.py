"""Kubernetes CRI container log lines, as the container runtime writes them.

`/var/log/pods/<ns>_<pod>_<uid>/<container>/<n>.log`, one record per line:

    2024-05-01T12:00:00.123456789Z stdout F message text

timestamp (RFC 3339, nanoseconds), stream (`stdout` or `stderr`), tags separated by
`:` whose first is `F` (full: the message ends here) or `P` (partial: the runtime cut
a long line, usually at 16 KiB; the message goes on in the next record of the same
stream, up to its `F`), then one space and the message. Partial records are joined
per stream, because stdout and stderr records interleave. A joined message is capped
at `max_message_bytes` (its head is kept, `lines_truncated` counts the cut ones).

Lines that are not CRI records are returned as they are and counted in
`lines_malformed`: a wrong format never loses a line. One decoder per log file and
its successors after the kubelet's rotations (partial records never span two
containers' files); `PodLogReader` keeps them, and returns a message whose final
record never came as it is once its file is let go for good, and on close.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from oomguard.exporter.events.file_follower import FileFollower
from oomguard.exporter.model import ReadStats

MAX_MESSAGE_BYTES = 1024 * 1024
STREAMS = ("stdout", "stderr")
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:\d{2})\Z")


@dataclass
class _Pending:
    parts: list[str] = field(default_factory=list)
    size: int = 0  # UTF-8 bytes
    truncated: bool = False
    stamp: float | None = None  # its first record's time


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", errors="replace"))


def stamp(timestamp: str) -> float | None:
    """A record's RFC 3339 time (`2024-05-01T12:00:00.123456789Z`), in Unix seconds (to the microsecond)."""
    try:
        return datetime.fromisoformat(timestamp).timestamp()
    except ValueError:
        return None


def parse(line: str) -> tuple[str, str, str] | None:
    """(stream, tag, message) of a CRI record, or None when `line` is not one."""
    fields = line.split(" ", 3)
    if len(fields) < 3:
        return None
    timestamp, stream, tags = fields[0], fields[1], fields[2]
    if stream not in STREAMS or not _TIMESTAMP.match(timestamp):
        return None
    tag = tags.split(":", 1)[0]
    if tag not in ("F", "P"):
        return None
    return stream, tag, fields[3] if len(fields) == 4 else ""


class CriDecoder:
    def __init__(self, max_message_bytes: int = MAX_MESSAGE_BYTES, *, stats: ReadStats | None = None) -> None:
        self.max_message_bytes = max(1, max_message_bytes)
        # lines_malformed: lines passed through as they are; lines_truncated: messages cut at max_message_bytes.
        self.stats = stats if stats is not None else ReadStats()
        self._pending: dict[str, _Pending] = {}  # stream -> partial records waiting for their F

    def feed(self, line: str) -> list[str]:
        """The complete messages this line ends: none, one, or the line itself if malformed."""
        return [message for message, _ in self.feed_stamped(line)]

    def feed_stamped(self, line: str) -> list[tuple[str, float | None]]:
        """`feed`, each message with its time: its first record's (None for a malformed line)."""
        record = parse(line)
        if record is None:
            self.stats.lines_malformed += 1
            return [(line, None)]
        stream, tag, message = record
        if tag == "P":
            pending = self._pending.get(stream)
            if pending is None:
                pending = self._pending[stream] = _Pending(stamp=stamp(line.split(" ", 1)[0]))
            self._append(pending, message)
            return []
        pending = self._pending.pop(stream, None)
        if pending is None:
            at = stamp(line.split(" ", 1)[0])
            if len(message) * 4 <= self.max_message_bytes or _utf8_len(message) <= self.max_message_bytes:
                return [(message, at)]
            pending = _Pending(stamp=at)
        self._append(pending, message)
        return [(self._join(pending), pending.stamp)]

    def flush(self) -> list[str]:
        """Messages whose final record never came (their file ended): returned as they are."""
        return [message for message, _ in self.flush_stamped()]

    def flush_stamped(self) -> list[tuple[str, float | None]]:
        out = [(self._join(p), p.stamp) for p in self._pending.values()]
        self._pending.clear()
        return out

    def _append(self, pending: _Pending, message: str) -> None:
        if pending.truncated:
            return
        size = _utf8_len(message)
        room = self.max_message_bytes - pending.size
        if size > room:
            # Keep the head; errors="ignore" drops a character cut in half at the end.
            message = message.encode("utf-8", errors="replace")[:room].decode("utf-8", errors="ignore")
            size = room
            pending.truncated = True
        pending.parts.append(message)
        pending.size += size

    def _join(self, pending: _Pending) -> str:
        if pending.truncated:
            self.stats.lines_truncated += 1
        return "".join(pending.parts)


class PodLogReader:
    """Kubernetes container logs: CRI-format files under /var/log/pods, rotated by the kubelet."""

    def __init__(self, pattern: str, *, state: dict | None = None, from_start: bool = False) -> None:
        # The kubelet's own folders (a tenant writes none of them); with cri-dockerd each log is a link.
        self.follower = FileFollower(pattern, state=state, from_start=from_start, follow_symlinks=True)
        self.stats = self.follower.stats  # the decoders count their malformed and truncated lines in it
        # One per file, by the name it was first seen at: a record cut by a rotation goes on in its successor.
        self.decoders: dict[str, CriDecoder] = {}
        self.stamps: list[float | None] = []  # the time of each message the last poll (or close) returned

    def poll(self) -> list[str]:
        out: list[tuple[str, float | None]] = []
        for path, lines in self.follower.poll_by_file():
            decoder = self.decoders.get(path) or self.decoders.setdefault(path, CriDecoder(stats=self.stats))
            for line in lines:
                out.extend(decoder.feed_stamped(line))
        if self.decoders:
            # A file let go (rotated away and drained, or deleted) with no successor: nothing will finish
            # its partial record, which is returned as it is.
            followed = self.follower.streams()
            for path in [p for p in self.decoders if p not in followed]:
                out.extend(self.decoders.pop(path).flush_stamped())
        return self._split(out)

    def _split(self, out: list[tuple[str, float | None]]) -> list[str]:
        self.stamps = [at for _, at in out]
        return [message for message, _ in out]

    def state(self) -> dict:
        return self.follower.state()

    def close(self) -> list[str]:
        """The partial records held: the saved position is past them, so they are returned now, not lost."""
        self.follower.close()
        held = [item for decoder in self.decoders.values() for item in decoder.flush_stamped()]
        self.decoders.clear()
        return self._split(held)
