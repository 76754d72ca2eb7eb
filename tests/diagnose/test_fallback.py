"""Without the per-GPU join: the same verdicts from the target-level and per-process series, less sure.

Each history of histories.py is also backfilled without its per-GPU join series (instances NAME-nojoin, the
JOIN_SERIES left out): what a Prometheus holds of an older exporter, or of a GPU whose join could not be written.
The target's budget, over-budget and own processes' memory are still there; the diagnosis must reach the verdict
and the recommendations of the joined history, name the evidence it used and the evidence that was missing, and
be less confident.
"""

from __future__ import annotations

import pytest

from oomguard.cli import main
from oomguard.diagnose import diagnose_data, diagnose_prometheus
from oomguard.diagnose.query import Data, Series
from tests.diagnose import histories
from tests.diagnose.histories import JOIN_SERIES
from tests.diagnose.test_verdicts import EXPECTED, one_diagnosis

# A diagnosis's keys before the fallback (docs/diagnose.md): they stay.
KEYS = {"target", "instance", "gpus", "verdict", "confidence", "confidence_label", "summary", "criteria", "evidence",
        "recommendations", "concurrency_check", "probe_delay_seconds", "probe_delay_source", "time_scale"}  # fmt: skip


def recs(d: dict) -> list[tuple]:
    return [(r["setting"], r["current"], r["suggested"], r["unit"]) for r in d["recommendations"]]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_same_verdict_without_the_join(backfilled, capsys, name: str) -> None:
    joined = one_diagnosis(capsys, backfilled, name, "--max-num-seqs", "64")
    bare = one_diagnosis(capsys, backfilled, histories.instance(name, join=False), "--max-num-seqs", "64")
    assert bare["verdict"] == joined["verdict"] == EXPECTED[name], bare["summary"]
    assert recs(bare) == recs(joined)
    assert set(bare) >= KEYS and set(joined) >= KEYS, "the JSON keys stay; new ones are added"
    if joined["memory_evidence"] != "gpu_join":
        # No reservation known (the engine never answered, or no memory series): the join was never due.
        assert bare["memory_evidence"] == joined["memory_evidence"] and bare["confidence"] == joined["confidence"]
        assert not set(JOIN_SERIES) & set(joined["evidence_missing"])
        return
    assert set(JOIN_SERIES) & set(joined["evidence_used"])
    assert not joined["evidence_missing"]
    assert bare["memory_evidence"] == "target_level"
    assert set(bare["evidence_missing"]) == set(JOIN_SERIES)
    assert not set(JOIN_SERIES) & set(bare["evidence_used"])
    assert {"oomguard_target_memory_budget_bytes", "oomguard_target_process_gpu_memory_bytes"} <= set(
        bare["evidence_used"]
    )
    # The same criteria met, on weaker evidence.
    assert bare["criteria"] == joined["criteria"]
    assert 0 < bare["confidence"] < joined["confidence"]
    finding = " ".join(item["finding"] for item in bare["evidence"] if item["step"] == 1)
    assert "no per-GPU join series" in finding


def test_tight_reservation_is_not_the_top(backfilled) -> None:
    """vLLM at 0.95 shows 95.6 % all hour: without the join, its budget says that is the reservation."""
    (d,) = diagnose_prometheus(backfilled.url, at=backfilled.at, instance="tight-steady-nojoin")
    assert d.verdict == "healthy", d.summary
    assert d.facts is not None and d.facts.headroom_used_peak is not None and d.facts.headroom_used_peak < 0.5


def test_foreign_process_told_apart_by_the_engines_own_memory(backfilled) -> None:
    (d,) = diagnose_prometheus(backfilled.url, at=backfilled.at, instance="foreign-process-nojoin")
    assert d.verdict == "foreign_process", d.summary
    found = " ".join(item.finding for item in d.evidence)
    # 0.6 % -> 9.6 % of the GPU: the GPU's use less the engine's own processes'.
    assert "other processes on the GPU grew by 9.0 % of it (to 9.6 %)" in found


def test_text_says_what_was_missing(backfilled, capsys) -> None:
    status = main(["diagnose", "--prometheus", backfilled.url, "--at", str(backfilled.at), "--instance",
                   "incident-nojoin"])  # fmt: skip
    out = capsys.readouterr().out
    assert status == 1 and out.startswith("MEMORY_OVERCOMMIT  vllm on incident-nojoin")
    line = next(x for x in out.splitlines() if "no per-GPU join series" in x)
    assert "oomguard_gpu_memory_headroom_used_ratio" in line and "oomguard_target_memory_budget_bytes" in line


def _data(h: histories.History, join: bool) -> Data:
    """A history read straight from histories.samples, no Prometheus: the fallback's inputs by hand."""
    start = 1.8e9  # a window away from 0, which a last event's timestamp would otherwise fall in
    series = [Series(name, dict(labels), points) for (name, labels), points in histories.samples(h, start, join=join)
              .items()]  # fmt: skip
    return Data(series, start, start + histories.SPAN, history=True, source="test")


def test_without_own_processes_less_sure_still() -> None:
    """A remote engine: NVML does not list its pids, so whose bytes are whose is unknown. Headroom is judged on the
    GPU's use less the budget, other processes cannot be told apart, and the confidence says so."""
    h = histories.foreign_process()
    h.own_processes = False
    (joined,) = diagnose_data(_data(h, join=True), probe_delay=60.0)
    (bare,) = diagnose_data(_data(h, join=False), probe_delay=60.0)
    assert bare.verdict == joined.verdict
    missing = bare.json()["evidence_missing"]
    assert set(missing) == {*JOIN_SERIES, "oomguard_target_process_gpu_memory_bytes"}
    assert bare.facts is not None and joined.facts is not None
    assert bare.facts.headroom_used_peak == pytest.approx(joined.facts.headroom_used_peak)
    assert bare.facts.other_growth_ratio is None
    # Less sure than with own processes known, which is less sure than with the join.
    attributed = histories.foreign_process()
    (known,) = diagnose_data(_data(attributed, join=False), probe_delay=60.0)
    assert known.verdict == "foreign_process"
    assert 0 < bare.confidence < known.confidence < 1.0
