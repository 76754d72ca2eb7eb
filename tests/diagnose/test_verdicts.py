"""Every verdict from a history shaped like a drill scenario, through a real Prometheus and the real CLI."""

from __future__ import annotations

import json

import pytest

from oomguard.cli import main
from oomguard.diagnose import diagnose_prometheus

EXPECTED = {
    "incident": "memory_overcommit",
    "slow-leak": "memory_leak",
    "foreign-process": "foreign_process",
    "probe-kill": "probe_kill",
    "probe-kill-liveness": "probe_kill",
    "startup-memory": "startup_memory",
    "healthy": "healthy",
    "tight-steady": "healthy",  # 95.6 % of the GPU: vLLM's reservation at 0.95, not the top
    "bare": "insufficient_data",
    # The two-knob check's histories (test_capacity.py): healthy memory, told apart in step 3.
    "over-admitted": "healthy",
    "within-cap": "healthy",
    "few-running": "healthy",
    "sglang-over": "healthy",
}


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    status = main(["diagnose", *args, "--json"])
    return status, json.loads(capsys.readouterr().out)


def one_diagnosis(capsys: pytest.CaptureFixture[str], backfilled, instance: str, *args: str) -> dict:
    """The one diagnosis of `instance` in the backfilled histories at their time, as `diagnose --json` writes it."""
    _, body = run_json(
        capsys, "--prometheus", backfilled.url, "--at", str(backfilled.at), "--instance", instance, *args
    )
    (d,) = body["diagnoses"]
    return d


@pytest.mark.parametrize("instance", list(EXPECTED))
def test_verdict(backfilled, capsys, instance: str) -> None:
    status, body = run_json(capsys, "--prometheus", backfilled.url, "--at", str(backfilled.at), "--instance", instance)
    (diagnosis,) = body["diagnoses"]
    assert diagnosis["verdict"] == EXPECTED[instance], diagnosis["summary"]
    assert (diagnosis["target"], diagnosis["instance"]) == ("vllm", instance)
    verdict = EXPECTED[instance]
    assert status == (0 if verdict == "healthy" else 2 if verdict == "insufficient_data" else 1)
    if verdict != "insufficient_data":
        assert diagnosis["confidence"] >= 0.75
        steps = [item["step"] for item in diagnosis["evidence"]]
        assert steps == sorted(steps) and set(steps) == {1, 2, 3, 4}, "the postmortem's order, every question"


def test_incident_evidence_and_recommendations(backfilled) -> None:
    (d,) = diagnose_prometheus(backfilled.url, at=backfilled.at, window=3600, instance="incident", max_num_seqs=64)
    found = " ".join(item.finding for item in d.evidence)
    assert "cuda_oom: 8 event(s)" in found and "KV cache use peaked at 100.0 %" in found
    recs = {r.setting: r for r in d.recommendations}
    # docs/diagnose.md, worked example 1 (with the pool exported: 40 GiB of 80).
    assert (recs["gpu_memory_utilization"].current, recs["gpu_memory_utilization"].suggested) == (0.9, 0.85)
    assert (recs["max_num_seqs"].current, recs["max_num_seqs"].suggested) == (64, 11)
    probe = recs["probe initial delay (or startup probe budget)"]
    assert (probe.current, probe.suggested) == (60.0, 360)
    assert "bundle" in d.probe_source


def test_probe_delay_flag_changes_the_judgement(backfilled, capsys) -> None:
    """The same restarts with a probe grace longer than the startup: still probe_kill, less sure, no delay advice."""
    _, body = run_json(capsys, "--prometheus", backfilled.url, "--at", str(backfilled.at), "--instance", "probe-kill",
                       "--probe-delay", "300")  # fmt: skip
    (d,) = body["diagnoses"]
    assert d["verdict"] == "probe_kill" and d["confidence"] < 1
    assert d["probe_delay_source"] == "--probe-delay"
    assert [r["setting"] for r in d["recommendations"]] == ["liveness probe"]


def test_healthy_and_leak_recommendations(backfilled) -> None:
    (healthy,) = diagnose_prometheus(backfilled.url, at=backfilled.at, instance="healthy")
    assert healthy.recommendations == []
    (leak,) = diagnose_prometheus(backfilled.url, at=backfilled.at, instance="slow-leak")
    assert [r.setting for r in leak.recommendations] == ["the leak"]
    (start,) = diagnose_prometheus(backfilled.url, at=backfilled.at, instance="startup-memory")
    (util,) = start.recommendations
    # docs/diagnose.md, worked example 4: 20 % held by another process.
    assert (util.setting, util.current, util.suggested) == ("gpu_memory_utilization", None, 0.75)


def test_missing_series_is_insufficient_data(backfilled, capsys) -> None:
    status, body = run_json(capsys, "--prometheus", backfilled.url, "--at", str(backfilled.at), "--instance", "nowhere")
    (d,) = body["diagnoses"]
    assert d["verdict"] == "insufficient_data" and status == 2
    assert "--instance" in d["summary"]
    # Outside the history's window: nothing either.
    status, body = run_json(capsys, "--prometheus", backfilled.url, "--at", str(backfilled.at - 86400),
                            "--instance", "incident")  # fmt: skip
    assert body["diagnoses"][0]["verdict"] == "insufficient_data" and status == 2


def test_every_target_when_no_instance_given(backfilled, capsys) -> None:
    status, body = run_json(capsys, "--prometheus", backfilled.url, "--at", str(backfilled.at))
    verdicts = {d["instance"]: d["verdict"] for d in body["diagnoses"]}
    # Each history also without its per-GPU join (test_fallback.py): the same verdicts.
    assert verdicts == EXPECTED | {f"{name}-nojoin": verdict for name, verdict in EXPECTED.items()}
    assert status == 1
    for d in body["diagnoses"]:
        assert set(d) >= {"target", "instance", "verdict", "confidence", "summary", "evidence", "recommendations"}


def test_text_puts_the_verdict_first(backfilled, capsys) -> None:
    status = main(["diagnose", "--prometheus", backfilled.url, "--at", str(backfilled.at), "--instance", "incident"])
    out = capsys.readouterr().out
    assert status == 1
    assert out.startswith("MEMORY_OVERCOMMIT  vllm on incident")
    assert (
        out.index("1. memory trend") < out.index("2. engine log") < out.index("3. concurrency") < out.index("4. probe")
    )
