"""Lines of one systemd unit from the journal, resumable by cursor.

Runs `journalctl -u UNIT -o json --after-cursor=C` on each poll (no long-lived
`-f` child to babysit); the cursor of the last entry read is the read position
kept in the state file, so a restart of the exporter resumes where it stopped.
"""

from __future__ import annotations

import json
import logging
import subprocess
from typing import Any

from oomguard.exporter.model import ReadStats

log = logging.getLogger(__name__)


def message_text(entry: dict[str, Any]) -> str:
    """MESSAGE is a string, or a list of byte values when it is not valid UTF-8 text."""
    message = entry.get("MESSAGE", "")
    if isinstance(message, list):
        return bytes(b & 0xFF for b in message if isinstance(b, int)).decode("utf-8", errors="replace")
    return message if isinstance(message, str) else ""


def realtime(entry: dict[str, Any]) -> float | None:
    """When the journal received the entry (`__REALTIME_TIMESTAMP`, microseconds since the epoch), in seconds."""
    value = entry.get("__REALTIME_TIMESTAMP")
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
        return int(value) / 1e6
    return None


def parse_json_lines(
    output: str, stats: ReadStats, stamps: list[float | None] | None = None
) -> tuple[list[str], str | None]:
    """Messages and the last cursor from `journalctl -o json` output; bad lines counted, skipped. `stamps`, when
    given, gets each message line's entry time."""
    lines: list[str] = []
    cursor = None
    for raw in output.splitlines():
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw)
        except json.JSONDecodeError:
            stats.read_errors += 1
            stats.last_error = f"journalctl printed a line that is not JSON: {raw[:80]!r}"
            continue
        text = message_text(entry).splitlines() or [""]
        lines.extend(text)
        if stamps is not None:
            stamps.extend([realtime(entry)] * len(text))
        cursor = entry.get("__CURSOR", cursor)
        stats.bytes_read += len(raw)
    stats.lines_read += len(lines)
    return lines, cursor


class JournaldReader:
    def __init__(
        self, unit: str, *, state: dict | None = None, from_start: bool = False, binary: str = "journalctl"
    ) -> None:
        self.unit = unit
        self.binary = binary
        self.stats = ReadStats()
        self.stamps: list[float | None] = []  # the entry time of each line the last poll returned
        cursor = state.get("cursor") if isinstance(state, dict) else None
        self.cursor: str | None = cursor if isinstance(cursor, str) else None  # a wrong type: start afresh
        self._from_start = from_start or self.cursor is not None

    def _run(self, *args: str) -> str | None:
        try:
            result = subprocess.run(
                [self.binary, "-u", self.unit, "-o", "json", "--no-pager", *args],
                capture_output=True, text=True, timeout=10, errors="replace",
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.stats.read_errors += 1
            self.stats.last_error = f"journalctl failed: {exc}"
            return None
        if result.returncode != 0:
            self.stats.read_errors += 1
            self.stats.last_error = f"journalctl exited {result.returncode}: {result.stderr.strip()[:200]}"
            return None
        return result.stdout

    def poll(self) -> list[str]:
        self.stamps = []
        if self.cursor is None and not self._from_start:
            # First start: begin at the end, like the file follower. An empty journal for this unit
            # leaves no cursor: everything from now on is read. A failed probe is tried again.
            output = self._run("-n", "1")
            if output is not None:
                _, self.cursor = parse_json_lines(output, ReadStats())
                self._from_start = True
            return []
        args = ("--after-cursor", self.cursor) if self.cursor else ()
        output = self._run(*args)
        if output is None:
            return []
        lines, cursor = parse_json_lines(output, self.stats, self.stamps)
        self.cursor = cursor or self.cursor
        return lines

    def state(self) -> dict:
        return {"cursor": self.cursor}

    def close(self) -> None:
        pass  # nothing held: each poll is one journalctl run
