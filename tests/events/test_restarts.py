"""Restart counting and the measured startup time."""

from __future__ import annotations

from oomguard.sources.restarts import RestartTracker


def test_first_start_watched_is_measured_but_not_a_restart() -> None:
    r = RestartTracker()
    r.observe(100.0, "loading", None, None)
    r.observe(120.0, "up", 95.0, 10)
    assert r.restarts_total == 0 and r.startup_seconds == 25.0


def test_new_process_is_one_restart_however_it_was_noticed() -> None:
    r = RestartTracker()
    r.observe(100.0, "up", 50.0, 10)
    r.observe(110.0, "down", None, None)
    r.observe(115.0, "loading", None, None)
    r.observe(140.0, "up", 112.5, 11)  # new start time and new pid: one restart
    r.observe(145.0, "up", 112.5, 11)
    assert r.restarts_total == 1 and r.last_restart_at == 112.5 and r.startup_seconds == 27.5


def test_restart_between_two_scrapes_is_seen_from_the_start_time() -> None:
    r = RestartTracker()
    r.observe(100.0, "up", 50.0, None)
    r.observe(200.0, "up", 190.0, None)  # never saw it down
    assert r.restarts_total == 1 and r.startup_seconds == 10.0


def test_unreachable_spell_with_the_same_process_is_not_a_restart() -> None:
    r = RestartTracker()
    r.observe(100.0, "up", 50.0, 10)
    r.observe(110.0, "down", None, None)  # a network blip
    r.observe(120.0, "up", 50.0, 10)
    assert r.restarts_total == 0


def test_without_identity_a_return_to_up_is_a_restart() -> None:
    r = RestartTracker()
    r.observe(100.0, "up", None, None)
    r.observe(110.0, "down", None, None)
    r.observe(130.0, "up", None, None)
    assert r.restarts_total == 1 and r.startup_seconds == 20.0
