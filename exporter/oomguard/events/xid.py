"""GPU XID errors from NVML events, waited for in a background thread (never on the scrape path).

XIDs worth knowing: 31 (memory page fault), 43 (GPU stopped processing), 48 (double-bit
ECC), 79 (fell off the bus). NVML events carry no timestamp: the time is when we saw it.
"""

from __future__ import annotations

import logging
import threading
import time
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)
WAIT_MS = 1000  # how long one nvmlEventSetWait blocks; also how fast stop() takes effect


class XidWatcher:
    def __init__(self, lib: ModuleType | Any) -> None:
        self._lib = lib
        self.counts: dict[tuple[int, int], int] = {}  # (gpu index, xid) -> events
        self.last: dict[int, float] = {}  # gpu index -> time of its last XID
        self.read_errors = 0  # failed waits for events (other than the timeout)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="nvml-xid", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=WAIT_MS / 1000 * 3)

    def _register(self) -> tuple[Any, dict[str, int]] | None:
        lib = self._lib
        try:
            lib.nvmlInit()
        except lib.NVMLError as exc:
            log.info("XID events off: NVML could not start (%s)", exc)
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
                    self.read_errors += 1
                    log.warning("nvmlEventSetWait: %s", exc)
                    self._stop.wait(WAIT_MS / 1000)
                    continue
                uuid = lib.nvmlDeviceGetUUID(data.device)
                index = by_uuid.get(uuid.decode() if isinstance(uuid, bytes) else uuid, -1)
                key = (index, int(data.eventData))
                self.counts[key] = self.counts.get(key, 0) + 1
                self.last[index] = time.time()
                log.error("GPU %d: XID %d", index, key[1])
        finally:
            try:
                lib.nvmlEventSetFree(event_set)
                lib.nvmlShutdown()
            except lib.NVMLError:
                pass
