"""Line assembly for the log follower (`file_follower.py`): the bytes read from one file in, its lines out.

Complete lines only, without the newline, decoded as UTF-8 with errors="replace".
A partial last line is buffered until its newline arrives; a file closed after a
rotation returns its unfinished line as it is (`PendingLine.flush`), never drops it. A
line longer than `max_line_bytes` keeps its head, the rest is skipped as it is read, and
it counts in `lines_truncated`: at most about `max_line_bytes` is held per file.

Two flags skip bytes instead of returning them:

* `discard`: on the very first start (no state), files that already exist are read from
  their end; the unfinished line at their end, if any, is skipped up to its newline.
* `skip_nul`: after a truncation (copy-truncate), writers without O_APPEND leave a sparse
  hole of NUL bytes at the start of the file: leading NULs are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from oomguard.exporter.model import ReadStats


@dataclass
class PendingLine:
    """The unfinished line of one file: saved with its offset in the follower's state."""

    partial: bytearray = field(default_factory=bytearray)  # head of the unfinished line, <= max_line_bytes
    overflow: bool = False  # the unfinished line is longer than max_line_bytes: its rest is skipped
    discard: bool = False  # skip up to the next newline without returning (start at the end of a file)
    skip_nul: bool = False  # after a truncation: skip the NUL hole a writer without O_APPEND leaves

    def feed(self, data: bytes, lines: list[str], max_line: int, stats: ReadStats) -> None:
        """Append the complete lines `data` ends to `lines`; keep the unfinished rest."""
        if self.skip_nul:
            stripped = data.lstrip(b"\0")
            if not stripped:
                return
            self.skip_nul = False
            data = stripped
        pieces = data.split(b"\n")  # a chunk is at most file_follower._CHUNK bytes: bounded copies
        rest = pieces.pop()  # after the last newline: the start of the next unfinished line
        for piece in pieces:
            if not self.partial and not self.discard and len(piece) <= max_line:
                lines.append(piece.decode("utf-8", errors="replace"))  # the common case: a whole line
                stats.lines_read += 1
            else:
                self._add(piece, max_line)
                self._emit(lines, stats)
        if rest:
            self._add(rest, max_line)

    def flush(self, lines: list[str], stats: ReadStats) -> None:
        """The file ends without a newline: return its unfinished line as it is."""
        if self.partial or self.overflow:
            self._emit(lines, stats)
        self.discard = False

    def _add(self, piece: bytes, max_line: int) -> None:
        if self.discard or self.overflow:
            return
        room = max_line - len(self.partial)
        if len(piece) > room:
            self.partial += memoryview(piece)[:room]
            self.overflow = True
        else:
            self.partial += piece

    def _emit(self, lines: list[str], stats: ReadStats) -> None:
        if self.discard:
            self.discard = False
        else:
            lines.append(self.partial.decode("utf-8", errors="replace"))
            stats.lines_read += 1
            if self.overflow:
                stats.lines_truncated += 1
        self.partial = bytearray()
        self.overflow = False


__all__ = ["PendingLine"]
