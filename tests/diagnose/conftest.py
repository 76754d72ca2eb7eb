"""A real Prometheus holding the synthetic histories of histories.py, backfilled with promtool."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from oomguard.drill.services import Prometheus
from tests.diagnose import histories


@dataclass(frozen=True)
class Backfilled:
    url: str
    at: float  # the end of the histories: pass as --at
    compressed_at: float  # the end of the histories compressed by TIME_SCALE (instances NAME-x30)


@pytest.fixture(scope="session")
def backfilled(promtool: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfilled]:
    work = tmp_path_factory.mktemp("diagnose-prometheus")
    # Blocks younger than ~2 h may not be loaded at once: the histories end 3 h ago.
    end = float(int(time.time() - 3 * 3600))
    source = work / "histories.om"
    # Two hours before the others: no window of theirs sees them, even through Prometheus' 5-minute lookback.
    compressed_end = end - 2 * 3600
    compressed = (compressed_end - histories.SPAN / histories.TIME_SCALE, histories.TIME_SCALE)
    # Each history also without its per-GPU join (instances NAME-nojoin), over the same hour.
    source.write_text(histories.openmetrics(histories.all_histories(), end - histories.SPAN, compressed, nojoin=True))
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(work / "data")],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    # It scrapes nothing of ours: a closed port, once an hour.
    prometheus = Prometheus(work, ["127.0.0.1:9"], scrape_interval="1h", evaluation_interval="1h")
    prometheus.start()
    try:
        yield Backfilled(prometheus.url, end, compressed_end)
    finally:
        prometheus.stop()


def repo_path() -> Path:
    return Path(__file__).resolve().parents[2]
