"""The replay on two processes gives what one gives: the same alerts, at the same times, the same coverage.

The same history is replayed twice into one TSDB, a day apart: by one process, then by two (parallel.py); one
Prometheus evaluates both, and every episode of the second is the first's, a day later."""

from __future__ import annotations

import pytest

from oomguard.backtest.files import FileHistory
from oomguard.backtest.history import GpuRow, Step
from oomguard.backtest.ooms import Oom
from oomguard.backtest.parallel import Dealer
from oomguard.backtest.report import Report
from oomguard.backtest.rules import rule_set
from oomguard.backtest.run import Options, judge_history, replay_history
from oomguard.backtest.tsdb import Backfill, Prometheus
from oomguard.bundle.bundle_config import load_bundle_config
from oomguard.exporter.config import TrendConfig
from tests.backtest.histories import T0, synthetic_rows, write_csv

DAY = 86400.0


def history_rows(t0: float) -> list[dict[str, object]]:
    rows = synthetic_rows(hours=3, gpus=4, step=15.0, t0=t0, leak=(3, 1.0, 1.6))
    for row in rows:
        if row["gpu"] in (0, 1):  # a tensor-parallel engine on GPUs 0 and 1
            row["target"] = "vllm-tp"
        if row["gpu"] == 2:  # a GPU no engine is known on
            for key in ("target", "engine", "kv_cache_usage", "waiting", "running", "preemptions_total",
                        "gpu_memory_utilization"):  # fmt: skip
                row.pop(key, None)
    return rows


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, Report]:
    workdir = tmp_path_factory.mktemp("parallel")
    rules = rule_set(load_bundle_config(), 30.0)
    backfill = Backfill(workdir)
    replayed = []
    for day, jobs in enumerate((1, 2)):
        t0 = T0 + day * DAY
        options = Options(load_bundle_config(), trend=TrendConfig().settings(), jobs=jobs)
        path = write_csv(workdir / f"jobs-{jobs}.csv", history_rows(t0))
        ooms = [Oom(t0 + 1.6 * 3600, gpu="3", node="node-1")]
        replayed.append((replay_history(FileHistory(path), f"jobs {jobs}", options, rules, backfill), ooms, options))
    blocks = backfill.finish()
    with Prometheus(workdir, blocks, replayed[0][0].lookback) as prometheus:
        one, two = (judge_history(prometheus, r, o, rules, ooms)[0] for r, ooms, o in replayed)
    return one, two


def test_two_processes_raise_the_same_alerts_at_the_same_times(reports: tuple[Report, Report]) -> None:
    one, two = reports

    def shifted(report: Report, by: float) -> set[tuple]:
        return {
            (e.alert, tuple(sorted(e.labels.items())), e.active_at - by, e.fired_at and e.fired_at - by,
             e.resolved_at and e.resolved_at - by)
            for episodes in report.episodes.values() for e in episodes
        }  # fmt: skip

    assert shifted(one, 0) == shifted(two, DAY)
    assert any(e.fired_at for eps in one.episodes.values() for e in eps)  # something to compare
    assert one.ooms[0].first_page is not None
    assert one.ooms[0].first_page.lead_seconds == two.ooms[0].first_page.lead_seconds


def test_and_the_same_coverage(reports: tuple[Report, Report]) -> None:
    one, two = reports
    assert one.summary.samples == two.summary.samples and one.summary.steps == two.summary.steps
    assert {k: v.judged_seconds for k, v in one.summary.gpus.items()} == {
        k: v.judged_seconds for k, v in two.summary.gpus.items()
    }
    assert {k: sorted(v) for k, v in one.summary.targets.items()} == {
        k: sorted(v) for k, v in two.summary.targets.items()
    }


def test_an_engine_and_its_gpus_go_to_one_worker() -> None:
    dealer = Dealer(2)
    step = Step(T0, [GpuRow("n", "0", targets=["tp"]), GpuRow("n", "1", targets=["tp"]), GpuRow("n", "2"),
                     GpuRow("n", "3", targets=["b"])])  # fmt: skip
    parts = dealer.deal(step)
    assert [[g.gpu for g in part.gpus] for part in parts] == [["0", "1", "3"], ["2"]]
    # Later, GPU 2 gets an engine: it stays with its worker, and so does the engine.
    later = dealer.deal(Step(T0 + 15, [GpuRow("n", "2", targets=["c"])]))
    assert [len(part.gpus) for part in later] == [0, 1]
