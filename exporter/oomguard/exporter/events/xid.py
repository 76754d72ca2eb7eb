"""GPU XID errors from NVML's events: an event source like the others, its counts saved with theirs.

XIDs worth knowing: 31 (memory page fault), 43 (GPU stopped processing), 48 (double-bit ECC), 79 (fell off the
bus). NVML hands them out one at a time through `nvmlEventSetWait`, which blocks: a thread of this source's own
(`nvml-xid`) waits for them and adds each to what it holds for the next poll, by GPU and code, so a storm of one
XID holds one entry, not one per event. The runner's poll takes them as events (kind `xid`, their GPU and code),
counts them and saves the counts in the state file: a restarted exporter goes on from them. NVML events carry no
timestamp: the time is when the thread saw it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from oomguard.common.kinds import XID
from oomguard.exporter.events.source import ErrorReport, source_health
from oomguard.exporter.model import HOST, Event, EventSourceHealth, ReadStats

log = logging.getLogger(__name__)
WAIT_MS = 1000  # how long one nvmlEventSetWait blocks; also how fast close() takes effect
NAME = "nvml:xid"  # the `source` label of its event-source series


class XidSource:
    """Its events are a GPU's (`Event.gpu`, `Event.code`): no kind of the host's or a target's to start at zero."""

    kinds: tuple[str, ...] = ()

    def __init__(self, lib: ModuleType | Any, *, clock: Callable[[], float] = time.time) -> None:
        self.target = HOST
        self.name = NAME
        self._lib = lib
        self._clock = clock
        self.stats = ReadStats()
        # (gpu index, xid) -> (events, the last one's time), seen by the thread since the last poll.
        self._held: dict[tuple[int, int], tuple[int, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._report = ErrorReport()

    # -- the EventSource protocol (source.py), called by the runner in its worker thread --------------
    def poll(self, now: float) -> list[Event]:
        if self._thread is None and not self._stop.is_set():
            # The first poll starts the wait: the runner is built before the exporter runs, and may never run.
            self._thread = threading.Thread(target=self._run, name="nvml-xid", daemon=True)
            self._thread.start()
        with self._lock:
            error = self.stats.last_error
        self._report(self, error)
        return self._take()

    def health(self) -> EventSourceHealth:
        with self._lock:
            return source_health(self, self.stats)

    def state(self) -> dict[str, Any]:
        return {}  # nothing to resume: NVML gives no event twice, and the counts are the runner's

    def close(self) -> list[Event]:
        """Stop waiting; what the thread saw since the last poll."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=WAIT_MS / 1000 * 3)
        return self._take()

    def _take(self) -> list[Event]:
        with self._lock:
            held, self._held = self._held, {}
        return [Event(XID, at, count=n, gpu=gpu, code=code) for (gpu, code), (n, at) in sorted(held.items())]

    # -- the thread -----------------------------------------------------------------------------------
    def _register(self) -> tuple[Any, dict[str, int]] | None:
        lib = self._lib
        try:
            lib.nvmlInit()
        except lib.NVMLError as exc:
            # The NVML source has said why at start, with the fix: one line for one cause, not two.
            log.debug("XID events off: NVML could not start (%s)", exc)
            return None
        event_set = lib.nvmlEventSetCreate()
        by_uuid: dict[str, int] = {}
        for index in range(lib.nvmlDeviceGetCount()):
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(index)
                lib.nvmlDeviceRegisterEvents(handle, lib.nvmlEventTypeXidCriticalError, event_set)
                uuid = lib.nvmlDeviceGetUUID(handle)
                by_uuid[uuid.decode() if isinstance(uuid, bytes) else uuid] = index
            except lib.NVMLError as exc:  # NotSupported on some GPUs and vGPUs
                log.info("GPU %d: XID events not available (%s)", index, exc)
        return event_set, by_uuid

    def _run(self) -> None:
        lib = self._lib
        registered = self._register()
        if registered is None:
            return
        event_set, by_uuid = registered
        try:
            while not self._stop.is_set():
                try:
                    data = lib.nvmlEventSetWait(event_set, WAIT_MS)
                except lib.NVMLError_Timeout:
                    continue
                except lib.NVMLError as exc:
                    with self._lock:
                        self.stats.read_errors += 1
                        self.stats.last_error = f"nvmlEventSetWait failed: {exc} (XIDs may be missed meanwhile)"
                    self._stop.wait(WAIT_MS / 1000)
                    continue
                try:
                    uuid = lib.nvmlDeviceGetUUID(data.device)
                except lib.NVMLError:  # a GPU lost with its XID 79 still names no UUID: the XID counts, as GPU -1
                    uuid = ""
                key = (by_uuid.get(uuid.decode() if isinstance(uuid, bytes) else uuid, -1), int(data.eventData))
                now = self._clock()
                with self._lock:
                    n, _ = self._held.get(key, (0, now))
                    self._held[key] = (n + 1, now)
                    self.stats.last_error = ""
                if n == 0:  # one line per GPU and XID between two polls, however many: a storm is counted, not logged
                    log.error("GPU %d: XID %d", *key)
        finally:
            try:
                lib.nvmlEventSetFree(event_set)
                lib.nvmlShutdown()
            except lib.NVMLError:
                pass
