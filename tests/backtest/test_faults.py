"""Histories with faults, through the whole backtest (one Prometheus for them all, each a day after the other): a
gap, a counter reset, a GPU that disappears, a clock stepped back, a GPU never judged; and what is counted as a
lead, as a false page, and per GPU-day."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from oomguard.backtest.files import FileHistory
from oomguard.backtest.ooms import Oom
from oomguard.backtest.report import Report
from oomguard.backtest.rules import rule_set
from oomguard.backtest.run import Options, judge_history, replay_history
from oomguard.backtest.tsdb import Backfill, Prometheus
from oomguard.bundle.bundle_config import load_bundle_config
from oomguard.exporter.config import TrendConfig
from tests.backtest.histories import T0, write_csv

Share = Callable[[float], float | None]  # a GPU's used share at a minute (None: no row for it)
STEP = 15.0
DAY = 86400.0
TOTAL = 80e9
MINUTE = 60.0


def rows(t0: float, minutes: float, gpus: dict[str, Share], **engine: object) -> list[dict[str, object]]:
    """Every STEP for `minutes`: each GPU's used share (its function of the minute; None: no row for it)."""
    out = []
    for i in range(int(minutes * MINUTE / STEP)):
        minute = i * STEP / MINUTE
        for gpu, share in gpus.items():
            ratio = share(minute)
            if ratio is None:
                continue
            row = {"time": t0 + i * STEP, "node": "n", "gpu": gpu, "used_bytes": ratio * TOTAL, "total_bytes": TOTAL}
            out.append({**row, **{k: (v(minute, i) if callable(v) else v) for k, v in engine.items()}})
    return out


def steady(minute: float) -> float:
    return 0.5


HOT = 0.98  # over GpuMemoryCritical's 97 % of the total (no reservation known), and flat: a page


def gap(minute: float) -> float | None:
    return None if 15 <= minute < 35 else HOT  # 20 minutes: longer than Critical's keep_firing_for (15m)


def gone(minute: float) -> float | None:
    return HOT if minute < 30 else None


def spike(start: float) -> Share:
    return lambda minute: HOT if start <= minute < start + 10 else 0.5


def kv_engine(grows_after_reset: bool) -> dict[str, object]:
    def preemptions(minute: float, i: int) -> float:
        if minute < 20:
            return 100
        return (i - 80) * 2 if grows_after_reset else 0  # the engine restarted: its counter from 0

    return {"target": "vllm", "kv_cache_usage": 0.97, "waiting": 0, "running": 5,
            "preemptions_total": preemptions, "gpu_memory_utilization": 0.9}  # fmt: skip


HISTORIES: dict[str, tuple[dict[str, Share], dict[str, object], list[tuple[float, str]]]] = {
    "gap": ({"0": gap}, {}, []),
    "reset": ({"0": lambda m: 0.905}, kv_engine(False), []),
    "reset-then-grows": ({"0": lambda m: 0.905}, kv_engine(True), []),
    "gone": ({"0": steady, "1": gone}, {}, []),
    "incidents": ({"0": spike(20), "1": spike(40)}, {}, [(30.0, "0")]),
    "never": ({"0": steady, "9": steady}, {}, []),
    "concurrency": (
        {"0": lambda m: 0.905},
        {
            "target": "vllm",
            "kv_cache_usage": 0.8,
            "waiting": 3,
            "running": 16,
            "preemptions_total": lambda m, i: i,
            "gpu_memory_utilization": 0.9,
            "max_num_seqs": 256,
        },
        [],
    ),
}


@pytest.fixture(scope="module")
def backtests(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Report]:
    workdir = tmp_path_factory.mktemp("faults")
    options = Options(load_bundle_config(), trend=TrendConfig().settings(), evaluation_interval=30.0)
    rules = rule_set(options.bundle, options.evaluation_interval)
    backfill = Backfill(workdir)
    replayed = {}
    for day, (name, (gpus, engine, ooms)) in enumerate(HISTORIES.items()):
        t0 = T0 + day * DAY
        history = rows(t0, 60, gpus, **engine)
        if name == "never":
            for row in history:
                if row["gpu"] == "9":
                    row["total_bytes"] = None  # no total, no free: its used share cannot be told
        if name == "gap":  # the clock steps back 5 minutes at minute 40, for 5 minutes of rows
            at = next(i for i, row in enumerate(history) if row["time"] >= t0 + 40 * MINUTE)
            history[at:at] = [{**row, "time": row["time"] - 5 * MINUTE} for row in history[at : at + 20]]
        path = write_csv(workdir / f"{name}.csv", history)
        oom_list = [Oom(t0 + minute * MINUTE, gpu=gpu, node="n") for minute, gpu in ooms]
        replayed[name] = (replay_history(FileHistory(path), name, options, rules, backfill), oom_list)
    blocks = backfill.finish()
    with Prometheus(workdir, blocks, replayed["gap"][0].lookback) as prometheus:
        return {name: judge_history(prometheus, r, options, rules, o)[0] for name, (r, o) in replayed.items()}


def episodes(report: Report, alert: str, **labels: str) -> list:
    return [
        e
        for e in report.episodes.get("OomGuard" + alert, [])
        if e.fired_at is not None and all(e.labels.get(k) == v for k, v in labels.items())
    ]


def minute(report: Report, t: float | None) -> float | None:
    return None if t is None else (t - report.start) / MINUTE


def test_a_gap_ends_the_alert_and_is_not_judged_time(backtests: dict[str, Report]) -> None:
    """No rows from 15 to 35: the page's series is stale within a step, the page held its keep_firing_for (15m) and
    then ended, and fired again after its `for:` (5m) once rows came back. The ticket holds 30m: one episode."""
    report = backtests["gap"]
    critical = episodes(report, "GpuMemoryCritical", gpu="0")
    assert len(critical) == 2  # ended by the gap, fired again after its `for:`
    assert 30 <= minute(report, critical[0].resolved_at) <= 31
    assert minute(report, critical[1].active_at) == pytest.approx(35, abs=0.5)
    assert minute(report, critical[1].fired_at) == pytest.approx(40, abs=0.5)
    assert len(episodes(report, "GpuMemoryHigh", gpu="0")) == 1
    cover = next(iter(report.summary.gpus.values()))
    assert cover.judged_seconds / MINUTE == pytest.approx(40, abs=1)  # 60 minutes less the 20 of the gap


def test_a_clock_step_back_drops_its_rows_and_the_report_says_so(backtests: dict[str, Report]) -> None:
    report = backtests["gap"]
    # 35:00 to 39:45 again after 39:45: the first 19 went back, the last is 39:45 itself, read twice.
    assert any("19 rows dropped: their time went back" in line for line in report.problems), report.problems
    assert any("1 row named a GPU already read at the same time" in line for line in report.problems)
    assert "their time went back" in report.text()


def test_a_counter_reset_is_no_increase(backtests: dict[str, Report]) -> None:
    """The engine's preemption counter drops to 0 (it restarted): rate() takes it as a reset, as Prometheus does, and
    KvCacheSaturated (a full KV cache with preemptions) stays quiet; where the counter grows after, it fires."""
    assert not episodes(backtests["reset"], "KvCacheSaturated")
    [fired] = episodes(backtests["reset-then-grows"], "KvCacheSaturated", target="vllm")
    assert 25 <= minute(backtests["reset-then-grows"], fired.fired_at) <= 27  # 20 + the rate's samples + for 5m


def test_a_gpu_that_disappears(backtests: dict[str, Report]) -> None:
    report = backtests["gone"]
    [critical] = episodes(report, "GpuMemoryCritical", gpu="1")
    # its series stale within a step and an evaluation, then the page held its keep_firing_for (15m)
    assert 45 <= minute(report, critical.resolved_at) <= 46
    cover = report.summary.gpus[("n", "1")]
    assert minute(report, cover.last) == pytest.approx(30, abs=0.3)
    assert cover.judged_seconds / MINUTE == pytest.approx(30, abs=1)


def test_a_gpu_never_judged_is_named(backtests: dict[str, Report]) -> None:
    report = backtests["never"]
    text = report.text()
    assert "GPUs never judged" in text and "n/GPU 9: no total (or free)" in text
    assert report.summary.gpus[("n", "9")].measured == 0


def test_leads_false_pages_and_gpu_days(backtests: dict[str, Report]) -> None:
    """GPU 0 spikes before its OOM: its page is a lead. GPU 1 spikes with no OOM of its own: a false page, though
    within the hour of GPU 0's incident (another GPU's)."""
    report = backtests["incidents"]
    [result] = report.ooms
    page = result.first_page
    assert page is not None and page.alert == "OomGuardGpuMemoryCritical" and page.labels["gpu"] == "0"
    assert page.lead_seconds / MINUTE == pytest.approx(5, abs=0.5)  # fired at 25 (its `for:` 5m), the OOM at 30
    false = [e for e in report.false_alarms if e.receiver == "page"]
    assert [e.labels["gpu"] for e in false] == ["1"]
    gpu_days = report.outcome.gpu_days
    assert gpu_days == pytest.approx(2 * 60 / 1440, rel=0.02)
    assert report.outcome.false_pages_per_gpu_day == pytest.approx(1 / gpu_days)
    data = report.json()
    assert '"pages_per_gpu_day"' in data and '"lead_seconds"' in data


def test_the_concurrency_cap_against_the_kv_cache(backtests: dict[str, Report]) -> None:
    """max_num_seqs 256 where the KV cache holds 16 / 0.8 = 20 requests, preempting, at a 0.9 reservation:
    ConcurrencyOverKvCache, once 15 minutes of such samples are in its hour and its `for:` (15m) has held."""
    report = backtests["concurrency"]
    [fired] = episodes(report, "ConcurrencyOverKvCache", target="vllm", setting="max_num_seqs")
    assert 29 <= minute(report, fired.fired_at) <= 32
