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
  A name that changes hands while a poll runs (the listing made before a rename, a stat or an open after it) is
  looked at again: a poll that finds a new file lists twice, and a new file opened by name must be the inode the
  scan found, else it and the newer files wait for the next poll, which finds the older one at its new name.
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
Complete lines only, without the newline; an unfinished line is held until its newline
arrives (a file closed after a rotation returns it as it is, never drops it), and a line
longer than `max_line_bytes` keeps its head: see `lines.py`. At most `max_read_bytes` is
read per file per poll; `bytes_behind` shows what is left.

On the very first start (no state), files that already exist are read from their end;
the unfinished line at their end, if any, is skipped up to its newline.

The modules: this one (the follower: reading, rotation, restarts), `scan.py` (what the
pattern matches now), `lines.py` (bytes to lines), `followed_file.py` (one followed file: its
saved form, opening it, finding it again by inode).
"""

from __future__ import annotations

import binascii
import errno
import logging
import os
import threading
import time

from oomguard.common.excerpt import excerpt
from oomguard.exporter.events.followed_file import STATE_VERSION, FollowedFile, find_by_inode, open_regular
from oomguard.exporter.events.scan import Key, Matched, age, real_dir, scan, under
from oomguard.exporter.model import ReadStats

log = logging.getLogger(__name__)

_CHUNK = 64 * 1024
_TAIL_BYTES = 64


class _Renamed(Exception):
    """A new file's name held another file by the time it was opened."""


class FileFollower:
    """Follow every regular file matched by `pattern` (a path or a glob, no `**`); a symbolic link only when
    `follow_symlinks` (scan.py: a skipped one is reported once, as an error)."""

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
        follow_symlinks: bool = False,
    ) -> None:
        self.pattern = pattern
        self.follow_symlinks = follow_symlinks
        self.from_start = from_start
        self.max_line_bytes = max(1, int(max_line_bytes))
        self.max_read_bytes = max(1, int(max_read_bytes))
        self.stats = ReadStats()
        self._lock = threading.Lock()
        self._files: dict[Key, FollowedFile] = {}  # in discovery order: older files first
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
                "files": [f.to_state() for f in self._files.values()],
            }

    def close(self) -> None:
        """Close every descriptor. The state is kept: `state()` still works, and a later
        `poll()` reopens the files (as after a restart)."""
        with self._lock:
            for f in self._files.values():
                f.close_fd()

    def __enter__(self) -> FileFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        for f in getattr(self, "_files", {}).values():
            f.close_fd()

    def open_fds(self) -> int:
        """Descriptors held now (for tests and health pages)."""
        return sum(1 for f in self._files.values() if f.fd is not None)

    def streams(self) -> set[str]:
        """The names `poll_by_file` gives the files followed now. A name leaves the set once its last
        file is let go (rotated away and drained, or gone): nothing more will come under it."""
        with self._lock:
            return {f.stream_name for f in self._files.values()}

    # ------------------------------------------------------------------ state

    def _load(self, state: dict) -> None:
        try:
            if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
                raise ValueError(f"unknown state version {state.get('version') if isinstance(state, dict) else None!r}")
            files: dict[Key, FollowedFile] = {}
            for entry in state.get("files", []):
                f = FollowedFile.from_state(entry, self.max_line_bytes)
                files[f.key] = f
            self._files = files
            self._started = bool(state.get("started", True))
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError, binascii.Error) as exc:
            # A state we cannot trust is dropped whole: starting from the end (as on a
            # first start) may miss events; reading everything again would count old
            # ones a second time.
            self._files = {}
            self._started = False
            self.stats.last_error = f"state ignored: {excerpt(str(exc))}"  # its values are the state file's
            log.warning(
                "log follower for %s: %s; starting at the end of the files", self.pattern, self.stats.last_error
            )

    # ------------------------------------------------------------------- poll

    def _poll(self) -> list[tuple[str, list[str]]]:
        now = time.monotonic()
        first = not self._started
        matched, uncertain = self._listing(first)
        self._started = True
        out: list[tuple[str, list[str]]] = []
        # The names of files with a backlog: a file now at one of them is their successor
        # (app.log after app.log became app.log.1) and waits, so that lines keep their order.
        busy: set[str] = set()
        for f in list(self._files.values()):
            lines = self._poll_known(f, matched.pop(f.key, None), uncertain, busy, now)
            if lines:
                out.append((f.stream_name, lines))
        out += self._poll_new(matched, busy, first, now)
        self.stats.bytes_behind = sum(max(0, f.size - f.offset) for f in self._files.values() if f.fd is not None)
        self.stats.files_followed = sum(1 for f in self._files.values() if not f.rotated)
        return out

    def _listing(self, first: bool) -> tuple[Matched, list[str]]:
        """The files the pattern matches, and the paths that could not be told (`scan`'s)."""
        matched, uncertain = scan(self.pattern, self._error, follow_symlinks=self.follow_symlinks)
        if not first and any(key not in self._files for key in matched):
            # A new file: list again. A rename between the listing and the stats hides the file it replaced
            # (app.log renamed app.log.1 and created anew: the stat of app.log finds the new file, and the listing
            # was made before app.log.1 existed), and the new file would be read before the lines that precede
            # it. The second listing, made after those stats, has the renamed one.
            again, more = scan(self.pattern, self._error, follow_symlinks=self.follow_symlinks)
            matched |= again  # its names are the fresher
            uncertain += [path for path in more if path not in uncertain]
        return matched, uncertain

    def _poll_known(
        self, f: FollowedFile, hit: tuple[str, os.stat_result] | None, uncertain: list[str], busy: set[str],
        now: float,
    ) -> list[str]:  # fmt: skip
        """The new lines of a file already followed: still matched (perhaps renamed), or left the pattern and
        drained; reopened where its descriptor was closed."""
        lines: list[str] = []
        if hit is not None:
            f.rename(hit[0])
            f.size = hit[1].st_size
            f.rotated = False
        elif not under(f.path, uncertain) and not f.rotated:
            # Renamed away, deleted, or the link now points elsewhere: drain it.
            f.rotated = True
            f.idle_since = now
            log.debug("%s (inode %d) left the pattern: draining it", f.path, f.ino)
        if f.fd is None and not self._reopen(f, hit, uncertain, lines):
            return lines
        if f.path not in busy:
            self._service(f, now, lines)
        if f.fd is not None and f.size > f.offset:
            busy.update(f.names)
        return lines

    def _poll_new(self, matched: Matched, busy: set[str], first: bool, now: float) -> list[tuple[str, list[str]]]:
        """New files; oldest first, so that after several rotations while we were down app.log.2 comes before
        app.log.1 before app.log."""
        out: list[tuple[str, list[str]]] = []
        for key, (path, st) in sorted(matched.items(), key=age):
            try:
                f = self._open_new(key, path, at_end=first and not self.from_start)
            except _Renamed:
                break  # the newer files wait for the next poll, which finds this one at its new name first
            if f is None:
                continue
            lines: list[str] = []
            if path in busy:
                f.size = st.st_size
            else:
                self._service(f, now, lines)
            if f.size > f.offset:
                busy.update(f.names)
            if lines:
                out.append((f.stream_name, lines))
        return out

    def _service(self, f: FollowedFile, now: float, lines: list[str]) -> None:
        """Read what is new in one open file; close it when it is rotated away and done."""
        try:
            got, at_eof = self._read(f, lines)
        except OSError as exc:
            self._error(f.path, "read", exc)
            if exc.errno in (errno.EBADF, errno.ESTALE):
                f.close_fd()  # reopened by the next poll if it is still there
            return
        if got:
            f.idle_since = now
        if f.rotated and at_eof and now - f.idle_since >= self.drain_grace_seconds:
            f.line.flush(lines, self.stats)
            f.close_fd()
            del self._files[f.key]
            log.debug("%s (inode %d): rotated away and drained, closed", f.path, f.ino)

    def _read(self, f: FollowedFile, lines: list[str]) -> tuple[int, bool]:
        assert f.fd is not None
        size = os.fstat(f.fd).st_size
        if size < f.offset or (size > f.offset and not self._tail_matches(f)):
            log.info("%s was truncated (copy-truncate?): reading it again from the start", f.path)
            f.line.flush(lines, self.stats)
            f.restart()
        budget = min(size - f.offset, self.max_read_bytes)
        got = 0
        while got < budget:
            data = os.pread(f.fd, min(_CHUNK, budget - got), f.offset)
            if not data:
                break
            f.offset += len(data)
            got += len(data)
            f.tail = data[-_TAIL_BYTES:] if len(data) >= _TAIL_BYTES else (f.tail + data)[-_TAIL_BYTES:]
            f.line.feed(data, lines, self.max_line_bytes, self.stats)
        f.size = max(size, f.offset)
        self.stats.bytes_read += got
        return got, f.offset >= size

    def _tail_matches(self, f: FollowedFile) -> bool:
        if f.fd is None or not f.tail or f.offset < len(f.tail):
            return True
        return os.pread(f.fd, len(f.tail), f.offset - len(f.tail)) == f.tail

    # -------------------------------------------------------- open and close

    def _open_new(self, key: Key, path: str, *, at_end: bool) -> FollowedFile | None:
        try:
            fd, st = open_regular(path, follow_symlinks=self.follow_symlinks)
        except FileNotFoundError:
            return None  # gone between the scan and the open: it will be seen again, or not
        except OSError as exc:
            self._error(path, "open", exc)
            return None
        if (st.st_dev, st.st_ino) != key:
            # The name was given to another file between the scan and the open (app.log renamed app.log.1 and
            # created anew): the scanned file is at another name now and the newer one here. Reading the newer one
            # now would put its lines before the older one's; the next poll finds both, and reads the older first.
            os.close(fd)
            raise _Renamed(path)
        f = FollowedFile(dev=st.st_dev, ino=st.st_ino, path=path, names=[path], fd=fd, real_dir=real_dir(path))
        if at_end and st.st_size:
            try:
                f.offset = st.st_size
                f.size = st.st_size
                f.tail = os.pread(fd, min(_TAIL_BYTES, st.st_size), st.st_size - min(_TAIL_BYTES, st.st_size))
                f.line.discard = not f.tail.endswith(b"\n")
            except OSError as exc:
                self._error(path, "read", exc)
        self._files[key] = f
        log.debug("following %s (inode %d) from %s", path, f.ino, "its end" if f.offset else "its start")
        return f

    def _reopen(
        self, f: FollowedFile, hit: tuple[str, os.stat_result] | None, uncertain: list[str], lines: list[str]
    ) -> bool:
        """A file known from the state (or from before `close()`) without a descriptor."""
        if hit is not None:
            try:
                fd, st = open_regular(hit[0], follow_symlinks=self.follow_symlinks)
            except OSError as exc:
                self._error(hit[0], "open", exc)
                return False
            if (st.st_dev, st.st_ino) == f.key:
                f.fd = fd
                return True  # a changed fingerprint means truncated while we were down: _read starts over
            os.close(fd)  # replaced between scan and open: looked for again on the next poll
            return False
        found = find_by_inode(f)
        if found is None:
            if under(f.path, uncertain):
                return False  # cannot tell now: try again on the next poll
            # Rotated away while we were down and gone since (deleted, compressed, moved
            # out of its directory): what it got after our saved offset is lost, since no
            # name and no descriptor lead to those bytes any more. Its unfinished line is
            # returned as it is.
            log.info("%s (inode %d) is gone: lines written to it after offset %d are lost", f.path, f.ino, f.offset)
            f.line.flush(lines, self.stats)
            del self._files[f.key]
            return False
        fd, path = found
        log.info("%s (inode %d) found again as %s: draining it", f.path, f.ino, path)
        f.fd = fd
        try:
            ok = os.fstat(fd).st_size >= f.offset and self._tail_matches(f)
        except OSError:
            ok = False
        if not ok:  # the inode number was reused by another file: not ours
            log.info("%s (inode %d) is gone; its inode number now belongs to another file", f.path, f.ino)
            f.close_fd()
            f.line.flush(lines, self.stats)
            del self._files[f.key]
            return False
        f.rotated = True
        f.idle_since = time.monotonic()
        return True

    # ----------------------------------------------------------------- errors

    def _error(self, path: str, what: str, exc: BaseException) -> None:
        """Count an error once per cause: one that persists poll after poll counts once."""
        key = (path, f"{what}:{getattr(exc, 'errno', None)}:{type(exc).__name__}")
        self._errors_now.add(key)
        if key in self._errors_prev:
            return
        self.stats.read_errors += 1
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        self.stats.last_error = f"{what} {excerpt(path)}: {excerpt(reason)}"  # a name as long as a tenant makes it
        log.warning("log follower: %s", self.stats.last_error)


__all__ = ["FileFollower"]
