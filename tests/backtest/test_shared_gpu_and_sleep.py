"""Through the whole backtest (the replay, promtool's blocks, one real Prometheus for the module, the rules, the
judge): a GPU shared by two engines, the second of which climbs beyond its reservation to an OOM; and an engine that
sleeps 8 hours and wakes (vLLM's sleep mode), with and without the history's `sleep_state` column."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from oomguard.backtest.files import FileHistory
from oomguard.backtest.ooms import Oom
from oomguard.backtest.report import Report
from oomguard.backtest.rules import Episode, rule_set
from oomguard.backtest.run import Options, judge_history, replay_history
from oomguard.backtest.tsdb import Backfill, Prometheus
from oomguard.bundle.bundle_config import load_bundle_config
from oomguard.exporter.config import TrendConfig
from tests.backtest.histories import T0

STEP = 15.0
MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0
TOTAL = 80e9
PAGES = ("OomGuardGpuMemoryExhaustedSoon", "OomGuardGpuMemoryCritical")
COLUMNS = ("time", "node", "gpu", "used_bytes", "total_bytes", "engine_used_bytes", "target", "kv_cache_usage",
           "waiting", "running", "preemptions_total", "gpu_memory_utilization", "sleep_state")  # fmt: skip
OOM_MINUTE = 100.0


def write(path: Path, rows: list[dict[str, object]]) -> Path:
    columns = [c for c in COLUMNS if any(c in row for row in rows)]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, columns, extrasaction="raise")
        writer.writeheader()
        writer.writerows(rows)
    return path


def engine(target: str, utilization: float, i: int, *, busy: bool = True) -> dict[str, object]:
    """A serving vLLM's figures at step i."""
    return {"target": target, "kv_cache_usage": round(0.3 + 0.1 * math.sin(i / 9), 3) if busy else 0.0,
            "waiting": 0, "running": 4 if busy else 0, "preemptions_total": 0,
            "gpu_memory_utilization": utilization}  # fmt: skip


def shared(t0: float) -> list[dict[str, object]]:
    """Engines a and b at 0.45 each on GPU 0 of node `shared`, a row each: each holds a little under its 36 GB; from
    minute 60 b's own memory climbs beyond its reservation and fills the 8 GB of headroom the two leave by minute 100,
    its OOM."""
    rows = []
    for i in range(int(OOM_MINUTE * MINUTE / STEP) + 1):
        minute = i * STEP / MINUTE
        a = 35.9e9 + 20e6 * math.sin(i / 5)
        b = 35.9e9 + 20e6 * math.cos(i / 7) + max(0.0, minute - 60) / 40 * 8.05e9
        for target, own in (("a", a), ("b", b)):
            rows.append({"time": t0 + i * STEP, "node": "shared", "gpu": 0, "used_bytes": round(a + b),
                         "total_bytes": TOTAL, "engine_used_bytes": round(own), **engine(target, 0.45, i)})  # fmt: skip
    return rows


def sleeping(t0: float, node: str, *, told: bool) -> list[dict[str, object]]:
    """Engine s at 0.9 on GPU 0 of `node`: 90.5 % for an hour, asleep 8 hours (its weights offloaded, 2 % left on the
    GPU), then awake at 90.5 % again for an hour. `told`: the history has the engine's sleep_state."""
    rows = []
    for i in range(int(10 * HOUR / STEP)):
        asleep = HOUR <= i * STEP < 9 * HOUR
        row: dict[str, object] = {"time": t0 + i * STEP, "node": node, "gpu": 0, "total_bytes": TOTAL,
                                  "used_bytes": round((0.02 if asleep else 0.905 + 0.0005 * math.sin(i / 7)) * TOTAL),
                                  **engine("s", 0.9, i, busy=not asleep)}  # fmt: skip
        if told:
            row["sleep_state"] = "weights_offloaded" if asleep else "awake"
        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def backtests(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Report]:
    workdir = tmp_path_factory.mktemp("shared-sleep")
    options = Options(load_bundle_config(), trend=TrendConfig().settings(), evaluation_interval=30.0)
    rules = rule_set(options.bundle, options.evaluation_interval)
    backfill = Backfill(workdir)
    histories = {
        "shared": (shared, [Oom(OOM_MINUTE * MINUTE, target="b")]),
        "sleep-told": (lambda t0: sleeping(t0, "sleep-told", told=True), []),
        "sleep-untold": (lambda t0: sleeping(t0, "sleep-untold", told=False), []),
    }
    replayed = {}
    for n, (name, (make, ooms)) in enumerate(histories.items()):
        t0 = T0 + 2 * n * DAY  # apart by more than any rule's range and offset (1d)
        path = write(workdir / f"{name}.csv", make(t0))
        found = [Oom(t0 + o.t, target=o.target) for o in ooms]
        replayed[name] = (replay_history(FileHistory(path), name, options, rules, backfill), found)
    blocks = backfill.finish()
    with Prometheus(workdir, blocks, replayed["shared"][0].lookback) as prometheus:
        return {name: judge_history(prometheus, r, options, rules, o)[0] for name, (r, o) in replayed.items()}


def fired(report: Report, *receivers: str) -> list[Episode]:
    return [e for eps in report.episodes.values() for e in eps if e.fired_at is not None and e.receiver in receivers]


def test_a_shared_gpu_whose_second_engine_climbs_beyond_its_reservation_is_paged_before_its_oom(
    backtests: dict[str, Report],
) -> None:
    report = backtests["shared"]
    assert report.summary.targets == {"a": {("shared", "0")}, "b": {("shared", "0")}}
    assert report.summary.gpus[("shared", "0")].targets == {"a", "b"}
    assert report.summary.gpus[("shared", "0")].headroom > 0  # judged on the headroom the two reservations leave
    [result] = report.ooms
    page = result.first_page
    assert page is not None, [(e.alert, e.fired_at) for e in fired(report, "page", "ticket")]
    assert page.alert in PAGES and page.labels["gpu"] == "0" and page.labels["node"] == "shared"
    assert 0 < page.lead_seconds <= report.window.before
    assert (report.outcome.incidents, report.outcome.paged, report.outcome.false_pages) == (1, 1, 0)
    # The engine beyond its budget is b, whose own bytes the rows tell apart from a's.
    over = [e for e in fired(report, "ticket") if e.alert == "OomGuardTargetMemoryOverBudget"]
    assert over and {e.labels["target"] for e in over} == {"b"}
    counted = [e for e in fired(report, "page") if e.alert in PAGES]
    assert counted and all(e.counted_as in ("lead", "aftermath") for e in counted)
    # The shipped routing pages group_wait (30 s) after the first page fired, for something.
    assert report.notifications is not None
    first = next(s for s in report.notifications.sent if s.receiver == "pager")
    assert first.at == page.fired_at + 30 and not first.for_nothing


@pytest.mark.parametrize("name", ["sleep-told", "sleep-untold"])
def test_an_engine_waking_from_8_hours_of_sleep_pages_no_one(backtests: dict[str, Report], name: str) -> None:
    """Its memory from 2 % back to 90.5 % in one step: with the sleep_state, the engine's reservation does not hold
    while it sleeps and its series start afresh on waking; without it, the wake is a jump. Neither is an incident."""
    report = backtests[name]
    assert fired(report, "page", "ticket") == []
    assert (report.outcome.false_pages, report.outcome.false_tickets) == (0, 0)
    assert report.notifications is not None and report.notifications.sent == []
    cover = report.summary.gpus[(name, "0")]
    assert cover.measured == 2400
    if name == "sleep-told":
        # Asleep, its reservation does not hold: the GPU is judged on its total those 8 hours.
        assert cover.headroom == pytest.approx(2 * HOUR / STEP, abs=2)
    else:
        assert cover.headroom == cover.measured
