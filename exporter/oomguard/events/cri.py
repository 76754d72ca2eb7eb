"""Kubernetes CRI container log lines, as the container runtime writes them.

`/var/log/pods/<ns>_<pod>_<uid>/<container>/<n>.log`, one record per line:

    2024-05-01T12:00:00.123456789Z stdout F message text

timestamp (RFC 3339, nanoseconds), stream (`stdout` or `stderr`), tags separated by
`:` whose first is `F` (full: the message ends here) or `P` (partial: the runtime cut
a long line, usually at 16 KiB; the message goes on in the next record of the same
stream, up to its `F`), then one space and the message. Partial records are joined
per stream, because stdout and stderr records interleave. A joined message is capped
at `max_message_bytes` (its head is kept, `truncated` counts the cut ones).

Lines that are not CRI records are returned as they are and counted in `malformed`:
a wrong format never loses a line. One decoder per log file (partial records never
span two containers' files).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_MESSAGE_BYTES = 1024 * 1024
STREAMS = ("stdout", "stderr")
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:\d{2})\Z")


@dataclass
class _Pending:
    parts: list[str] = field(default_factory=list)
    size: int = 0  # UTF-8 bytes
    truncated: bool = False


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", errors="replace"))


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
    def __init__(self, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.max_message_bytes = max(1, max_message_bytes)
        self.malformed = 0  # lines passed through as they are
        self.truncated = 0  # joined messages cut at max_message_bytes
        self._pending: dict[str, _Pending] = {}  # stream -> partial records waiting for their F

    def feed(self, line: str) -> list[str]:
        """The complete messages this line ends: none, one, or the line itself if malformed."""
        record = parse(line)
        if record is None:
            self.malformed += 1
            return [line]
        stream, tag, message = record
        if tag == "P":
            self._append(self._pending.setdefault(stream, _Pending()), message)
            return []
        pending = self._pending.pop(stream, None)
        if pending is None:
            if len(message) * 4 <= self.max_message_bytes or _utf8_len(message) <= self.max_message_bytes:
                return [message]
            pending = _Pending()
        self._append(pending, message)
        return [self._join(pending)]

    def flush(self) -> list[str]:
        """Messages whose final record never came (their file ended): returned as they are."""
        out = [self._join(p) for p in self._pending.values()]
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
            self.truncated += 1
        return "".join(pending.parts)
