"""The cluster mode's idle cost (issue 50, item 5): a pod whose log says nothing is polled less and less often, up to
QUIET_MAX_SECONDS apart, and at the next poll once a line comes (the reader wakes the runner); nothing is lost, and a
quiet poll neither writes the state file nor asks every source's health again. On a test's clock, not timed."""

from __future__ import annotations

from pathlib import Path

from support import Clock

from oomguard.exporter.config import EventsConfig, TargetConfig
from oomguard.exporter.events.api_log import ApiLogReader
from oomguard.exporter.events.registry import pod_api_log
from oomguard.exporter.events.runner import QUIET_MAX_SECONDS, EventRunner
from tests.events.test_event_runner import OOM, runner

TARGET = TargetConfig(url="http://10.0.0.1:8000", name="llm/vllm-0", engine="vllm")


def followed(run: EventRunner) -> ApiLogReader:
    """A pod found at start, its log read through the API, counting the reader's polls."""
    log, reader = pod_api_log(TARGET, EventsConfig(), run.saved, ("llm", "vllm-0", "vllm"), from_start=False)
    run.set_sources(TARGET.label, [log])
    polled = reader.poll

    def counted() -> list[str]:
        reader.polls += 1  # type: ignore[attr-defined]
        return polled()

    reader.polls = 0  # type: ignore[attr-defined]
    reader.poll = counted  # type: ignore[method-assign]
    return reader


def test_a_quiet_pod_log_is_polled_less_and_less_often_and_at_once_when_a_line_comes(tmp_path: Path) -> None:
    clock = Clock()
    run = runner(tmp_path, clock, [], quiet_seconds=2)
    reader = followed(run)
    state_file = tmp_path / "state" / "events-state.json"
    for _ in range(120):  # a minute of polls, every 0.5 s
        run.poll()
        clock.now += 0.5
    # 0, 0.5, 1.5, 3.5, 7.5, then every 8 s: 12 polls in a minute, not 120.
    assert 8 <= reader.polls <= 60 / QUIET_MAX_SECONDS + 5, reader.polls
    written = state_file.stat().st_mtime_ns, state_file.stat().st_ino
    for _ in range(40):
        run.poll()
        clock.now += 0.5
    assert (state_file.stat().st_mtime_ns, state_file.stat().st_ino) == written  # nothing changed: not written
    # A line comes: read at the next poll, whatever the back-off.
    before = reader.polls
    assert reader.offer("2026-12-05T12:00:01.000000001Z " + OOM[0].format(i=7))
    run.poll()
    assert reader.polls == before + 1
    assert [h.lines_read for h in run.view.health if h.target == TARGET.label] == [1]
    # The incident it opened is closed after its quiet spell (2 s), at most QUIET_MAX_SECONDS late, and counted once.
    for line in OOM[1:]:
        reader.offer("2026-12-05T12:00:01.000000002Z " + line.format(i=7))
    for _ in range(int((2 + QUIET_MAX_SECONDS) / 0.5) + 1):
        clock.now += 0.5
        run.poll()
    assert run.view.counts[TARGET.label].total == {"cuda_oom": 1}


def test_a_read_error_wakes_the_runner_and_is_seen_at_the_next_poll(tmp_path: Path) -> None:
    clock = Clock()
    run = runner(tmp_path, clock, [])
    reader = followed(run)
    for _ in range(40):
        run.poll()
        clock.now += 0.5
    reader.error("GET /api/v1/namespaces/llm/pods/vllm-0/log: 403")
    run.poll()
    assert [h.read_errors for h in run.view.health if h.target == TARGET.label] == [1]


def test_no_poll_is_asked_while_every_source_is_quiet_and_none_is_due(tmp_path: Path) -> None:
    """The runtime asks `due()` before it wakes a thread for a poll: with only quiet pods, seldom; a line, at once."""
    clock = Clock()
    run = runner(tmp_path, clock, [])
    reader = followed(run)
    asked = 0
    for _ in range(120):
        if run.due():
            asked += 1
            run.poll()
        clock.now += 0.5
    assert asked == reader.polls <= 60 / QUIET_MAX_SECONDS + 5
    assert not run.due()
    reader.offer("2026-12-05T12:00:01.000000001Z a line")
    assert run.due()


def test_a_log_let_go_that_gets_a_last_line_keeps_no_poll_due(tmp_path: Path) -> None:
    """A pod gone: its follower may still offer a line as it stops. That wakes nobody, and the runner is not left
    due at every poll for a source it no longer has."""
    clock = Clock()
    run = runner(tmp_path, clock, [])
    reader = followed(run)
    run.set_sources(TARGET.label, [])
    reader.offer("2026-12-05T12:00:01.000000001Z a last line")
    run.poll()
    clock.now += 0.5
    assert not run.due()
