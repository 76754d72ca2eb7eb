"""The two-knob check (diagnose/capacity.py): the concurrency cap against the requests the KV cache held.

Through a real Prometheus holding the histories of histories.py (each KV cache holds about 16 requests of the
size it serves, 5 % either way) and the real CLI: both sides of the margin, too few requests, no setting series,
SGLang's knobs, and the check in the text, the JSON and the report.
"""

from __future__ import annotations

import math

import pytest

from oomguard.bundle.bundle_config import load_bundle_config
from oomguard.bundle.thresholds import default_thresholds
from oomguard.cli import main
from oomguard.diagnose import capacity, diagnose_prometheus
from tests.diagnose.test_verdicts import one_diagnosis

HELD = 16.0  # histories._admitting: requests of the served size the cache holds, within +-5 %


def findings(d: dict) -> str:
    return "\n".join(item["finding"] for item in d["evidence"])


def test_the_thresholds_are_the_bundles_alert() -> None:
    """diagnose and the ConcurrencyOverKvCache alert judge the same way: on the bundle configuration's numbers."""
    alert = load_bundle_config().alerts.concurrency_over_kv_cache
    bundle = (alert.min_running, alert.min_kv_usage, alert.quantile, alert.margin_ratio, alert.reservation_threshold)
    t = default_thresholds()
    assert bundle == (t.min_running, t.min_kv_usage, t.quantile, t.margin, t.reservation_high)
    assert alert.concurrency_settings == capacity.CONCURRENCY_SETTINGS
    assert alert.reservation_settings == capacity.RESERVATION_SETTINGS


def test_quantile_interpolates_as_prometheus_does() -> None:
    # quantile_over_time(0.9, ...) of 1, 2, 3, 4: rank 0.9 x 3 = 2.7, between 3 and 4.
    assert capacity.quantile([4.0, 1.0, 3.0, 2.0], 0.9) == pytest.approx(3.7)
    assert capacity.quantile([5.0], 0.9) == 5.0
    # Too few requests or too little of the cache in use say nothing: those samples are left out.
    points = capacity.capacity_points([(0, 8.0), (1, 3.0), (2, 8.0)], [(0, 0.5), (1, 0.2), (2, 0.05)], 4, 0.1)
    assert points == [(0, 16.0)]


def test_over_the_cap_with_the_reservation_high(backfilled, capsys) -> None:
    d = one_diagnosis(capsys, backfilled, "over-admitted")
    check = d["concurrency_check"]
    held = check["kv_cache_capacity_requests"]
    assert HELD / 1.05 <= held <= HELD / 0.95 and check["samples"] >= capacity.MIN_SAMPLES
    assert check["concurrency"] == {"name": "max_num_seqs", "value": 256.0, "origin": "flag"}
    assert check["ratio"] == pytest.approx(256 / held, rel=1e-3) and check["over_capacity"]
    assert check["reservation"]["value"] == 0.9 and check["reservation_high"] and check["preemptions"] > 0
    # Healthy memory: the verdict stays, and says what step 3 found.
    assert d["verdict"] == "healthy" and "max_num_seqs 256 admits" in d["summary"]
    assert "max_num_seqs 256 (its command line) admits" in findings(d)
    assert "the cache cannot grow" in findings(d) and "preemption(s) confirm it" in findings(d)
    (rec,) = d["recommendations"]
    assert (rec["setting"], rec["current"], rec["suggested"]) == ("max_num_seqs", 256, math.floor(held * 0.8))
    # Both knobs, with numbers: keep the reservation, or lower both (no pool exported: 0.85 / 0.90 of it).
    assert "keep gpu_memory_utilization at 0.9" in rec["why"]
    both = math.floor(held * 0.8 * 0.85 / 0.9)
    assert f"or lower both: gpu_memory_utilization 0.85 and max_num_seqs {both}" in rec["why"]


def test_within_the_margin_is_no_finding(backfilled, capsys) -> None:
    d = one_diagnosis(capsys, backfilled, "within-cap")
    check = d["concurrency_check"]
    assert 1 < check["ratio"] <= 1 + default_thresholds().margin and not check["over_capacity"]
    assert "max_num_seqs 18 (its command line) is 1.1x the requests the KV cache held: within" in findings(d)
    assert d["recommendations"] == [] and "admits" not in d["summary"]


def test_too_few_requests_say_nothing(backfilled, capsys) -> None:
    d = one_diagnosis(capsys, backfilled, "few-running")
    check = d["concurrency_check"]
    assert check["kv_cache_capacity_requests"] is None and check["samples"] == 0 and not check["over_capacity"]
    assert "the KV cache's capacity in requests is not known" in findings(d)
    assert d["recommendations"] == []


def test_sglang_knobs_with_room_to_grow(backfilled, capsys) -> None:
    d = one_diagnosis(capsys, backfilled, "sglang-over")
    check = d["concurrency_check"]
    assert check["concurrency"]["name"] == "max_running_requests" and check["over_capacity"]
    assert check["reservation"] == {"name": "mem_fraction_static", "value": 0.8, "origin": "flag"}
    assert not check["reservation_high"]
    (rec,) = d["recommendations"]
    held = check["kv_cache_capacity_requests"]
    assert (rec["setting"], rec["current"], rec["suggested"]) == ("max_running_requests", 64, math.floor(held * 0.8))
    grown = math.floor(held * 0.8 * 0.85 / 0.8)
    assert "raise mem_fraction_static 0.8 -> 0.85 (15 % headroom, no further)" in rec["why"]
    assert f"max_running_requests {grown}: the two together" in rec["why"]
    assert "no preemption yet" in rec["why"]


def test_setting_unknown_says_which_flag_and_where_it_is_read(backfilled, capsys) -> None:
    d = one_diagnosis(capsys, backfilled, "healthy")
    assert d["concurrency_check"]["concurrency"] is None and d["concurrency_check"]["kv_cache_capacity_requests"]
    found = findings(d)
    assert "max_num_seqs unknown: no oomguard_engine_setting series" in found
    assert "a local engine's command line: start the engine with --max-num-seqs set" in found
    assert d["recommendations"] == []
    # Given on diagnose's command line instead, the same history is judged on it.
    d = one_diagnosis(capsys, backfilled, "healthy", "--max-num-seqs", "256")
    assert d["concurrency_check"]["concurrency"]["origin"] == "--max-num-seqs"
    assert d["concurrency_check"]["over_capacity"]
    assert [r["setting"] for r in d["recommendations"]] == ["max_num_seqs"]


def test_in_the_text_and_the_report(backfilled, capsys, tmp_path) -> None:
    path = tmp_path / "over.md"
    main(["diagnose", "--prometheus", backfilled.url, "--at", str(backfilled.at), "--instance", "over-admitted",
          "--report", str(path)])  # fmt: skip
    out = capsys.readouterr().out
    step3 = out[out.index("3. concurrency") : out.index("4. probe")]
    assert "the KV cache held at most" in step3 and "max_num_seqs 256 (its command line) admits" in step3
    assert "     - max_num_seqs: 256 -> " in out and "or lower both: gpu_memory_utilization 0.85" in out
    text = path.read_text()
    assert "| 3 | concurrency and memory configuration | max_num_seqs 256 (its command line) admits" in text
    assert "| max_num_seqs | 256 |" in text


def test_incident_names_what_the_cache_held(backfilled) -> None:
    """A memory verdict sizes the cap from saturation (docs/diagnose.md) and says what the cache held beside it."""
    (d,) = diagnose_prometheus(backfilled.url, at=backfilled.at, instance="incident", max_num_seqs=64)
    rec = {r.setting: r for r in d.recommendations}["max_num_seqs"]
    assert rec.current == 64 and "requests of the observed size at most" in rec.why
    assert d.facts is not None and d.facts.capacity_check.cap.origin == "--max-num-seqs"


def test_an_engine_without_such_a_cap_is_not_asked_for_one() -> None:
    """llama.cpp's `parallel` splits its context between its slots: no max_num_seqs to ask for, nor to suggest."""
    from oomguard.diagnose.evidence import Facts, evidence
    from tests.diagnose.histories import _admitting

    moments = [(float(t), _admitting(float(t))) for t in range(0, 3600, 15)]
    facts = Facts("llama", "host:9847", ["0"], True, 0.0, 3600.0, engine="llamacpp",
                  running=[(t, m.running) for t, m in moments], kv=[(t, m.kv) for t, m in moments])  # fmt: skip
    check = facts.capacity_check
    assert check.capacity is not None and check.cap is None and not check.flagged
    found = [item.finding for item in evidence(facts, 60.0, "test") if item.step == 3]
    assert any("llamacpp has no concurrency cap of the kind compared here" in f for f in found)
    assert not any("unknown" in f for f in found)
