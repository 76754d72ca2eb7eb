"""What a log follower's pattern matches now (`file_follower.py`): a glob without `**`, by inode.

`scan` is glob.glob plus os.stat, with what glob hides reported instead: every error
goes to the caller's `error(path, what, exc)`, which counts it once per cause. Names
starting with "." are matched only by a pattern part that starts with "." (as glob).
Only regular files are followed: a directory, fifo, socket or device matched by the
pattern, and a dangling symbolic link, are errors, never opened.

Symbolic links: unless `follow_symlinks`, a matched file that is a link, and a directory
matched by a wildcard part that is a link, are skipped and reported (an error, counted
once per cause): a link planted in a log folder (`app.log.evil -> /etc/shadow`) is never
read. Directories written out in the pattern (`/var/log/vllm` of `/var/log/vllm/*.log`)
are the configuration's own and resolved as the system does.

A directory that cannot be listed, and a path that cannot be stat'ed, are returned as
"uncertain": whether a followed file under them is still there cannot be told, so it is
not taken as rotated away (`under`); it is looked at again on the next poll.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import stat
from collections.abc import Callable

Key = tuple[int, int]  # (st_dev, st_ino): how a file is known, never by name
Matched = dict[Key, tuple[str, os.stat_result]]
ErrorSink = Callable[[str, str, BaseException], None]

_MAGIC = re.compile(r"[*?[]")


class NotRegular(OSError):
    pass


SYMLINK_SKIPPED = "a symbolic link, not followed (set follow_symlinks: true on the target to follow it)"


def kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a fifo"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def scan(pattern: str, error: ErrorSink, *, follow_symlinks: bool = True) -> tuple[Matched, list[str]]:
    """Regular files matched now, by (dev, inode); and the paths we could not look into."""
    uncertain: list[str] = []
    matched: Matched = {}
    for path in expand(pattern, uncertain, error, follow_symlinks=follow_symlinks):
        try:
            st = os.stat(path) if follow_symlinks else os.lstat(path)
        except FileNotFoundError:
            if os.path.islink(path):
                error(path, "stat", OSError(errno.ENOENT, "dangling symbolic link"))
            continue  # otherwise gone since the directory was listed
        except OSError as exc:
            error(path, "stat", exc)
            uncertain.append(path)
            continue
        if stat.S_ISLNK(st.st_mode):
            error(path, "stat", NotRegular(errno.ELOOP, SYMLINK_SKIPPED))
            continue
        if not stat.S_ISREG(st.st_mode):
            error(path, "stat", NotRegular(errno.EINVAL, f"{kind(st.st_mode)}, not followed"))
            continue
        matched.setdefault((st.st_dev, st.st_ino), (path, st))
    return matched, uncertain


def expand(pattern: str, uncertain: list[str], error: ErrorSink, *, follow_symlinks: bool = True) -> list[str]:
    """glob.glob without `**`, but reporting the directories it cannot read (and, unless `follow_symlinks`, the
    linked directories a wildcard matched, skipped)."""
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
                        path = os.path.join(base, entry.name)
                        if last:
                            found.append(path)
                        elif not follow_symlinks and _is_linked_dir(entry):
                            error(path, "list", NotRegular(errno.ELOOP, SYMLINK_SKIPPED))
                        elif _is_dir(entry):
                            found.append(path)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:
                error(base, "list", exc)
                uncertain.append(base)
        bases = found
    return sorted(bases)


def age(item: tuple[Key, tuple[str, os.stat_result]]) -> tuple[int, int, str]:
    """Oldest first. Timestamps are coarse (a few ms): on a tie the longer name first, as
    `app.log.1` (or `0.log.20240501-120000`) is older than `app.log` (`0.log`)."""
    path, st = item[1]
    return (st.st_mtime_ns, -len(path), path)


def real_dir(path: str) -> str:
    """The directory of the resolved path: where to look for a file by inode after a restart."""
    try:
        return os.path.dirname(os.path.realpath(path))
    except (OSError, ValueError):
        return ""


def under(path: str, prefixes: list[str]) -> bool:
    """Whether `path` is one of `prefixes` or below one (the uncertain paths of `scan`)."""
    for prefix in prefixes:
        if path == prefix:
            return True
        p = prefix.rstrip(os.sep) + os.sep if prefix else ""
        if p and path.startswith(p):
            return True
        if not prefix and not os.path.isabs(path):
            return True
    return False


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _is_linked_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_symlink() and entry.is_dir()
    except OSError:
        return False


__all__ = ["SYMLINK_SKIPPED", "ErrorSink", "Key", "Matched", "NotRegular", "age", "expand", "kind", "real_dir"]
__all__ += ["scan", "under"]
