"""A file the backtest is given (the OOM list, the mapping, the bundle configuration, the exporter's configuration):
read only if it is a regular file within its size.

Opened non-blocking and checked with fstat before a byte is read, so a FIFO at the path is one line at once, not a
read that never returns, and a device (`/dev/zero`, whose size says 0) is not read into memory without end.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from oomguard.backtest import BacktestError

# A YAML file the backtest reads (the bundle configuration, the exporter's configuration), as the web configuration
# and the mapping: far above any a hand writes.
MAX_YAML_BYTES = 1024**2
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


def _open(path: Path, what: str, limit: int) -> int:
    try:
        fd = os.open(path, _FLAGS)
    except OSError as exc:
        raise BacktestError(f"{path}: cannot read the {what}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BacktestError(f"{path}: the {what} is not a regular file (a FIFO, a device, a folder?); give a file")
        if st.st_size > limit:
            raise BacktestError(f"{path}: {st.st_size:,} bytes, over the limit of the {what} ({limit:,}); is it the "
                                "right file?")  # fmt: skip
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_regular(path: Path, what: str, limit: int) -> None:
    """Refuses `path` unless it is a regular file of at most `limit` bytes (for a reader elsewhere that opens it)."""
    os.close(_open(path, what, limit))


def read_regular(path: Path, what: str, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (read up to the limit, whatever it grows to meanwhile)."""
    fd = _open(path, what, limit)
    try:
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise BacktestError(f"{path}: cannot read the {what}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise BacktestError(f"{path}: over the limit of the {what} ({limit:,} bytes); is it the right file?")
    return b"".join(chunks)
