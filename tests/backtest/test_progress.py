"""Progress while the history is replayed: a line every few seconds with the readings replayed, of about how many,
and the time left; none with --quiet. Made without real time: a clock that moves as told, or lines due at once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from oomguard.backtest import progress as progress_module
from oomguard.backtest.history import Step
from oomguard.backtest.progress import metered
from oomguard.backtest.source import PrometheusHistory, load_mapping
from oomguard.cli import main
from tests.backtest.histories import T0, synthetic_rows, write_csv

LINE = re.compile(r"backtest: ([\d,]+) of about ([\d,]+) readings replayed \((\d+) %, at 2024-05-01 [\d:]+ UTC\), "
                  r"(about \d+ (s|min) left|nearly read)$")  # fmt: skip


def test_a_line_every_few_seconds_with_the_count_the_share_and_the_time_left() -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0  # each step takes a second
        return now[0]

    lines: list[str] = []
    steps = [Step(T0 + 15 * i) for i in range(10)]
    passed = list(metered(iter(steps), lines.append, lambda s: (s.t - T0 + 15) / 150, started=0.0, clock=clock))
    assert passed == steps
    assert len(lines) == 10 // int(progress_module.PROGRESS_SECONDS)
    first = lines[0]
    assert first.startswith("3 of about 10 readings replayed (30 %, at 2024-05-01 00:00:30 UTC), about 7 s left"), first


def test_without_a_share_the_count_and_the_time_reached() -> None:
    lines: list[str] = []
    ticks = iter(range(100))
    list(metered(iter([Step(T0), Step(T0 + 3600)]), lines.append, clock=lambda: 10.0 * next(ticks)))
    assert lines == ["1 readings replayed (at 2024-05-01 00:00:00 UTC)",
                     "2 readings replayed (at 2024-05-01 01:00:00 UTC)"]  # fmt: skip


def test_a_prometheus_window_is_read_by_its_time() -> None:
    history = PrometheusHistory("http://prometheus:9090", load_mapping("dcgm", None), start=T0, end=T0 + 3600,
                                step=15, timeout=5)  # fmt: skip
    assert history.read_share(Step(T0 + 900)) == 0.25


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_csv(tmp_path_factory.mktemp("progress") / "history.csv", synthetic_rows(hours=2, gpus=2))


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_the_command_says_its_progress_on_stderr(
    history: Path, jobs: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(progress_module, "PROGRESS_SECONDS", 0.0)  # a line at every step: no waiting on real time
    assert main(["backtest", "--history", str(history), "--jobs", jobs]) == 0
    err = capsys.readouterr().err.splitlines()
    found = [LINE.match(line) for line in err]
    counts = [int(m[1].replace(",", "")) for m in found if m]
    assert counts == list(range(1, 481)), err[:5]  # 2 hours every 15 s, each counted as it is read
    totals = [int(m[2].replace(",", "")) for m in found if m]
    # The share is of the bytes read, a few KiB of buffers ahead of the steps: close in a file of 76 KB's second half.
    assert totals[-1] == 480 and all(400 <= total <= 480 for total in totals[len(totals) // 2 :]), totals[::40]
    assert "backtest: 480 readings replayed, " in "\n".join(err)


def test_quiet_says_nothing(history: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(progress_module, "PROGRESS_SECONDS", 0.0)
    assert main(["backtest", "--history", str(history), "--quiet"]) == 0
    assert capsys.readouterr().err == ""
