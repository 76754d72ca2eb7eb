"""One file a log follower (`file_follower.py`) follows: what is known of it, its saved form, opening it.

A file is known by (st_dev, st_ino), never by name. Its entry in `FileFollower.state()`
keeps the offset, the unfinished line (`lines.PendingLine`) and the fingerprint (the
last bytes before the offset), plus the names it was matched at and the directory it
resolved to: where `find_by_inode` looks for it after a restart, once it has left the
pattern (rotation by rename keeps it in its directory: `app.log.1`).

Files are opened non-blocking (a fifo must never block the follower) and only when they
are regular files (`open_regular`); unless the follower follows symbolic links, with
O_NOFOLLOW, so that a link swapped in between the scan and the open is not opened.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import stat
from dataclasses import dataclass, field

from oomguard.common.excerpt import excerpt
from oomguard.exporter.events.lines import PendingLine
from oomguard.exporter.events.scan import Key, NotRegular, kind

STATE_VERSION = 1
NAMES = 4  # the names kept per file
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


@dataclass
class FollowedFile:
    dev: int
    ino: int
    path: str  # where it was last matched
    names: list[str] = field(default_factory=list)  # the paths it was matched at, latest last (a few)
    offset: int = 0  # bytes consumed, the partial line included
    line: PendingLine = field(default_factory=PendingLine)  # the unfinished line
    tail: bytes = b""  # the last bytes before `offset`: the fingerprint
    real_dir: str = ""  # directory of the resolved path: where to look for it by inode after a restart
    fd: int | None = None
    size: int = 0  # size at the last read
    rotated: bool = False  # no longer matched by the pattern: drained, then closed
    idle_since: float = 0.0

    @property
    def key(self) -> Key:
        return (self.dev, self.ino)

    @property
    def stream_name(self) -> str:
        """The name it had when first seen: what `poll_by_file` gives its lines under."""
        return self.names[0] if self.names else self.path

    def rename(self, path: str) -> None:
        self.path = path
        if path not in self.names:
            self.names.append(path)
            del self.names[:-NAMES]

    def restart(self) -> None:
        """Truncated (copy-truncate): read it again from the start, past the NUL hole if any."""
        self.offset = 0
        self.tail = b""
        self.line = PendingLine(skip_nul=True)

    def close_fd(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None

    def to_state(self) -> dict:
        return {
            "dev": self.dev,
            "ino": self.ino,
            "path": self.path,
            "names": self.names,
            "dir": self.real_dir,
            "offset": self.offset,
            "partial": base64.b64encode(bytes(self.line.partial)).decode("ascii"),
            "overflow": self.line.overflow,
            "discard": self.line.discard,
            "skip_nul": self.line.skip_nul,
            "tail": base64.b64encode(self.tail).decode("ascii"),
        }

    @classmethod
    def from_state(cls, entry: dict, max_line_bytes: int) -> FollowedFile:
        """Raises TypeError, ValueError, KeyError, AttributeError or binascii.Error on a bad entry."""
        f = cls(
            dev=int(entry["dev"]),
            ino=int(entry["ino"]),
            path=str(entry["path"]),
            names=[str(name) for name in entry.get("names", [entry["path"]])][-NAMES:],
            offset=int(entry["offset"]),
            line=PendingLine(
                partial=bytearray(base64.b64decode(entry.get("partial", ""), validate=True)),
                overflow=bool(entry.get("overflow", False)),
                discard=bool(entry.get("discard", False)),
                skip_nul=bool(entry.get("skip_nul", False)),
            ),
            tail=base64.b64decode(entry.get("tail", ""), validate=True),
            real_dir=str(entry.get("dir", "")),
        )
        if f.offset < 0:
            raise ValueError(f"negative offset for {excerpt(f.path)}")
        del f.line.partial[max_line_bytes:]
        return f


def open_regular(path: str, *, follow_symlinks: bool = True) -> tuple[int, os.stat_result]:
    flags = _OPEN_FLAGS if follow_symlinks else _OPEN_FLAGS | os.O_NOFOLLOW
    fd = os.open(path, flags)  # O_NONBLOCK: a fifo must never block us
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(errno.EINVAL, f"{kind(st.st_mode)}, not followed")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def find_by_inode(f: FollowedFile) -> tuple[int, str] | None:
    """Look for a rotated-away file by inode in the directories it was in: (descriptor, path)."""
    for directory in dict.fromkeys(d for d in (os.path.dirname(f.path), f.real_dir) if d):
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    try:
                        if entry.inode() != f.ino or not entry.is_file(follow_symlinks=False):
                            continue
                        fd, st = open_regular(entry.path, follow_symlinks=False)  # a regular file, as checked
                    except OSError:
                        continue
                    if (st.st_dev, st.st_ino) == f.key:
                        return fd, entry.path
                    os.close(fd)
        except OSError:
            continue
    return None


__all__ = ["NAMES", "STATE_VERSION", "FollowedFile", "find_by_inode", "open_regular"]
