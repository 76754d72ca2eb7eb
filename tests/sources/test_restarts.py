"""Restart counting and the measured startup time."""

from __future__ import annotations

from oomguard.exporter.sources.restarts import RestartTracker


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


# Lives seen in the engine's log: its startup lines (RestartTracker.log_start).


def test_starts_that_never_serve_are_restarts() -> None:
    """A crash loop at start (the KV cache does not fit): each life logs its start and dies loading."""
    r = RestartTracker()
    r.observe(100.0, "loading", None, None)
    r.log_start(101.0, pid=20)  # the first life: not a restart
    for i, at in enumerate((131.0, 161.0, 191.0), start=1):
        r.observe(at - 1, "loading", None, None)
        r.log_start(at, pid=20 + i)
    assert r.restarts_total == 3 and r.last_restart_at == 191.0
    assert r.startup_seconds is None  # none came up


def test_a_life_announced_then_up_is_counted_once() -> None:
    r = RestartTracker()
    r.log_start(51.0, pid=10)
    r.observe(100.0, "up", 50.0, 10)
    r.log_start(150.0, pid=11)  # a new life's line, read before it comes up
    r.observe(160.0, "loading", None, None)
    r.observe(180.0, "up", 149.0, 11)  # the process started before its line was read: the same life
    assert r.restarts_total == 1 and r.last_restart_at == 150.0 and r.startup_seconds == 31.0


def test_an_unread_line_makes_the_next_one_ambiguous_and_the_process_decides() -> None:
    """The exporter saw the first life up but never read its line: a line soon after may be that life's own
    (ANNOUNCE_WINDOW), so it is not counted; the new process, once up, is."""
    r = RestartTracker()
    r.observe(100.0, "up", 50.0, 10)
    r.log_start(150.0, pid=11)
    assert r.restarts_total == 0
    r.observe(180.0, "up", 149.0, 11)
    assert r.restarts_total == 1 and r.last_restart_at == 149.0


def test_a_life_up_before_its_line_is_read_is_counted_once() -> None:
    r = RestartTracker()
    r.observe(100.0, "up", 50.0, 10)
    r.observe(200.0, "up", 190.0, 11)  # a fast load: up before the event poller read its startup line
    r.log_start(201.0, pid=11)
    assert r.restarts_total == 1 and r.last_restart_at == 190.0


def test_two_startup_lines_of_one_process_are_one_life() -> None:
    """vLLM logs its version at start and uvicorn "Started server process [N]" after the load: same pid."""
    r = RestartTracker()
    r.log_start(10.0, pid=7)
    r.log_start(40.0, pid=7)
    r.observe(41.0, "up", 8.0, 7)
    r.log_start(60.0, pid=9)
    r.log_start(90.0, pid=9)
    assert r.restarts_total == 1


def test_the_first_line_read_long_after_the_life_came_up_is_a_new_life() -> None:
    """The exporter started while the engine ran (its startup line never read): a line hours later is a restart."""
    r = RestartTracker()
    r.observe(10_000.0, "up", 100.0, 10)
    r.log_start(10_100.0, pid=11)
    assert r.restarts_total == 1


def test_a_process_younger_than_the_announced_line_is_yet_another_life() -> None:
    r = RestartTracker()
    r.log_start(51.0, pid=10)
    r.observe(100.0, "up", 50.0, 10)
    r.log_start(150.0, pid=11)  # killed while loading...
    r.observe(300.0, "up", 250.0, 12)  # ...and the next life came up before its own line was read
    assert r.restarts_total == 2


def test_is_new_life_compares_with_the_life_last_seen_up() -> None:
    """What the scraper asks of a process found on the engine's port while /health answers 503."""
    r = RestartTracker()
    assert not r.is_new_life(50.0, 10)  # nothing seen up yet
    r.observe(100.0, "up", 50.0, 10)
    assert not r.is_new_life(50.0, 10)  # the same process: a dead engine's 503 (vLLM), down
    assert not r.is_new_life(None, None)
    assert r.is_new_life(150.0, 11)  # a restart listening while it loads (llama.cpp, SGLang)


def test_a_start_time_that_steps_within_the_tolerance_is_followed_never_a_restart() -> None:
    """The wall clock stepped against the boot clock (NTP, a VM paused) moves a process's computed start time a
    little at each step: the same life, however many steps add up past the tolerance, as long as its pid holds
    and no start time is unknown."""
    r = RestartTracker()
    for step in range(10):
        r.observe(100.0 + step * 60, "up", 50.0 + step * 0.3, None)  # 2.7 s in all, 0.3 at a time
    assert r.restarts_total == 0
    r.observe(800.0, "up", 700.0, None)  # a real new life is still one
    assert r.restarts_total == 1 and r.last_restart_at == 700.0


# The first /health 200 seen between scrapes (the runtime's startup watch) ends a startup: not the next scrape.


def test_a_startup_ends_at_the_first_200_seen_between_scrapes_not_at_the_next_scrape() -> None:
    """The quick start scraped every 15 s: a 24 s load read as up to 39 s, from the scrape that first saw it up."""
    r = RestartTracker()
    r.observe(100.0, "loading", None, None)
    r.observe(130.0, "up", 95.0, 10, healthy_since=119.5)
    assert r.startup_seconds == 24.5
    r.observe(200.0, "down", None, None)
    r.observe(215.0, "loading", None, None)
    r.observe(245.0, "up", 203.0, 11, healthy_since=227.0)  # a restart: its own start to its own first 200
    assert r.restarts_total == 1 and r.startup_seconds == 24.0


def test_a_200_from_before_the_life_started_does_not_end_its_startup() -> None:
    """A 200 older than the process (the life before it, its death unseen between two watches) is not this life's:
    the scrape's own time is taken."""
    r = RestartTracker()
    r.observe(100.0, "up", 50.0, 10)
    r.observe(200.0, "up", 180.0, 11, healthy_since=170.0)
    assert r.restarts_total == 1 and r.startup_seconds == 20.0


def test_without_a_start_time_the_first_200_ends_the_spell_not_up() -> None:
    r = RestartTracker()
    r.observe(100.0, "up", None, None)
    r.observe(110.0, "down", None, None)
    r.observe(140.0, "up", None, None, healthy_since=128.0)
    assert r.restarts_total == 1 and r.startup_seconds == 18.0
    r.observe(150.0, "down", None, None)
    r.observe(170.0, "up", None, None, healthy_since=140.0)  # a 200 before the spell began: not this start's
    assert r.restarts_total == 2 and r.startup_seconds == 20.0


def test_a_life_announced_in_the_log_ends_its_startup_at_its_first_200() -> None:
    r = RestartTracker()
    r.log_start(51.0, pid=10)
    r.observe(100.0, "up", 50.0, 10, healthy_since=75.0)
    assert r.restarts_total == 0 and r.startup_seconds == 25.0
