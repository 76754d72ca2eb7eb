"""diagnose's thresholds are the bundle configuration's: one source of truth with the rules, read from the
user's file with --bundle-config; one reading judges the present and calls nothing a peak.

The histories of histories.py are read as diagnose reads them, without a Prometheus (test_rough_edges.py's `read`),
but where the CLI itself is the subject (the backfilled Prometheus of conftest.py)."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from oomguard.bundle.bundle_config import load_bundle_config
from oomguard.bundle.thresholds import default_thresholds, load_thresholds
from oomguard.cli import main
from oomguard.common.ports import free_port
from oomguard.diagnose import evidence, report
from tests.diagnose import histories
from tests.diagnose.test_rough_edges import one, pinned_in_the_reservation, read, watched_climb


def test_the_thresholds_are_the_rules_numbers() -> None:
    """Each threshold diagnose shares with a rule is read from the bundle configuration, not written again."""
    a = load_bundle_config().alerts
    t = default_thresholds()
    assert (t.headroom_critical, t.used_critical) == (a.gpu_memory_critical.headroom_threshold,
                                                      a.gpu_memory_critical.threshold)  # fmt: skip
    assert t.used_high == a.gpu_memory_high.threshold
    assert t.over_budget_margin == a.over_budget.margin_ratio
    assert t.exhausted_soon_seconds == a.exhausted_soon.seconds
    assert (t.oom_window_seconds, t.restart_storm_count, t.restart_storm_window_seconds) == (600, 3, 900)
    assert (t.kv_saturated, t.queue_backlog) == (a.kv_cache_saturated.threshold, a.queue_backlog.threshold)
    assert t.probe_delay_seconds == a.startup_slower_than_probe.probe_initial_delay_seconds
    assert {p.name: p.severity for p in t.pages} == {
        "OomGuardGpuMemoryCritical": "critical", "OomGuardTargetMemoryOverBudget": "warning",
        "OomGuardGpuMemoryExhaustedSoon": "critical", "OomGuardOomEvent": "critical",
        "OomGuardRestartStorm": "critical",
    }  # fmt: skip
    # The old copies are gone: nothing in diagnose to drift from the rules.
    for name in ("KV_SATURATED", "WAITING_BACKLOG", "TOP", "HEADROOM_TOP"):
        assert not hasattr(evidence, name), name


def bundle(tmp_path, **alerts) -> str:
    path = tmp_path / "bundle.yaml"
    path.write_text(yaml.safe_dump({"alerts": alerts}))
    return str(path)


def test_the_users_bundle_moves_the_top(tmp_path) -> None:
    """A team whose rules page at another share of the headroom has diagnose call that the top."""
    # The watched climb's last instant: 96 % of the headroom in use, above the default 75 %.
    assert one(read(watched_climb(), history=False)).facts.memory_top  # type: ignore[union-attr]
    higher = load_thresholds(bundle(tmp_path, gpu_memory_critical={"headroom_threshold": 0.99}))
    d = one(read(watched_climb(), history=False), thresholds=higher)
    assert d.facts is not None and not d.facts.memory_top
    assert "OomGuardGpuMemoryCritical" not in {p.name for p, _ in d.facts.paging}
    assert d.json()["thresholds_source"] == f"bundle configuration {higher.source}"
    # vLLM at 0.95 pinned at 97.6 % used: 52 % of its headroom, the top only for rules that page below that.
    assert not one(read(pinned_in_the_reservation())).facts.memory_top  # type: ignore[union-attr]
    lower = load_thresholds(bundle(tmp_path, gpu_memory_critical={"headroom_threshold": 0.3}))
    d = one(read(pinned_in_the_reservation()), thresholds=lower)
    assert d.facts is not None and d.facts.memory_top and d.criteria["memory at the top"]


def test_the_cli_reads_the_users_bundle(backfilled, tmp_path, capsys) -> None:
    path = tmp_path / "bundle.yaml"
    path.write_text(yaml.safe_dump({"alerts": {"startup_slower_than_probe": {"probe_initial_delay_seconds": 300}}}))
    status = main(["diagnose", "--prometheus", backfilled.url, "--at", str(backfilled.at), "--instance", "incident",
                   "--json", "--bundle-config", str(path)])  # fmt: skip
    (d,) = json.loads(capsys.readouterr().out)["diagnoses"]
    assert status == 1 and d["verdict"] == "memory_overcommit"
    assert d["thresholds_source"] == f"bundle configuration {path}"
    assert d["probe_delay_seconds"] == 300 and str(path) in d["probe_delay_source"]
    assert d["time_scale"] == 1 and d["pages_now"] == []  # a history: its verdict is the window's


def test_a_bundle_config_that_is_none_is_refused_before_anything_is_read(tmp_path, capsys) -> None:
    bad = tmp_path / "bundle.yaml"
    bad.write_text("alerts:\n  gpu_memory_critical: {headroom_treshold: 0.6}\n")
    # Nothing listens on the port: had diagnose read first, it would fail on that instead.
    status = main(["diagnose", "--exporter", f"http://127.0.0.1:{free_port()}", "--bundle-config", str(bad)])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err.startswith("oomguard diagnose: --bundle-config: ") and "headroom_treshold" in err, err
    assert "127.0.0.1" not in err


@pytest.mark.parametrize(
    "make",
    [histories.incident, histories.foreign_process, histories.slow_leak, watched_climb],
    ids=lambda m: m.__name__,
)
def test_one_reading_calls_nothing_a_peak(make) -> None:
    """From one reading every figure is the value now: "peak" only where it says the peak is not known."""
    d = one(read(make(), history=False))
    text = report.text([d])
    assert not re.search(r"\bpeak(ed)?\b", text.replace("its peak is not known", "")), text
    # Over the history the same figures are peaks, and say so.
    assert "peak" in report.text([one(read(make()))])


def test_one_reading_names_the_pages_that_hold_now() -> None:
    """The watched climb's last instant, trend or no trend: memory at the top, named as the rules page on it."""
    data = read(watched_climb(), history=False)
    data.series = [s for s in data.series if "trend_state" not in s.name]  # the trend not known yet
    d = one(data)
    assert d.verdict == "memory_overcommit" and "at the top now" in d.summary
    assert "OomGuardGpuMemoryCritical: GPU 0: 96.0 % of the headroom" in d.summary
    pages = {p["alert"]: p["severity"] for p in d.json()["pages_now"]}
    assert pages["OomGuardGpuMemoryCritical"] == "critical"
    assert any("now, as the shipped rules judge it: OomGuardGpuMemoryCritical (critical)" in i.finding
               for i in d.evidence)  # fmt: skip
