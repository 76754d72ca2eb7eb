"""NVML reads off the event loop: one thread of its own, a timeout, and no reads stacked behind a hung one."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future, ThreadPoolExecutor

from oomguard.exporter.model import GpuReadings
from oomguard.exporter.sources.nvml import NvmlSource

log = logging.getLogger(__name__)


class NvmlReader:
    """NVML's GPU source (sources/gpu_source.py)."""

    name = "nvml"

    def __init__(self, source: NvmlSource, timeout_seconds: float) -> None:
        self.source = source
        self.timeout_seconds = timeout_seconds
        # One thread for NVML: a hung driver call blocks only this thread, and a
        # second read is not stacked behind it (see read).
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml")
        self._future: Future[GpuReadings] | None = None

    async def read(self) -> GpuReadings:
        """The current reading; raises TimeoutError after timeout_seconds."""
        if self._future is None or self._future.done():
            self._future = self._thread.submit(self.source.read)
        waiter = asyncio.wrap_future(self._future)
        waiter.add_done_callback(_retrieve)
        try:
            # Not asyncio.wait_for: on 3.11 it returns the result when the caller is cancelled just as the read
            # completes, and the cancellation is lost (the sampler then never stopped). The shield keeps a
            # caller's timeout or cancellation from cancelling the read the next caller will wait on.
            async with asyncio.timeout(self.timeout_seconds):
                return await asyncio.shield(waiter)
        except TimeoutError:
            # The read goes on in its thread; the next caller waits on it rather than starting another.
            log.warning(
                "NVML read took longer than %gs (nvml.timeout_seconds): GPU metrics left out of this scrape",
                self.timeout_seconds,
            )
            raise

    def close(self) -> None:
        self._thread.submit(self.source.close)
        self._thread.shutdown(wait=False, cancel_futures=True)


def _retrieve(future: asyncio.Future[GpuReadings]) -> None:
    """Marks a read's outcome as seen: one nobody awaits any more (timed out, cancelled) logs no warning."""
    if not future.cancelled():
        future.exception()
