"""A real Prometheus holding the synthetic histories of histories.py, backfilled with promtool."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import histories
import pytest

from oomguard.drill.services import Prometheus


@dataclass(frozen=True)
class Backfilled:
    url: str
    at: float  # the end of the histories: pass as --at


@pytest.fixture(scope="session")
def backfilled(promtool: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfilled]:
    work = tmp_path_factory.mktemp("diagnose-prometheus")
    # Blocks younger than ~2 h may not be loaded at once: the histories end 3 h ago.
    end = float(int(time.time() - 3 * 3600))
    source = work / "histories.om"
    source.write_text(histories.openmetrics(histories.all_histories(), end - histories.SPAN))
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(work / "data")],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    # It scrapes nothing of ours: a closed port, once an hour.
    prometheus = Prometheus(work, ["127.0.0.1:9"], scrape_interval="1h", evaluation_interval="1h")
    prometheus.start()
    try:
        yield Backfilled(prometheus.url, end)
    finally:
        prometheus.stop()


def repo_path() -> Path:
    return Path(__file__).resolve().parents[2]
