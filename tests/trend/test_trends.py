"""Every trace of the library replayed through the real sampler; the goals of the trend analysis asserted."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from support import REPO

from oomguard.exporter.model import TREND_STATES as STATES
from tests.trend import replay as replaying
from tests.trend import traces as library_module

ALARMS = {"climbing", "spike"}


@pytest.fixture(scope="module")
def replays() -> dict[str, replaying.Replay]:
    return {t.name: replaying.replay(t) for t in replaying.load_library()}


def test_committed_traces_match_their_generator(tmp_path: Path) -> None:
    for trace in library_module.library():
        committed = library_module.TRACES_DIR / f"{trace.name}.csv"
        assert committed.exists(), f"{committed.name} missing: run python -m tests.trend.traces"
        assert committed.read_text() == library_module.write(trace, tmp_path).read_text(), committed.name
    names = {f"{t.name}.csv" for t in library_module.library()}
    assert {p.name for p in library_module.TRACES_DIR.glob("*.csv")} == names


def test_states_are_the_documented_ones(replays: dict[str, replaying.Replay]) -> None:
    for r in replays.values():
        assert set(r.states) <= set(STATES)


def test_slow_leaks_are_flagged_at_least_twice_as_early_as_the_threshold(replays: dict[str, replaying.Replay]) -> None:
    leaks = [r for r in replays.values() if r.trace.family in ("slow-leak", "leak-in-churn")]
    assert len(leaks) >= 6
    for r in leaks:
        ours, theirs = r.lead(r.first_signal), r.lead(r.threshold_fires)
        assert ours is not None and theirs is not None, r.trace.name
        assert ours >= 2 * theirs, (r.trace.name, ours, theirs)
        assert r.first.get("climbing") == r.first_signal, f"{r.trace.name}: first alarm should be a climb"


def test_once_flagged_a_leak_stays_flagged_until_the_oom(replays: dict[str, replaying.Replay]) -> None:
    for r in replays.values():
        if r.trace.family not in ("slow-leak", "leak-in-churn"):
            continue
        flagged = int(r.first_signal / replaying.INTERVAL)
        after = set(r.states[flagged:])
        assert after <= {"climbing", "spike", "saturated"}, (r.trace.name, after)


def test_spike_is_flagged_before_the_oom_and_before_the_threshold(replays: dict[str, replaying.Replay]) -> None:
    (r,) = [r for r in replays.values() if r.trace.family == "spike"]
    assert r.first.get("spike") is not None and r.first["spike"] <= r.trace.expected_by["spike"]
    assert r.first_signal < r.threshold_fires < r.trace.oom_at
    assert "climbing" not in r.first


def test_no_false_alarm_on_traces_that_never_run_out(replays: dict[str, replaying.Replay]) -> None:
    quiet = [r for r in replays.values() if r.trace.oom_at is None]
    families = {"steady", "diurnal", "kv-sawtooth", "burst", "restart", "noisy", "warm-up"}
    assert {r.trace.family for r in quiet} == families
    for r in quiet:
        assert not (set(r.first) & r.trace.forbidden), (r.trace.name, r.first)
        assert not (set(r.first) & ALARMS), (r.trace.name, r.first)


def test_expected_states_appear_in_time(replays: dict[str, replaying.Replay]) -> None:
    for r in replays.values():
        for state, by in r.trace.expected_by.items():
            assert r.first.get(state) is not None and r.first[state] <= by, (r.trace.name, state, r.first)


def test_a_climb_from_the_engines_start_is_called_sooner_than_one_whose_start_is_unknown(
    replays: dict[str, replaying.Replay],
) -> None:
    """The history began with the engine serving, so what rises is not its load: called within a third of
    the time it leaves, where an unknown start waits climb_min_seconds."""
    (r,) = [r for r in replays.values() if r.trace.family == "serving-climb"]
    unknown = replaying.replay(dataclasses.replace(r.trace, from_serving=False))
    assert r.first["climbing"] <= r.trace.expected_by["climbing"]
    assert unknown.first["climbing"] >= r.first["climbing"] + 60, (unknown.first, r.first)
    assert r.lead(r.first_signal) >= r.lead(r.threshold_fires) + 120  # two minutes more than 90 % for 2 min


@pytest.mark.parametrize("ramp_seconds", [180, 240, 300, 420])
def test_a_warm_up_that_levels_off_is_let_go_within_three_minutes(ramp_seconds: int) -> None:
    """A ramp from the engine's start still rising when first judged reads climbing (nothing tells it from
    a leak yet); once level, the climb is let go after the hold its pace sets (two minutes at this pace), give
    or take the buckets its slope is read from."""
    r = replaying.replay(library_module.warm_up(60, 75, ramp_s=ramp_seconds))
    climbing = [i * replaying.INTERVAL for i, state in enumerate(r.states) if state == "climbing"]
    assert climbing, "the ramp, still rising at three minutes, should read climbing while it rises"
    assert climbing[-1] <= ramp_seconds + 180, climbing[-1]


def test_lead_time_table_in_docs_is_current(replays: dict[str, replaying.Replay]) -> None:
    doc = (REPO / "docs" / "trend.md").read_text()
    table = replaying.table(list(replays.values()))
    assert table in doc, "docs/trend.md: lead-time table is stale; regenerate with python -m tests.trend.replay"
