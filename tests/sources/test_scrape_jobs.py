"""A scrape's jobs, each on its own (sources/target_state.py, side_requests.py, targets.py's ScrapeLog); the
scraper's tests (test_targets.py, the engines' and the hostile suites) run them together over HTTP."""

from __future__ import annotations

import logging

import pytest

from oomguard.common.engine_client import EngineClient
from oomguard.exporter.engines.base import KvUsageError, ReservationError
from oomguard.exporter.model import EngineReading, ModelReading, ProcessTree
from oomguard.exporter.sources.processes import ProcessFinder
from oomguard.exporter.sources.restarts import RestartTracker
from oomguard.exporter.sources.side_requests import KvUsageEach, ReservationOnce
from oomguard.exporter.sources.target_state import TargetState
from oomguard.exporter.sources.targets import ScrapeLog

URL = "http://127.0.0.1:9"


def reading(kv: float | None = None, reservation: float | None = None) -> EngineReading:
    return EngineReading((ModelReading("m", kv_cache_usage_ratio=kv),), memory_utilization_ratio=reservation)


# -- the state ---------------------------------------------------------------------------------------------------
async def test_loading_until_first_healthy_then_down_when_it_fails() -> None:
    state = TargetState(RestartTracker())
    assert await state.judge(False, None, None, 8000) == "loading"  # refused before its first answer
    assert await state.judge(False, 503, None, 8000) == "loading"
    assert await state.judge(True, 200, None, 8000) == "up"
    assert await state.judge(False, 500, None, 8000) == "down"
    assert await state.judge(False, None, None, 8000) == "down"
    state.new_life()  # a new container: loading again until it answers
    assert await state.judge(False, None, None, 8000) == "loading" and state.state == "loading"


async def test_a_local_engine_restarting_is_loading_not_down() -> None:
    restarts = RestartTracker()
    restarts.observe(1_000.0, "up", 900.0, 41)  # the life last seen up
    state = TargetState(restarts, ProcessFinder())
    assert await state.judge(True, 200, None, 8000) == "up"
    relaunched = ProcessTree(root_pid=42, pids=frozenset({42}), resident_bytes=0.0, start_time_seconds=1_050.0)
    assert await state.judge(False, 503, relaunched, 8000) == "loading"  # another process on its port
    same = ProcessTree(root_pid=41, pids=frozenset({41}), resident_bytes=0.0, start_time_seconds=900.0)
    assert await state.judge(False, 503, same, 8000) == "down"  # the life seen up answers 503: it died


# -- the reservation, once per life ------------------------------------------------------------------------------
class Fetches:
    def __init__(self, *answers: float | Exception) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def __call__(self, session: EngineClient, url: str, timeout: float) -> float | None:
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


async def test_the_reservation_is_fetched_once_per_life_and_retried_after_a_failure() -> None:
    now = [0.0]
    fetch = Fetches(ReservationError("no such key"), 0.85, 0.7)
    once = ReservationOnce(fetch, "t", retry_seconds=60.0, clock=lambda: now[0])
    async with EngineClient() as session:
        assert (await once.add(session, URL, 1.0, reading(), "up", 0)).memory_utilization_ratio is None
        now[0] = 30.0
        assert (await once.add(session, URL, 1.0, reading(), "up", 0)).memory_utilization_ratio is None
        assert fetch.calls == 1  # not again before the retry delay
        now[0] = 61.0
        assert (await once.add(session, URL, 1.0, reading(), "up", 0)).memory_utilization_ratio == 0.85
        assert (await once.add(session, URL, 1.0, reading(), "up", 0)).memory_utilization_ratio == 0.85
        assert fetch.calls == 2  # kept for the life
        # The engine's own figure wins; a spell not up forgets the value; a new life fetches it again.
        assert (await once.add(session, URL, 1.0, reading(reservation=0.9), "up", 0)).memory_utilization_ratio == 0.9
        assert (await once.add(session, URL, 1.0, reading(), "loading", 0)).memory_utilization_ratio is None
        assert (await once.add(session, URL, 1.0, reading(), "up", 1)).memory_utilization_ratio == 0.7
        assert fetch.calls == 3


# -- the KV use, each scrape -------------------------------------------------------------------------------------
async def test_the_kv_use_fills_what_metrics_lacks_and_a_failure_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    async def refuses(session: EngineClient, url: str, timeout: float, cap: int) -> float | None:
        raise KvUsageError("/slots is disabled (start llama-server with --slots)")

    async def hangs(session: EngineClient, url: str, timeout: float, cap: int) -> float | None:
        raise TimeoutError

    each = KvUsageEach(refuses, "t")
    async with EngineClient() as session:
        ratio, error = await each.get(session, URL, 1.0, 1 << 20)
        assert ratio is None and "--slots" in error
        assert await KvUsageEach(hangs, "t").get(session, URL, 2.5, 1 << 20) == (
            None, "took longer than 2.5s (timeout_seconds)",
        )  # fmt: skip
    with caplog.at_level(logging.WARNING, "oomguard.exporter.sources.side_requests"):
        assert each.add(reading(), None, error) == reading()
        each.add(reading(), None, error)
        assert each.add(None, None, error) is None  # no reading (a loading engine): nothing to fill, nothing said
    assert caplog.text.count("cannot read its KV cache use") == 1
    assert each.add(reading(), 0.4, "").models[0].kv_cache_usage_ratio == 0.4
    assert each.add(reading(kv=0.2), 0.4, "").models[0].kv_cache_usage_ratio == 0.2  # /metrics' own wins


# -- what the scrapes say ----------------------------------------------------------------------------------------
def test_a_loading_target_says_one_line_and_an_up_one_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    say = ScrapeLog("t")
    with caplog.at_level(logging.DEBUG, "oomguard.exporter.sources.targets"):
        say.error("loading", "refused", "cannot connect")
        say.error("loading", "http_status", "answered HTTP 503")
        say.error("up", "", "")
        say.error("down", "timeout", "took longer")
        say.error("down", "timeout", "took longer")
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert levels == [
        ("INFO", "target t: loading (refused error until it serves: cannot connect)"),
        ("DEBUG", "target t: loading: http_status error: answered HTTP 503"),
        ("WARNING", "target t: timeout error: took longer"),
    ]
