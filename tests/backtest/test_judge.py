"""The report's judge (backtest/report.py) on episodes and OOMs made by hand, as docs/backtest.md, "What it prints",
counts them: each episode once, as a lead, an early page, the aftermath or outside incidents, with the OOM it was
counted for; unforeseeable OOMs; flaps; the JSON report."""

from __future__ import annotations

import json

import pytest

from oomguard.backtest.ooms import Oom
from oomguard.backtest.replay import GpuCoverage, ReplaySummary
from oomguard.backtest.report import OomResult, Outcome, Report, Window, judge
from oomguard.backtest.rules import Episode

T = 1_714_608_000.0  # 2024-05-02 00:00:00 UTC: the first OOM of each test
MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0
NODE = "n"
PAGE, PAGE_TOO, TICKET = "OomGuardGpuMemoryCritical", "OomGuardGpuMemoryExhaustedSoon", "OomGuardGpuMemoryHigh"
SEVERITY = {PAGE: "critical", PAGE_TOO: "critical", TICKET: "warning", "OomGuardLowHeadroomConfig": "info"}


def summary() -> ReplaySummary:
    """Two GPUs of one node judged for four days; engine `a` on GPU 0, `b` on GPU 1."""
    gpus = {(NODE, g): GpuCoverage(NODE, g, g, T - 2 * DAY, T + 2 * DAY, 1, 1, 1, 4 * DAY) for g in ("0", "1")}
    return ReplaySummary(T - 2 * DAY, T + 2 * DAY, 23_040, 15.0, gpus, {"a": {(NODE, "0")}, "b": {(NODE, "1")}}, 0, 0)


def episode(alert: str, fired: float, resolved: float | None = None, *, gpu: str = "0") -> Episode:
    """`alert` on GPU `gpu`, pending two minutes before it fired, firing from `fired` (resolved at `resolved`, None:
    still firing at the history's end)."""
    labels = {"node": NODE, "gpu": gpu, "basis": "headroom", "severity": SEVERITY[alert]}
    return Episode(alert, SEVERITY[alert], labels, fired - 2 * MINUTE, fired, resolved)


def oom(t: float, *, gpu: str = "0", unforeseeable: bool = False) -> Oom:
    return Oom(t, gpu=gpu, node=NODE, unforeseeable=unforeseeable)


def run(episodes: list[Episode], ooms: list[Oom]) -> tuple[list[OomResult], list[Episode], Outcome]:
    by_alert: dict[str, list[Episode]] = {}
    for e in episodes:
        by_alert.setdefault(e.alert, []).append(e)
    return judge(by_alert, sorted(ooms, key=lambda o: o.t), summary(), Window())


def leads(result: OomResult) -> list[tuple[str, float]]:
    """The OOM's leads: (alert, minutes before it)."""
    return sorted((lead.alert, lead.lead_seconds / MINUTE) for lead in result.leads)


def early(result: OomResult) -> list[tuple[str, float]]:
    return sorted((lead.alert, lead.lead_seconds / MINUTE) for lead in result.early)


def counted(e: Episode) -> tuple[str, float | None]:
    """How the episode was counted, and for which OOM: its time from the first OOM, in minutes."""
    return e.counted_as, None if e.oom is None else (e.oom - T) / MINUTE


def assert_counted_once(results: list[OomResult], false: list[Episode]) -> None:
    """No episode counted outside incidents is any OOM's lead (docs: each episode is counted once)."""
    outside = {(e.alert, e.fired_at, tuple(sorted(e.labels.items()))) for e in false}
    for result in results:
        for lead in result.leads:
            key = (lead.alert, lead.fired_at, tuple(sorted(lead.labels.items())))
            assert key not in outside, f"{lead.alert} fired at {lead.fired_at} is a lead of {result.oom} and outside"


# -- leads ------------------------------------------------------------------------------------------------------
def test_a_page_within_the_hour_before_an_oom_is_its_lead() -> None:
    page = episode(PAGE, T - 20 * MINUTE)
    [result], false, outcome = run([page], [oom(T)])
    assert leads(result) == [(PAGE, 20.0)] and result.first_page is not None
    assert counted(page) == ("lead", 0.0) and not false
    assert (outcome.incidents, outcome.paged, outcome.median_page_lead) == (1, 1, 20 * MINUTE)
    assert outcome.false_pages == 0


def test_what_fired_after_an_earlier_oom_and_kept_firing_leads_the_next_one() -> None:
    """After the OOM at 0 the page fires at 10 minutes (within that OOM's half hour after) and the ticket at 2 hours;
    both keep firing into the next OOM's incident: its leads, not the first OOM's aftermath or outside."""
    page = episode(PAGE, T + 10 * MINUTE)
    ticket = episode(TICKET, T + 2 * HOUR)
    first, second = oom(T), oom(T + 50 * MINUTE)
    third = oom(T + DAY)
    results, false, outcome = run([page, ticket], [first, second, third])
    assert leads(results[0]) == []
    assert leads(results[1]) == [(PAGE, 40.0)]
    assert counted(page) == ("lead", 50.0)
    # The ticket fired after the second OOM, a day before the third, and still fired: a ticket however early.
    assert (TICKET, 22 * 60.0) in leads(results[2]) and counted(ticket) == ("lead", 24 * 60.0)
    assert not false and outcome.false_pages == outcome.false_tickets == 0
    assert results[1].relapse_of is None  # 50 minutes after: a new incident, not a relapse
    assert_counted_once(results, false)


def test_a_page_three_hours_ahead_that_kept_firing_is_early_counted_outside_not_a_lead() -> None:
    page = episode(PAGE, T - 3 * HOUR)
    [result], false, outcome = run([page], [oom(T)])
    assert leads(result) == [] and result.first_page is None
    assert early(result) == [(PAGE, 180.0)]
    assert counted(page) == ("early", 0.0) and false == [page]
    assert (outcome.incidents, outcome.paged, outcome.false_pages) == (1, 0, 1)
    assert_counted_once([result], false)


def test_a_page_three_hours_ahead_that_resolved_before_the_incident_is_outside() -> None:
    page = episode(PAGE, T - 3 * HOUR, T - 2 * HOUR)
    [result], false, outcome = run([page], [oom(T)])
    assert leads(result) == early(result) == []
    assert counted(page) == ("outside", None) and false == [page] and outcome.false_pages == 1


def test_a_ticket_two_days_ahead_still_firing_is_a_lead_not_outside() -> None:
    ticket = episode(TICKET, T - 2 * DAY)
    gone = episode(TICKET, T - 2 * DAY, T - 90 * MINUTE, gpu="0")  # resolved before the incident began: outside
    gone.labels["basis"] = "total"  # another series of the same alert
    [result], false, outcome = run([ticket, gone], [oom(T)])
    assert leads(result) == [(TICKET, 2 * 24 * 60.0)]
    assert counted(ticket) == ("lead", 0.0)
    assert counted(gone) == ("outside", None) and false == [gone]
    assert (outcome.false_tickets, outcome.paged) == (1, 0)  # a ticket is no page
    assert_counted_once([result], false)


def test_a_page_that_never_stopped_firing_through_the_previous_oom_counts_for_both() -> None:
    """The page fired 30 minutes before the first OOM and fired on through the second, 2 hours later: the incident
    never closed (the engine relaunched into the same load), and both OOMs were paged ahead."""
    page = episode(PAGE, T - 30 * MINUTE)
    results, false, outcome = run([page], [oom(T), oom(T + 2 * HOUR)])
    assert leads(results[0]) == [(PAGE, 30.0)]
    assert leads(results[1]) == [(PAGE, 150.0)]
    assert counted(page) == ("lead", 0.0) and not false
    assert (outcome.incidents, outcome.paged) == (2, 2)


def test_a_page_that_resolved_before_the_next_incident_is_only_the_previous_ooms() -> None:
    page = episode(PAGE, T - 30 * MINUTE, T + 20 * MINUTE)
    results, false, outcome = run([page], [oom(T), oom(T + 2 * HOUR)])
    assert leads(results[0]) == [(PAGE, 30.0)] and leads(results[1]) == []
    assert (outcome.incidents, outcome.paged) == (2, 1) and not false


def test_an_early_page_that_kept_firing_into_the_next_incident_is_not_its_lead() -> None:
    """Fired 3 hours before the first OOM (early: outside incidents) and still firing 2 hours later at the second: it
    counts for the second as it counted for the first, an early page, never a lead of one and outside for the other."""
    page = episode(PAGE, T - 3 * HOUR)
    results, false, outcome = run([page], [oom(T), oom(T + 2 * HOUR)])
    assert early(results[0]) == [(PAGE, 180.0)] and leads(results[0]) == []
    assert leads(results[1]) == [], "an episode counted outside incidents is also the second OOM's lead"
    assert early(results[1]) == [(PAGE, 300.0)]
    assert counted(page) == ("early", 0.0) and false == [page]
    assert (outcome.paged, outcome.false_pages) == (0, 1)
    assert_counted_once(results, false)


def test_a_page_for_another_gpu_is_outside_and_a_gpu_alert_meets_its_engines_oom() -> None:
    other = episode(PAGE, T - 20 * MINUTE, gpu="1")
    mine = episode(PAGE_TOO, T - 25 * MINUTE, gpu="0")
    [result], false, outcome = run([other, mine], [Oom(T, target="a")])  # engine a's OOM: a is on GPU 0
    assert leads(result) == [(PAGE_TOO, 25.0)]
    assert counted(other) == ("outside", None) and false == [other] and outcome.paged == 1


# -- unforeseeable, aftermath, relapse ---------------------------------------------------------------------------
def test_a_page_before_an_unforeseeable_oom_is_outside_and_it_is_no_incident() -> None:
    page = episode(PAGE, T - 20 * MINUTE, T)
    [result], false, outcome = run([page], [oom(T, unforeseeable=True)])
    assert leads(result) == []
    assert counted(page) == ("outside", None) and false == [page]
    assert (outcome.ooms, outcome.incidents, outcome.unforeseeable, outcome.paged) == (1, 0, 1, 0)
    assert outcome.false_pages == 1 and outcome.median_page_lead is None


def test_pages_within_the_half_hour_after_an_oom_are_its_aftermath() -> None:
    restart = episode(PAGE, T + 10 * MINUTE, T + 20 * MINUTE)
    edge = episode(PAGE_TOO, T + 30 * MINUTE, T + 35 * MINUTE)
    later = episode(PAGE, T + 40 * MINUTE, T + 45 * MINUTE)
    [result], false, outcome = run([restart, edge, later], [oom(T)])
    assert counted(restart) == ("aftermath", 0.0) and counted(edge) == ("aftermath", 0.0)
    assert counted(later) == ("outside", None) and false == [later] and outcome.false_pages == 1
    assert leads(result) == []


def test_an_oom_within_half_an_hour_of_another_is_a_relapse_of_its_incident() -> None:
    page = episode(PAGE, T - 10 * MINUTE, T + 5 * MINUTE)
    results, _, outcome = run([page], [oom(T), oom(T + 20 * MINUTE)])
    assert results[1].relapse_of == oom(T)
    assert (outcome.ooms, outcome.incidents, outcome.paged) == (2, 1, 1)


def test_an_info_alert_is_never_counted() -> None:
    info = episode("OomGuardLowHeadroomConfig", T - 20 * MINUTE)
    [result], false, outcome = run([info], [oom(T)])
    assert leads(result) == [] and not false and counted(info) == ("", None)
    assert outcome.false_pages == outcome.false_tickets == 0


# -- flaps ------------------------------------------------------------------------------------------------------
def test_an_alert_firing_again_within_10_minutes_of_resolving_is_a_flap() -> None:
    """Outside incidents, on the same series: 10 minutes after the first resolved is a flap, 11 minutes after the
    second resolved is not; another GPU's episode soon after is its own first firing."""
    first = episode(PAGE, T + 2 * HOUR, T + 2 * HOUR + 10 * MINUTE)
    again = episode(PAGE, T + 2 * HOUR + 20 * MINUTE, T + 2 * HOUR + 30 * MINUTE)
    later = episode(PAGE, T + 2 * HOUR + 41 * MINUTE, T + 3 * HOUR)
    other = episode(PAGE, T + 2 * HOUR + 12 * MINUTE, T + 2 * HOUR + 15 * MINUTE, gpu="1")
    ticket = episode(TICKET, T + 2 * HOUR + 5 * MINUTE, T + 2 * HOUR + 15 * MINUTE)  # another alert, same GPU
    _, false, outcome = run([first, again, later, other, ticket], [oom(T)])
    assert [e.flap for e in (first, again, later, other, ticket)] == [False, True, False, False, False]
    assert {e.counted_as for e in false} == {"outside"} and len(false) == 5
    assert (outcome.false_pages, outcome.flapping_pages, outcome.flapping_tickets) == (4, 1, 0)


# -- the JSON report ----------------------------------------------------------------------------------------------
def test_the_json_report_has_every_episode_with_how_it_was_counted() -> None:
    lead = episode(PAGE, T - 20 * MINUTE, T + 5 * MINUTE)
    aftermath = episode(PAGE_TOO, T + 10 * MINUTE, T + 12 * MINUTE)
    outside = episode(PAGE, T + 5 * HOUR, T + 5 * HOUR + 5 * MINUTE)
    flap = episode(PAGE, T + 5 * HOUR + 10 * MINUTE, T + 5 * HOUR + 20 * MINUTE)
    chance = episode(PAGE, T + DAY - 20 * MINUTE, T + DAY, gpu="1")  # before GPU 1's unforeseeable OOM: by chance
    pending = Episode(PAGE, "critical", {"node": NODE, "gpu": "1"}, T + 7 * HOUR, None, T + 7 * HOUR + MINUTE)
    episodes = [lead, aftermath, outside, flap, chance, pending]
    ooms = [oom(T), oom(T + DAY, gpu="1", unforeseeable=True)]
    results, false, outcome = run(episodes, ooms)
    report = Report(
        source="by hand", start=T - 2 * DAY, end=T + 2 * DAY, steps=23_040, step_seconds=15.0,
        evaluation_seconds=30.0, bundle="the bundle's defaults", window=Window(), ooms=results, false_alarms=false,
        summary=summary(), outcome=outcome,
    )  # fmt: skip
    by_alert: dict[str, list[Episode]] = {}
    for e in episodes:
        by_alert.setdefault(e.alert, []).append(e)
    report.episodes = by_alert
    data = json.loads(report.json())
    got = [(e["alert"], e["fired_at"] - T, e["counted_as"], e["oom"], e["flap"]) for e in data["episodes"]]
    assert got == [
        (PAGE, -20 * MINUTE, "lead", T, False),
        (PAGE_TOO, 10 * MINUTE, "aftermath", T, False),
        (PAGE, 5 * HOUR, "outside", None, False),
        (PAGE, 5 * HOUR + 10 * MINUTE, "outside", None, True),
        (PAGE, DAY - 20 * MINUTE, "outside", None, False),
    ]  # the pending one never fired: not an episode of the report
    assert [o["unforeseeable"] for o in data["ooms"]] == [False, True]
    assert data["summary"]["unforeseeable"] == 1 and data["summary"]["incidents"] == 1
    assert data["outside_incidents"]["pages"] == 3 and data["outside_incidents"]["flapping_pages"] == 1
    assert [a["flap"] for a in data["outside_incidents"]["alerts"]] == [False, True, False]
    assert data["ooms"][0]["first_page"]["lead_seconds"] == pytest.approx(20 * MINUTE)


def test_a_page_on_another_gpu_of_the_engine_that_ran_out_is_its_lead() -> None:
    """A tensor-parallel engine dies whole when one of its ranks runs out: the OOM names the GPU where the allocation
    failed and the engine; a page on the engine's other GPU warned of it. A page on a GPU of another engine did not."""
    gpus = {(NODE, g): GpuCoverage(NODE, g, g, T - 2 * DAY, T + 2 * DAY, 1, 1, 1, 4 * DAY) for g in ("0", "1", "2")}
    targets = {"tp": {(NODE, "0"), (NODE, "1")}, "c": {(NODE, "2")}}
    replayed = ReplaySummary(T - 2 * DAY, T + 2 * DAY, 23_040, 15.0, gpus, targets, 0, 0)
    sibling, other = episode(PAGE_TOO, T - 20 * MINUTE, gpu="1"), episode(PAGE_TOO, T - 20 * MINUTE, gpu="2")
    [result], false, outcome = judge(
        {PAGE_TOO: [sibling, other]}, [Oom(T, gpu="0", node=NODE, target="tp")], replayed, Window()
    )
    assert leads(result) == [(PAGE_TOO, 20.0)] and counted(sibling) == ("lead", 0.0)
    assert false == [other] and outcome.paged == 1
