"""The sources' run record: a failing source is one line and a 0, never a traceback at the default level."""

from __future__ import annotations

import asyncio
import logging

import pytest

from oomguard.sources.registry import SourceRegistry


async def test_a_timeout_is_one_line_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    registry = SourceRegistry()

    async def hangs() -> int:
        async with asyncio.timeout(0.01):
            await asyncio.sleep(1)
        return 1

    with caplog.at_level(logging.INFO, logger="oomguard.sources.registry"):
        assert await registry.run("nvml", hangs()) is None
    assert registry.results()["nvml"].success is False
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert record.getMessage() == "source nvml: no answer within its timeout; left out of this scrape"


def test_a_crash_is_named_and_its_traceback_kept_for_debug(caplog: pytest.LogCaptureFixture) -> None:
    registry = SourceRegistry()

    def crashes() -> int:
        raise ValueError("bad reading")

    with caplog.at_level(logging.DEBUG, logger="oomguard.sources.registry"):
        assert registry.run_blocking("processes", crashes) is None
    assert registry.results()["processes"].success is False
    error, debug = caplog.records
    assert error.levelno == logging.ERROR and error.exc_info is None
    assert "source processes failed: ValueError: bad reading" in error.getMessage()
    assert debug.levelno == logging.DEBUG and debug.exc_info is not None
