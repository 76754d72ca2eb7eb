"""NvmlReader: a cancelled read is cancelled, even when the NVML thread finishes at that very moment.

Python 3.11's `asyncio.wait_for` returns the inner result when the waiting task is cancelled just as the
inner future completes, and the cancellation is lost. The trend sampler, cancelled at shutdown, then went on
sampling forever and the runtime's stop hung (found by the drill of foreign-process).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from oomguard.exporter.model import GpuReadings
from oomguard.exporter.sources.nvml_reader import NvmlReader


class GatedSource:
    """An NVML source whose read returns when the test opens the gate."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def read(self) -> GpuReadings:
        self.gate.wait(5)
        return GpuReadings(up=True, driver_version="test")

    def close(self) -> None:
        pass


async def test_cancel_as_the_read_completes_is_not_lost() -> None:
    source = GatedSource()
    reader = NvmlReader(source, timeout_seconds=5)  # type: ignore[arg-type]
    task = asyncio.ensure_future(reader.read())
    await asyncio.sleep(0)  # the task now waits on the read
    source.gate.set()
    deadline = time.monotonic() + 5
    while not (reader._future and reader._future.done()):  # the thread finished; its result not yet delivered
        assert time.monotonic() < deadline
        time.sleep(0.001)
    await asyncio.sleep(0)  # the loop takes the thread's result: the read's waiter is done, its waker pending
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    reader.close()


async def test_a_read_that_times_out_raises_timeout_and_the_next_waits_on_it() -> None:
    source = GatedSource()
    reader = NvmlReader(source, timeout_seconds=0.05)  # type: ignore[arg-type]
    with pytest.raises(TimeoutError):
        await reader.read()
    first = reader._future
    source.gate.set()
    reading = await reader.read()  # the hung read's own result: not a second read stacked behind it
    assert reading.driver_version == "test" and reader._future is first
    reader.close()
