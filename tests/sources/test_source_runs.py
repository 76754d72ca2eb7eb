"""The sources' run record: a failing source is one line and a 0, never a traceback at the default level."""

from __future__ import annotations

import logging

import pytest

from oomguard.exporter.sources.nvml_reader import NvmlReader
from oomguard.exporter.sources.source_runs import SourceRuns
from tests.sources.test_nvml_reader import GatedSource


async def test_an_nvml_timeout_is_one_line_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """The real path of the NVML read past its timeout (it logged its own warning, then the run record a
    traceback): one warning, the reader's, naming its setting."""
    source_runs = SourceRuns()
    source = GatedSource()
    reader = NvmlReader(source, timeout_seconds=0.01)  # type: ignore[arg-type]
    try:
        with caplog.at_level(logging.INFO, logger="oomguard"):
            assert await source_runs.run("nvml", reader.read()) is None
    finally:
        source.gate.set()
        reader.close()
    assert source_runs.results()["nvml"].success is False
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert "NVML read took longer than 0.01s (nvml.timeout_seconds)" in record.getMessage()


def test_a_crash_is_named_and_its_traceback_kept_for_debug(caplog: pytest.LogCaptureFixture) -> None:
    source_runs = SourceRuns()

    def crashes() -> int:
        raise ValueError("bad reading")

    with caplog.at_level(logging.DEBUG, logger="oomguard.exporter.sources.source_runs"):
        assert source_runs.run_blocking("processes", crashes) is None
    assert source_runs.results()["processes"].success is False
    error, debug = caplog.records
    assert error.levelno == logging.ERROR and error.exc_info is None
    assert "source processes failed: ValueError: bad reading" in error.getMessage()
    assert debug.levelno == logging.DEBUG and debug.exc_info is not None
