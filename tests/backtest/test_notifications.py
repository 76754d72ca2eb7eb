"""What the shipped routing would have sent (backtest/notifications.py), on episodes made by hand.

The expected times are deploy/alertmanager/alertmanager.yml's, as Alertmanager's documentation defines them: a
group's first notification `group_wait` after its first alert (pager 30 s, ticket 2 min), then a notification at a
`group_interval` tick (pager 5 min, ticket 15 min) where alerts new to the group fire, and again at the first tick
`repeat_interval` (pager 1 h, ticket 12 h) after the last while it fires; an inhibited alert is not notified while
its source fires; a receiver without an integration (`null`, the info alerts') receives nothing."""

from __future__ import annotations

from oomguard.backtest.notifications import Notifications, Routing, notify
from oomguard.backtest.rules import Episode

T = 1_714_608_000.0
MINUTE, HOUR = 60.0, 3600.0
END = T + 24 * HOUR  # the history's end
CRITICAL, HIGH = "OomGuardGpuMemoryCritical", "OomGuardGpuMemoryHigh"
SEVERITY = {CRITICAL: "critical", HIGH: "warning", "OomGuardGpuMemoryExhaustedSoon": "critical",
            "OomGuardLowHeadroomConfig": "info", "OomGuardTargetMemoryOverBudget": "warning"}  # fmt: skip


def alert(
    name: str, fired: float, resolved: float | None = None, *, node: str = "node-1", gpu: str = "0",
    counted_as: str = "lead",
) -> Episode:  # fmt: skip
    """An episode of `name` on a GPU, its labels as the replayed series and the rule give them (no `instance`)."""
    labels = {"node": node, "gpu": gpu, "basis": "headroom", "severity": SEVERITY[name]}
    e = Episode(name, SEVERITY[name], labels, fired - 5 * MINUTE, fired, resolved)
    e.counted_as = counted_as
    return e


def sent(episodes: list[Episode], end: float = END) -> Notifications:
    return notify(episodes, Routing.shipped(), end)


def at(notifications: Notifications, receiver: str) -> list[tuple[float, int, bool]]:
    """Each notification to `receiver`: (seconds after T, firing alerts in it, a repeat)."""
    return [(s.at - T, s.firing, s.repeat) for s in notifications.sent if s.receiver == receiver]


# A repeat comes at the first flush (every group_interval) after repeat_interval has passed since the last send:
# Alertmanager compares with the moment it sent, a little after its flush, so the flush exactly repeat_interval on
# is not yet past it. With the shipped routing a page repeats every 65 minutes, a ticket every 12 h 15 min.
PAGE_REPEAT = HOUR + 5 * 60
TICKET_REPEAT = 12 * HOUR + 15 * 60


def test_a_page_is_sent_after_group_wait_and_again_every_repeat_interval_while_it_fires() -> None:
    found = sent([alert(CRITICAL, T, T + 2.5 * HOUR)])
    assert at(found, "pager") == [(30.0, 1, False), (30.0 + PAGE_REPEAT, 1, True), (30.0 + 2 * PAGE_REPEAT, 1, True)]
    assert found.count("pager") == 3 and found.count("pager", repeats=True) == 2
    assert {s.receiver for s in found.sent} == {"pager"}


def test_a_page_firing_at_the_end_of_the_history_is_repeated_until_then() -> None:
    found = sent([alert(CRITICAL, T)], end=T + 3 * HOUR)
    assert [t for t, _, _ in at(found, "pager")] == [30.0, 30.0 + PAGE_REPEAT, 30.0 + 2 * PAGE_REPEAT]


def test_a_ticket_waits_two_minutes_and_repeats_after_twelve_hours() -> None:
    found = sent([alert(HIGH, T, T + 13 * HOUR)])
    assert at(found, "ticket") == [(120.0, 1, False), (120.0 + TICKET_REPEAT, 1, True)]


def test_two_gpus_of_one_node_are_one_notification_another_node_its_own() -> None:
    found = sent([
        alert(CRITICAL, T, T + 20 * MINUTE, gpu="0"),
        alert(CRITICAL, T + 10, T + 20 * MINUTE, gpu="1"),
        alert(CRITICAL, T + 5, T + 20 * MINUTE, node="node-2", gpu="0"),
    ])  # fmt: skip
    assert at(found, "pager") == [(30.0, 2, False), (35.0, 1, False)]


def test_an_alert_joining_an_open_group_is_told_at_the_next_group_interval() -> None:
    """GPU 1 fires 2 minutes after GPU 0's page was sent: told at the group's next tick (5 minutes after its first
    notification), a new notification with both, not a repeat."""
    found = sent([alert(CRITICAL, T, T + 30 * MINUTE, gpu="0"), alert(CRITICAL, T + 150, T + 30 * MINUTE, gpu="1")])
    assert at(found, "pager") == [(30.0, 1, False), (330.0, 2, False)]


def test_a_ticket_is_inhibited_while_the_page_of_its_gpu_fires_and_sent_once_it_resolves() -> None:
    """GpuMemoryHigh fires with GpuMemoryCritical on the same node and GPU: muted until the page resolves (at 20
    minutes); the ticket group's ticks are 2 minutes, then every 15: it is sent at 32 minutes, once."""
    found = sent([alert(CRITICAL, T, T + 20 * MINUTE), alert(HIGH, T, T + 3 * HOUR)])
    assert at(found, "pager") == [(30.0, 1, False)]
    assert at(found, "ticket") == [(32 * MINUTE, 1, False)]


def test_a_ticket_inhibited_all_along_is_never_sent() -> None:
    found = sent([alert(CRITICAL, T, T + 2 * HOUR), alert(HIGH, T + 60, T + HOUR)])
    assert at(found, "ticket") == []


def test_a_page_of_another_gpu_or_node_inhibits_nothing() -> None:
    found = sent([
        alert(CRITICAL, T, T + 2 * HOUR, gpu="1"),
        alert(HIGH, T, T + HOUR, gpu="0"),
        alert(CRITICAL, T, T + 2 * HOUR, node="node-2", gpu="0"),
    ])  # fmt: skip
    assert at(found, "ticket") == [(120.0, 1, False)]  # node-1's GPU 0: its own GPU's page does not fire


def test_an_alert_the_inhibition_does_not_name_is_sent_beside_the_page() -> None:
    over = alert("OomGuardTargetMemoryOverBudget", T, T + HOUR)
    over.labels["target"] = "vllm-0"
    found = sent([alert(CRITICAL, T, T + 2 * HOUR), over])
    assert at(found, "ticket") == [(120.0, 1, False)]


def test_a_resolved_only_update_wakes_no_one() -> None:
    """Resolved at 10 minutes: the next tick tells the receiver it resolved (send_resolved), a notification with no
    firing alert, which wakes no one and is not counted."""
    found = sent([alert(CRITICAL, T, T + 10 * MINUTE)])
    assert at(found, "pager") == [(30.0, 1, False)]
    assert all(s.firing > 0 for s in found.sent)


def test_a_page_resolved_before_group_wait_sends_nothing() -> None:
    assert sent([alert(CRITICAL, T, T + 20)]).sent == []


def test_the_same_page_firing_again_after_its_group_closed_is_a_new_notification() -> None:
    found = sent([alert(CRITICAL, T, T + 10 * MINUTE), alert(CRITICAL, T + HOUR, T + 70 * MINUTE)])
    assert at(found, "pager") == [(30.0, 1, False), (HOUR + 30.0, 1, False)]


def test_an_alert_firing_again_before_the_next_tick_is_no_new_notification() -> None:
    """Alertmanager identifies an alert by its labels: the same page resolved at 7 minutes and firing again at 8 is
    the alert the receiver was told of at the group's tick (10.5 minutes), not a new one (a flap at its line)."""
    found = sent([alert(CRITICAL, T, T + 7 * MINUTE), alert(CRITICAL, T + 8 * MINUTE, T + 50 * MINUTE)])
    assert at(found, "pager") == [(30.0, 1, False)]
    # Resolved before a tick, the group told so and closed: firing again later is a new group, a new notification.
    found = sent([alert(CRITICAL, T, T + 4 * MINUTE), alert(CRITICAL, T + 8 * MINUTE, T + 50 * MINUTE)])
    assert at(found, "pager") == [(30.0, 1, False), (8 * MINUTE + 30.0, 1, False)]


def test_an_info_alert_reaches_no_one() -> None:
    """The shipped routing sends `info` to the receiver "null", which has no integration: nothing is sent."""
    low = alert("OomGuardLowHeadroomConfig", T, T + 5 * HOUR)
    low.labels.pop("gpu")
    low.labels["target"] = "vllm-0"
    found = sent([low])
    assert found.sent == [], [s.receiver for s in found.sent]
    assert found.text() == [found.text()[0], "  none"]


def test_a_notification_is_for_nothing_when_every_firing_alert_in_it_was_counted_outside() -> None:
    found = sent([
        alert(CRITICAL, T, T + 20 * MINUTE, gpu="0", counted_as="outside"),
        alert(CRITICAL, T, T + 20 * MINUTE, gpu="1", counted_as="lead"),
        alert(CRITICAL, T + 2 * HOUR, T + 150 * MINUTE, node="node-2", counted_as="outside"),
        alert(CRITICAL, T + 4 * HOUR, T + 5 * HOUR, node="node-3", counted_as="early"),
        alert(CRITICAL, T + 6 * HOUR, T + 7 * HOUR, node="node-4", counted_as="aftermath"),
    ])  # fmt: skip
    assert [(s.at - T, s.for_nothing) for s in found.sent] == [
        (30.0, False), (2 * HOUR + 30.0, True), (4 * HOUR + 30.0, True), (6 * HOUR + 30.0, False)
    ]  # fmt: skip
    assert found.count("pager", for_nothing=True) == 2
    assert found.json()["by_receiver"]["pager"] == {"sent": 4, "repeats": 0, "for_nothing": 2}


def test_the_shipped_routings_timers() -> None:
    """Routing.shipped() reads the bundle's copy of deploy/alertmanager/alertmanager.yml: its timers are the ones the
    expectations above derive from."""
    routing = Routing.shipped()
    pager = routing.route.match({"alertname": CRITICAL, "severity": "critical"})
    ticket = routing.route.match({"alertname": HIGH, "severity": "warning"})
    assert [(r.receiver, r.group_wait, r.group_interval, r.repeat_interval) for r in (*pager, *ticket)] == [
        ("pager", 30.0, 300.0, HOUR), ("ticket", 120.0, 900.0, 12 * HOUR)
    ]  # fmt: skip
    assert pager[0].group_by == ("alertname", "cluster", "instance", "target")
