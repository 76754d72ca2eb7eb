"""The sources' run record: every source runs through here, so success and duration come from one place.

A source is anything oomguard reads: NVML, the engine targets, the engines' processes on this
host, the event sources (logs, journals, cgroups, the kernel log), NVML's XID events. Each has
a name (the `source` label of `oomguard_source_success`), a method that reads it (async
`collect`/`scrape`, or a blocking `read`/`poll` run in a worker thread) and its own health.
A source that raises or times out is recorded as failed and yields None: it never fails the
scrape, and the other sources go on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from oomguard.exporter.model import SourceResult

log = logging.getLogger(__name__)
T = TypeVar("T")


class SourceRuns:
    def __init__(self) -> None:
        self._results: dict[str, SourceResult] = {}
        self._lock = threading.Lock()  # blocking sources record from worker threads

    async def run(self, name: str, work: Awaitable[T], *, ok: Callable[[T], bool] | None = None) -> T | None:
        """Await one read of source `name`; `ok` judges a result that came back (default: any)."""
        started = time.perf_counter()
        try:
            result = await work
        except Exception as exc:  # a source must never fail the scrape
            _log_failure(name, exc)
            self.record(name, False, time.perf_counter() - started)
            return None
        self.record(name, ok(result) if ok is not None else True, time.perf_counter() - started)
        return result

    def run_blocking(self, name: str, work: Callable[[], T]) -> T | None:
        """The same for a blocking read, in the worker thread that runs it."""
        started = time.perf_counter()
        try:
            result = work()
        except Exception as exc:
            _log_failure(name, exc)
            self.record(name, False, time.perf_counter() - started)
            return None
        self.record(name, True, time.perf_counter() - started)
        return result

    def record(self, name: str, success: bool, duration_seconds: float) -> None:
        with self._lock:
            self._results[name] = SourceResult(success, duration_seconds)

    def results(self) -> dict[str, SourceResult]:
        with self._lock:
            return dict(self._results)


def _log_failure(name: str, exc: Exception) -> None:
    """Counted by oomguard_source_success 0, said in one line. A timeout is a source's expected way to fail
    and the source says so itself, with its setting (NvmlReader): here only at debug level, not a second line.
    Anything else is named with its type; the traceback only at debug level."""
    if isinstance(exc, TimeoutError):
        log.debug("source %s: no answer within its timeout; left out of this scrape", name)
    else:
        log.error("source %s failed: %s: %s (traceback at --log.level debug)", name, type(exc).__name__, exc)
        log.debug("source %s failed", name, exc_info=exc)
