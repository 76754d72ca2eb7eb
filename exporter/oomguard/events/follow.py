"""Follow log files like `tail -F`: by inode, across rotations and exporter restarts.

Blocking and plain Python (os.stat/os.pread/os.scandir): `FileFollower.poll` runs in a
worker thread, called every half second or so. It never raises: every OSError is
counted in `stats.read_errors` (once per cause, not once per poll) and the other files
go on.

How a file is recognised
------------------------
Each regular file matched by the pattern is followed independently and identified by
(st_dev, st_ino), never by name. Besides the offset, a small fingerprint is kept: the
last bytes before the offset (`_TAIL_BYTES`). Bytes before the offset never change in
an append-only log, so when they differ the file was truncated and written again
(copy-truncate, then growth past our offset before we looked) or the inode number
was reused by another file while we were down: it is read again from the start.

What each rotation mode does, and what can be lost
--------------------------------------------------
* Rename (logrotate `create`, kubelet): the old inode leaves the pattern. Its
  descriptor stays open and is drained to EOF, including lines written to it after
  the rename, then kept open while it still grows, and closed once it has been idle
  for `drain_grace_seconds`; the new file is read from its start. Nothing is lost
  while running. A pattern that also matches the renamed file (`app.log*`) sees the
  same inode under a new name: it goes on from its offset, never from the start.
  A file created *and* rotated away between two polls is never seen (lost: polling).
  Order is kept across the rotation: the new file waits while the old one still has
  unread bytes (a file now at a name an older file with a backlog had is its successor).
* Copy-truncate: same inode, size below our offset (or fingerprint changed): read
  again from 0. Lines written between our last read and the truncation are lost:
  they exist only in the copy, a different file. An unfinished line we held is
  returned as it is. A pattern that matches the copies
  (`app.log*`) reads every copy as a new file, i.e. everything twice: with
  copy-truncate, follow only the live name. Writers without O_APPEND leave a sparse
  hole of NUL bytes at the start after the truncation: leading NULs are skipped.
* Delete and recreate: like rename (the open descriptor keeps the deleted inode
  readable until it is closed). Nothing lost while running, except, as with rename,
  a file created and deleted between two polls.
* A file that vanishes and does not come back is drained and closed like a rotated
  one. This is counted as NO read error: it is what every rotation looks like, and
  counting it would flag every healthy rotation.

Exporter restarts (`state()` then `FileFollower(..., state=...)`)
------------------------------------------------------------------
A known inode still matched goes on at its saved offset, with its saved partial line.
A known inode no longer matched is looked for by inode number in the directory it was
in (rotation by rename keeps it there: `app.log.1`, `0.log.20240501-120000`) and
drained from its offset. If it is gone (deleted, compressed, moved elsewhere) the
bytes it received after our saved offset are lost: no name and no descriptor lead to
them any more; its saved partial line is returned as it is. A deleted file, or one
truncated by copy-truncate while we were down, likewise loses what it got after our
offset (the truncated one is then read again from 0). Files matched at resume but
unknown to the state were created while we were down and are read from the start,
oldest modification time first (on a tie, the longer name first: `app.log.1` before
`app.log`). With a pattern that does not match rotated names, a file created and
rotated away while we were down is never seen: its lines are lost.

Lines
-----
Complete lines only, without the newline, decoded as UTF-8 with errors="replace".
A partial last line is buffered until its newline arrives; a file closed after a
rotation returns its unfinished line as it is, never drops it. A line longer
than `max_line_bytes` keeps its head, the rest is skipped as it is read, and it counts
in `lines_truncated`: at most about `max_line_bytes` is held per file. At most
`max_read_bytes` is read per file per poll; `bytes_behind` shows what is left.

On the very first start (no state), files that already exist are read from their end;
the unfinished line at their end, if any, is skipped up to its newline.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import fnmatch
import logging
import os
import re
import stat
import threading
import time
from dataclasses import dataclass, field

from oomguard.model import ReadStats

log = logging.getLogger(__name__)

STATE_VERSION = 1
_CHUNK = 64 * 1024
_TAIL_BYTES = 64
_NAMES = 4
_MAGIC = re.compile(r"[*?[]")
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)

Key = tuple[int, int]


@dataclass
class _File:
    dev: int
    ino: int
    path: str  # where it was last matched
    names: list[str] = field(default_factory=list)  # the paths it was matched at, latest last (a few)
    offset: int = 0  # bytes consumed, the partial line included
    partial: bytearray = field(default_factory=bytearray)  # head of the unfinished line, <= max_line_bytes
    overflow: bool = False  # the unfinished line is longer than max_line_bytes: its rest is skipped
    discard: bool = False  # skip up to the next newline without returning (start at the end of a file)
    skip_nul: bool = False  # after a truncation: skip the NUL hole a writer without O_APPEND leaves
    tail: bytes = b""  # the last bytes before `offset`: the fingerprint
    real_dir: str = ""  # directory of the resolved path: where to look for it by inode after a restart
    fd: int | None = None
    size: int = 0  # size at the last read
    rotated: bool = False  # no longer matched by the pattern: drained, then closed
    idle_since: float = 0.0

    @property
    def key(self) -> Key:
        return (self.dev, self.ino)


class _NotRegular(OSError):
    pass


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a fifo"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


class FileFollower:
    """Follow every regular file matched by `pattern` (a path or a glob, no `**`)."""

    # How long a rotated-away file must stay without new bytes before it is closed: a
    # writer that has not reopened its log yet still writes to the old inode.
    drain_grace_seconds: float = 1.0

    def __init__(
        self,
        pattern: str,
        *,
        state: dict | None = None,
        from_start: bool = False,
        max_line_bytes: int = 1024 * 1024,
        max_read_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self.pattern = pattern
        self.from_start = from_start
        self.max_line_bytes = max(1, int(max_line_bytes))
        self.max_read_bytes = max(1, int(max_read_bytes))
        self.stats = ReadStats()
        self._lock = threading.Lock()
        self._files: dict[Key, _File] = {}  # in discovery order: older files first
        self._started = False  # False: the first poll reads existing files from their end
        self._errors_prev: set[tuple[str, str]] = set()
        self._errors_now: set[tuple[str, str]] = set()
        if state is not None:
            self._load(state)

    # ----------------------------------------------------------------- public

    def poll(self) -> list[str]:
        """All complete new lines (without the newline), oldest file first, in file order."""
        return [line for _, lines in self.poll_by_file() for line in lines]

    def poll_by_file(self) -> list[tuple[str, list[str]]]:
        """Like `poll`, with the lines kept per file: [(path, lines), ...].

        The path is the name the file had when first seen (`app.log` even once it is
        `app.log.1`): a per-file decoder (CRI partial records) kept per path goes on
        across a rotation.
        """
        with self._lock:
            self._errors_now = set()
            try:
                return self._poll()
            except Exception as exc:  # never crash the caller; should not happen
                log.exception("log follower for %s failed", self.pattern)
                self._error(self.pattern, "poll", exc)
                return []
            finally:
                self._errors_prev = self._errors_now

    def state(self) -> dict:
        """JSON-serialisable; pass back as `state=` to resume exactly where this left off."""
        with self._lock:
            return {
                "version": STATE_VERSION,
                "pattern": self.pattern,
                "started": self._started,
                "files": [
                    {
                        "dev": f.dev,
                        "ino": f.ino,
                        "path": f.path,
                        "names": f.names,
                        "dir": f.real_dir,
                        "offset": f.offset,
                        "partial": base64.b64encode(bytes(f.partial)).decode("ascii"),
                        "overflow": f.overflow,
                        "discard": f.discard,
                        "skip_nul": f.skip_nul,
                        "tail": base64.b64encode(f.tail).decode("ascii"),
                    }
                    for f in self._files.values()
                ],
            }

    def close(self) -> None:
        """Close every descriptor. The state is kept: `state()` still works, and a later
        `poll()` reopens the files (as after a restart)."""
        with self._lock:
            for f in self._files.values():
                self._close_fd(f)

    def __enter__(self) -> FileFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        for f in getattr(self, "_files", {}).values():
            if f.fd is not None:
                with contextlib.suppress(OSError):
                    os.close(f.fd)
                f.fd = None

    def open_fds(self) -> int:
        """Descriptors held now (for tests and health pages)."""
        return sum(1 for f in self._files.values() if f.fd is not None)

    def streams(self) -> set[str]:
        """The names `poll_by_file` gives the files followed now. A name leaves the set once its last
        file is let go (rotated away and drained, or gone): nothing more will come under it."""
        with self._lock:
            return {_stream_name(f) for f in self._files.values()}

    # ------------------------------------------------------------------ state

    def _load(self, state: dict) -> None:
        try:
            if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
                raise ValueError(f"unknown state version {state.get('version') if isinstance(state, dict) else None!r}")
            files: dict[Key, _File] = {}
            for entry in state.get("files", []):
                f = _File(
                    dev=int(entry["dev"]),
                    ino=int(entry["ino"]),
                    path=str(entry["path"]),
                    names=[str(name) for name in entry.get("names", [entry["path"]])][-_NAMES:],
                    offset=int(entry["offset"]),
                    partial=bytearray(base64.b64decode(entry.get("partial", ""), validate=True)),
                    overflow=bool(entry.get("overflow", False)),
                    discard=bool(entry.get("discard", False)),
                    skip_nul=bool(entry.get("skip_nul", False)),
                    tail=base64.b64decode(entry.get("tail", ""), validate=True),
                    real_dir=str(entry.get("dir", "")),
                )
                if f.offset < 0:
                    raise ValueError(f"negative offset for {f.path}")
                del f.partial[self.max_line_bytes :]
                files[f.key] = f
            self._files = files
            self._started = bool(state.get("started", True))
        except (TypeError, ValueError, KeyError, AttributeError, binascii.Error) as exc:
            # A state we cannot trust is dropped whole: starting from the end (as on a
            # first start) may miss events; reading everything again would count old
            # ones a second time.
            self._files = {}
            self._started = False
            self.stats.last_error = f"state ignored: {exc}"
            log.warning(
                "log follower for %s: saved state ignored (%s); starting at the end of the files", self.pattern, exc
            )

    # ------------------------------------------------------------------- poll

    def _poll(self) -> list[tuple[str, list[str]]]:
        now = time.monotonic()
        matched, uncertain = self._scan()
        first = not self._started
        self._started = True
        out: list[tuple[str, list[str]]] = []

        # The names of files with a backlog: a file now at one of them is their successor
        # (app.log after app.log became app.log.1) and waits, so that lines keep their order.
        busy: set[str] = set()
        for f in list(self._files.values()):
            hit = matched.pop(f.key, None)
            lines: list[str] = []
            if hit is not None:
                _rename(f, hit[0])
                f.size = hit[1].st_size
                f.rotated = False
            elif not _under(f.path, uncertain) and not f.rotated:
                # Renamed away, deleted, or the link now points elsewhere: drain it.
                f.rotated = True
                f.idle_since = now
                log.debug("%s (inode %d) left the pattern: draining it", f.path, f.ino)
            if f.fd is None and not self._reopen(f, hit, uncertain, lines):
                if lines:
                    out.append((_stream_name(f), lines))
                continue
            if f.path not in busy:
                self._service(f, now, lines)
            if f.fd is not None and f.size > f.offset:
                busy.update(f.names)
            if lines:
                out.append((_stream_name(f), lines))

        # New files; oldest first, so that after several rotations while we were down
        # app.log.2 comes before app.log.1 before app.log.
        for key, (path, st) in sorted(matched.items(), key=_age):
            f = self._open_new(key, path, at_end=first and not self.from_start)
            if f is None:
                continue
            lines = []
            if path in busy:
                f.size = st.st_size
            else:
                self._service(f, now, lines)
            if f.size > f.offset:
                busy.update(f.names)
            if lines:
                out.append((_stream_name(f), lines))

        self.stats.bytes_behind = sum(max(0, f.size - f.offset) for f in self._files.values() if f.fd is not None)
        return out

    def _service(self, f: _File, now: float, lines: list[str]) -> None:
        """Read what is new in one open file; close it when it is rotated away and done."""
        try:
            got, at_eof = self._read(f, lines)
        except OSError as exc:
            self._error(f.path, "read", exc)
            if exc.errno in (errno.EBADF, errno.ESTALE):
                self._close_fd(f)  # reopened by the next poll if it is still there
            return
        if got:
            f.idle_since = now
        if f.rotated and at_eof and now - f.idle_since >= self.drain_grace_seconds:
            self._flush(f, lines)
            self._close_fd(f)
            del self._files[f.key]
            log.debug("%s (inode %d): rotated away and drained, closed", f.path, f.ino)

    def _read(self, f: _File, lines: list[str]) -> tuple[int, bool]:
        assert f.fd is not None
        size = os.fstat(f.fd).st_size
        if size < f.offset or (size > f.offset and not self._tail_matches(f)):
            log.info("%s was truncated (copy-truncate?): reading it again from the start", f.path)
            self._flush(f, lines)
            self._restart(f)
        budget = min(size - f.offset, self.max_read_bytes)
        got = 0
        while got < budget:
            data = os.pread(f.fd, min(_CHUNK, budget - got), f.offset)
            if not data:
                break
            f.offset += len(data)
            got += len(data)
            f.tail = data[-_TAIL_BYTES:] if len(data) >= _TAIL_BYTES else (f.tail + data)[-_TAIL_BYTES:]
            self._feed(f, data, lines)
        f.size = max(size, f.offset)
        self.stats.bytes_read += got
        return got, f.offset >= size

    def _tail_matches(self, f: _File) -> bool:
        if f.fd is None or not f.tail or f.offset < len(f.tail):
            return True
        return os.pread(f.fd, len(f.tail), f.offset - len(f.tail)) == f.tail

    @staticmethod
    def _restart(f: _File) -> None:
        f.offset = 0
        f.tail = b""
        f.partial = bytearray()
        f.overflow = False
        f.discard = False
        f.skip_nul = True

    def _feed(self, f: _File, data: bytes, lines: list[str]) -> None:
        if f.skip_nul:
            stripped = data.lstrip(b"\0")
            if not stripped:
                return
            f.skip_nul = False
            data = stripped
        pieces = data.split(b"\n")  # a chunk is at most _CHUNK bytes: bounded copies
        rest = pieces.pop()  # after the last newline: the start of the next unfinished line
        max_line = self.max_line_bytes
        for piece in pieces:
            if not f.partial and not f.discard and len(piece) <= max_line:
                lines.append(piece.decode("utf-8", errors="replace"))  # the common case: a whole line
                self.stats.lines_read += 1
            else:
                self._add(f, piece)
                self._emit(f, lines)
        if rest:
            self._add(f, rest)

    def _add(self, f: _File, piece: bytes) -> None:
        if f.discard or f.overflow:
            return
        room = self.max_line_bytes - len(f.partial)
        if len(piece) > room:
            f.partial += memoryview(piece)[:room]
            f.overflow = True
        else:
            f.partial += piece

    def _emit(self, f: _File, lines: list[str]) -> None:
        if f.discard:
            f.discard = False
        else:
            lines.append(f.partial.decode("utf-8", errors="replace"))
            self.stats.lines_read += 1
            if f.overflow:
                self.stats.lines_truncated += 1
        f.partial = bytearray()
        f.overflow = False

    def _flush(self, f: _File, lines: list[str]) -> None:
        """The file ends without a newline: return its unfinished line as it is."""
        if f.partial or f.overflow:
            self._emit(f, lines)
        f.discard = False

    # -------------------------------------------------------- open and close

    def _open(self, path: str) -> tuple[int, os.stat_result]:
        fd = os.open(path, _OPEN_FLAGS)  # O_NONBLOCK: a fifo must never block us
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _NotRegular(errno.EINVAL, f"{_kind(st.st_mode)}, not followed")
        except BaseException:
            os.close(fd)
            raise
        return fd, st

    def _open_new(self, key: Key, path: str, *, at_end: bool) -> _File | None:
        try:
            fd, st = self._open(path)
        except FileNotFoundError:
            return None  # gone between the scan and the open: it will be seen again, or not
        except OSError as exc:
            self._error(path, "open", exc)
            return None
        key = (st.st_dev, st.st_ino)
        if key in self._files:  # replaced by a file we follow already, between scan and open
            os.close(fd)
            return None
        f = _File(dev=st.st_dev, ino=st.st_ino, path=path, names=[path], fd=fd, real_dir=_real_dir(path))
        if at_end and st.st_size:
            try:
                f.offset = st.st_size
                f.size = st.st_size
                f.tail = os.pread(fd, min(_TAIL_BYTES, st.st_size), st.st_size - min(_TAIL_BYTES, st.st_size))
                f.discard = not f.tail.endswith(b"\n")
            except OSError as exc:
                self._error(path, "read", exc)
        self._files[key] = f
        log.debug("following %s (inode %d) from %s", path, f.ino, "its end" if f.offset else "its start")
        return f

    def _reopen(self, f: _File, hit: tuple[str, os.stat_result] | None, uncertain: list[str], lines: list[str]) -> bool:
        """A file known from the state (or from before `close()`) without a descriptor."""
        if hit is not None:
            try:
                fd, st = self._open(hit[0])
            except OSError as exc:
                self._error(hit[0], "open", exc)
                return False
            if (st.st_dev, st.st_ino) == f.key:
                f.fd = fd
                return True  # a changed fingerprint means truncated while we were down: _read starts over
            os.close(fd)  # replaced between scan and open: looked for again on the next poll
            return False
        found = self._find_by_inode(f)
        if found is None:
            if _under(f.path, uncertain):
                return False  # cannot tell now: try again on the next poll
            # Rotated away while we were down and gone since (deleted, compressed, moved
            # out of its directory): what it got after our saved offset is lost, since no
            # name and no descriptor lead to those bytes any more. Its unfinished line is
            # returned as it is.
            log.info("%s (inode %d) is gone: lines written to it after offset %d are lost", f.path, f.ino, f.offset)
            self._flush(f, lines)
            del self._files[f.key]
            return False
        f.fd = found
        try:
            ok = os.fstat(found).st_size >= f.offset and self._tail_matches(f)
        except OSError:
            ok = False
        if not ok:  # the inode number was reused by another file: not ours
            log.info("%s (inode %d) is gone; its inode number now belongs to another file", f.path, f.ino)
            self._close_fd(f)
            self._flush(f, lines)
            del self._files[f.key]
            return False
        f.rotated = True
        f.idle_since = time.monotonic()
        return True

    def _find_by_inode(self, f: _File) -> int | None:
        """Look for a rotated-away file by inode in the directories it was in."""
        for directory in dict.fromkeys(d for d in (os.path.dirname(f.path), f.real_dir) if d):
            try:
                with os.scandir(directory) as it:
                    for entry in it:
                        try:
                            if entry.inode() != f.ino or not entry.is_file(follow_symlinks=False):
                                continue
                            fd, st = self._open(entry.path)
                        except OSError:
                            continue
                        if (st.st_dev, st.st_ino) == f.key:
                            log.info("%s (inode %d) found again as %s: draining it", f.path, f.ino, entry.path)
                            return fd
                        os.close(fd)
            except OSError:
                continue
        return None

    @staticmethod
    def _close_fd(f: _File) -> None:
        if f.fd is not None:
            with contextlib.suppress(OSError):
                os.close(f.fd)
            f.fd = None

    # ------------------------------------------------------------------- scan

    def _scan(self) -> tuple[dict[Key, tuple[str, os.stat_result]], list[str]]:
        """Regular files matched now, by (dev, inode); and the paths we could not look into."""
        uncertain: list[str] = []
        matched: dict[Key, tuple[str, os.stat_result]] = {}
        for path in self._expand(uncertain):
            try:
                st = os.stat(path)
            except FileNotFoundError:
                if os.path.islink(path):
                    self._error(path, "stat", OSError(errno.ENOENT, "dangling symbolic link"))
                continue  # otherwise gone since the directory was listed
            except OSError as exc:
                self._error(path, "stat", exc)
                uncertain.append(path)
                continue
            if not stat.S_ISREG(st.st_mode):
                self._error(path, "stat", _NotRegular(errno.EINVAL, f"{_kind(st.st_mode)}, not followed"))
                continue
            matched.setdefault((st.st_dev, st.st_ino), (path, st))
        return matched, uncertain

    def _expand(self, uncertain: list[str]) -> list[str]:
        """glob.glob without `**`, but reporting the directories it cannot read."""
        pattern = self.pattern
        if not _MAGIC.search(pattern):
            return [pattern]
        parts = pattern.split(os.sep)
        bases = [os.sep] if pattern.startswith(os.sep) else [""]
        for i, part in enumerate(parts):
            if not part:
                continue
            last = i == len(parts) - 1
            if not _MAGIC.search(part):
                bases = [os.path.join(b, part) for b in bases]
                continue
            found: list[str] = []
            for base in bases:
                try:
                    with os.scandir(base or os.curdir) as it:
                        for entry in it:
                            if entry.name.startswith(".") and not part.startswith("."):
                                continue
                            if not fnmatch.fnmatchcase(entry.name, part):
                                continue
                            if last or _is_dir(entry):
                                found.append(os.path.join(base, entry.name))
                except (FileNotFoundError, NotADirectoryError):
                    continue
                except OSError as exc:
                    self._error(base, "list", exc)
                    uncertain.append(base)
            bases = found
        return sorted(bases)

    # ----------------------------------------------------------------- errors

    def _error(self, path: str, what: str, exc: BaseException) -> None:
        """Count an error once per cause: one that persists poll after poll counts once."""
        key = (path, f"{what}:{getattr(exc, 'errno', None)}:{type(exc).__name__}")
        self._errors_now.add(key)
        if key in self._errors_prev:
            return
        self.stats.read_errors += 1
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        self.stats.last_error = f"{what} {path}: {reason}"
        log.warning("log follower: %s", self.stats.last_error)


def _stream_name(f: _File) -> str:
    return f.names[0] if f.names else f.path


def _rename(f: _File, path: str) -> None:
    f.path = path
    if path not in f.names:
        f.names.append(path)
        del f.names[:-_NAMES]


def _age(item: tuple[Key, tuple[str, os.stat_result]]) -> tuple[int, int, str]:
    """Oldest first. Timestamps are coarse (a few ms): on a tie the longer name first, as
    `app.log.1` (or `0.log.20240501-120000`) is older than `app.log` (`0.log`)."""
    path, st = item[1]
    return (st.st_mtime_ns, -len(path), path)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _real_dir(path: str) -> str:
    try:
        return os.path.dirname(os.path.realpath(path))
    except (OSError, ValueError):
        return ""


def _under(path: str, prefixes: list[str]) -> bool:
    for prefix in prefixes:
        if path == prefix:
            return True
        p = prefix.rstrip(os.sep) + os.sep if prefix else ""
        if p and path.startswith(p):
            return True
        if not prefix and not os.path.isabs(path):
            return True
    return False


__all__ = ["FileFollower"]
