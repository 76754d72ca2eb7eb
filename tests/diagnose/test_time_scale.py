"""A drill's compressed clock: the same histories 30 times faster, read with time_scale=30, judged the same.

The compressed histories (instances NAME-x30, see histories.py) are what a drill's Prometheus holds of the same
scenarios: their timestamps, the startups and event times the exporter measures, all divided by 30. Read with
`time_scale=30`, every verdict, confidence and recommendation is the one of the history at life's pace, the probe
delay is in simulated seconds, and the report reads in the scenario's minutes.
"""

from __future__ import annotations

import json
import re

import pytest

from oomguard.cli import main
from oomguard.diagnose import DiagnoseError, diagnose_prometheus
from oomguard.diagnose.query import query_step
from tests.diagnose import histories
from tests.diagnose.histories import TIME_SCALE
from tests.diagnose.test_verdicts import EXPECTED

WINDOW = histories.SPAN / TIME_SCALE  # the compressed hour: 2 real minutes


def compressed(backfilled, name: str, time_scale: float = TIME_SCALE, **kwargs):
    (d,) = diagnose_prometheus(backfilled.url, at=backfilled.compressed_at, window=WINDOW,
                               instance=histories.instance(name, TIME_SCALE), time_scale=time_scale,
                               **kwargs)  # fmt: skip
    return d


def life(backfilled, name: str, **kwargs):
    (d,) = diagnose_prometheus(backfilled.url, at=backfilled.at, window=histories.SPAN, instance=name, **kwargs)
    return d


def recs(d) -> list[tuple]:
    return [(r.setting, r.current, r.suggested, r.unit) for r in d.recommendations]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_same_verdict_and_recommendations_as_at_lifes_pace(backfilled, name: str) -> None:
    fast, slow = compressed(backfilled, name, max_num_seqs=64), life(backfilled, name, max_num_seqs=64)
    assert fast.verdict == slow.verdict == EXPECTED[name], fast.summary
    assert (fast.confidence, fast.criteria) == (slow.confidence, slow.criteria)
    assert recs(fast) == recs(slow)
    assert [item.step for item in fast.evidence] == [item.step for item in slow.evidence]
    assert fast.time_scale == TIME_SCALE and fast.json()["time_scale"] == TIME_SCALE
    if fast.facts is not None and slow.facts is not None:
        assert fast.facts.startup_seconds == pytest.approx(slow.facts.startup_seconds)
        assert (fast.facts.climb is None) == (slow.facts.climb is None)


def test_incident_reads_in_simulated_seconds(backfilled) -> None:
    d = compressed(backfilled, "incident", max_num_seqs=64)
    found = " ".join(item.finding for item in d.evidence)
    # The exporter measured 8 s of real time: 240 s of the scenario, against the 60 s probe delay (simulated).
    assert "measured startup 240s (8.0s real at 30x) > probe delay 60s" in found
    assert "over 11 min" in found  # the climb, in the scenario's minutes
    by_setting = {r.setting: r for r in d.recommendations}
    assert (by_setting["gpu_memory_utilization"].current, by_setting["gpu_memory_utilization"].suggested) == (0.9, 0.85)
    assert (by_setting["max_num_seqs"].current, by_setting["max_num_seqs"].suggested) == (64, 11)
    probe = by_setting["probe initial delay (or startup probe budget)"]
    assert (probe.current, probe.suggested, probe.unit) == (60.0, 360, "seconds")
    assert "took 240s to start" in probe.why


def test_the_leak_pace_is_per_simulated_minute(backfilled) -> None:
    fast, slow = compressed(backfilled, "slow-leak"), life(backfilled, "slow-leak")
    assert fast.facts.climb is not None and fast.facts.climb[1] == pytest.approx(slow.facts.climb[1], abs=60)
    (leak,) = fast.recommendations
    assert leak.why == slow.recommendations[0].why
    # The history leaks 1 % of the GPU a minute (its edges' medians make it 0.9): per simulated minute, not 30.
    pace = float(re.search(r"memory climbs ([\d.]+) % of the GPU per minute", leak.why).group(1))
    assert 0.8 <= pace <= 1.1


def test_read_as_real_time_the_compressed_history_is_misjudged(backfilled) -> None:
    """Why the clock matters: at scale 1 the incident's 8 s startup fits the probe, the leak is too short to see."""
    incident = compressed(backfilled, "incident", time_scale=1.0)
    assert incident.facts.startup_seconds == pytest.approx(8.0)
    assert not any(r.unit == "seconds" for r in incident.recommendations)
    leak = compressed(backfilled, "slow-leak", time_scale=1.0)
    assert leak.facts.climb is None
    assert leak.confidence < compressed(backfilled, "slow-leak").confidence


def test_probe_delay_is_simulated_seconds(backfilled, capsys) -> None:
    """probe-kill's engine loads 75 simulated seconds (2.5 real): a 60 s probe is too short, 300 s is not."""
    at, instance = str(backfilled.compressed_at), histories.instance("probe-kill", TIME_SCALE)
    args = ["diagnose", "--prometheus", backfilled.url, "--at", at, "--window", f"{WINDOW:g}", "--instance", instance,
            "--time-scale", f"{TIME_SCALE:g}", "--json"]  # fmt: skip
    assert main(args) == 1
    (d,) = json.loads(capsys.readouterr().out)["diagnoses"]
    assert d["verdict"] == "probe_kill" and d["criteria"]["startup longer than the probe's grace"]
    assert [(r["setting"], r["current"], r["suggested"]) for r in d["recommendations"]] == [
        ("probe initial delay (or startup probe budget)", 60.0, 120)
    ]
    assert main([*args, "--probe-delay", "300"]) == 1
    (d,) = json.loads(capsys.readouterr().out)["diagnoses"]
    assert d["verdict"] == "probe_kill" and not d["criteria"]["startup longer than the probe's grace"]
    assert [r["setting"] for r in d["recommendations"]] == ["liveness probe"]
    assert d["time_scale"] == TIME_SCALE


def timeline(path) -> list[tuple[int, str]]:
    rows = re.findall(r"^\| T([+-]\d+) \| [^|]+ \| ([^|]+) \|$", path.read_text(), re.MULTILINE)
    return [(int(minutes), what.strip()) for minutes, what in rows]


def test_report_timeline_in_simulated_minutes(backfilled, tmp_path, capsys) -> None:
    fast_path, slow_path = tmp_path / "fast.md", tmp_path / "slow.md"
    assert main(["diagnose", "--prometheus", backfilled.url, "--at", str(backfilled.compressed_at),
                 "--window", f"{WINDOW:g}", "--instance", histories.instance("incident", TIME_SCALE),
                 "--time-scale", "30", "--report", str(fast_path)]) == 1  # fmt: skip
    out = capsys.readouterr().out
    assert "clock 30x faster than life" in out and "measured startup 240s" in out
    assert main(["diagnose", "--prometheus", backfilled.url, "--at", str(backfilled.at), "--instance", "incident",
                 "--report", str(slow_path)]) == 1  # fmt: skip
    capsys.readouterr()
    fast, slow = timeline(fast_path), timeline(slow_path)
    assert fast and [what for _, what in fast] == [what for _, what in slow]
    # T+N in the scenario's minutes: the same as at life's pace, within a sample's rounding.
    assert all(abs(f - s) <= 1 for (f, _), (s, _) in zip(fast, slow, strict=True))
    assert max(abs(f) for f, _ in fast) > 20  # not real minutes (the compressed hour lasts 2)
    assert "simulated minutes" in fast_path.read_text()
    assert (tmp_path / "fast-1.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("bad", ["0", "-30", "nan", "inf"])
def test_a_bad_time_scale_is_refused(backfilled, capsys, bad: str) -> None:
    assert main(["diagnose", "--prometheus", backfilled.url, "--time-scale", bad]) == 2
    assert "--time-scale" in capsys.readouterr().err
    with pytest.raises(DiagnoseError):
        diagnose_prometheus(backfilled.url, time_scale=float(bad))


def test_the_query_step_is_whole_simulated_seconds() -> None:
    assert query_step(0.0, 3600.0) == 4.0  # life: an hour in 1000 steps of whole seconds
    assert query_step(0.0, 100.0) == 1.0  # at least one second
    assert query_step(0.0, 120.0, 30.0) == 0.134  # the compressed hour: 4 simulated seconds, whole milliseconds
    assert query_step(0.0, 10.0, 30.0) == 0.034  # at least one simulated second
