"""Targets that hang, fail, flood or babble: the scrape still answers in time, with the right error kind."""

from __future__ import annotations

import asyncio
import time

import pytest
from targets_zoo import Zoo

from oomguard.common.engine_client import EngineClient
from oomguard.exporter.config import TargetConfig
from oomguard.exporter.sources.targets import TargetScraper

TIMEOUT = 1.0


def scraper(url: str, name: str, max_body_bytes: int = 8 * 1024 * 1024) -> TargetScraper:
    return TargetScraper(
        TargetConfig(url=url, name=name, local_process="no"), timeout=TIMEOUT, max_body_bytes=max_body_bytes
    )


def unused_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_each_failure_has_its_kind_and_none_delays_the_others(zoo: Zoo) -> None:
    # The URL path names the behaviour (tests only: real targets take a base URL without path).
    cases = {
        "good": ("", "up"),
        "hang": ("timeout", "loading"),
        "500": ("http_status", "loading"),  # never healthy yet: not "down"
        "huge": ("too_large", "up"),
        "garbage": ("parse", "up"),
        "html": ("parse", "up"),
        "badvalue": ("parse", "up"),
    }
    scrapers = [scraper(zoo.base, kind) for kind in cases]
    for s, kind in zip(scrapers, cases, strict=True):
        s.config = s.config.model_copy(update={"url": f"{zoo.base}/{kind}"})
    refused = scraper(f"http://127.0.0.1:{unused_port()}", "refused")
    async with EngineClient() as session:
        started = time.perf_counter()
        readings = await asyncio.gather(*(s.scrape(session) for s in [*scrapers, refused]))
        elapsed = time.perf_counter() - started
    # Everything together takes about one timeout: the hanging target delays nobody.
    assert elapsed < TIMEOUT + 0.8, elapsed
    by_name = {r.name: r for r in readings}
    for kind, (error_kind, state) in cases.items():
        reading = by_name[kind]
        assert reading.error_kind == error_kind, (kind, reading.error)
        assert reading.up is (error_kind == ""), kind
        assert reading.state == state, kind
        if error_kind:
            assert reading.errors_total[error_kind] == 1
            assert sum(reading.errors_total.values()) == 1
    assert by_name["good"].engine_reading.models[0].requests_waiting == 1.0
    assert by_name["refused"].error_kind == "refused" and by_name["refused"].state == "loading"
    assert "max_body_bytes" in by_name["huge"].error
    assert "not UTF-8" in by_name["garbage"].error
    assert "no vLLM families" in by_name["html"].error
    assert "not a number" in by_name["badvalue"].error


async def test_body_cap_is_checked_before_reading(zoo: Zoo) -> None:
    s = scraper(zoo.base, "small-cap", max_body_bytes=1000)
    s.config = s.config.model_copy(update={"url": f"{zoo.base}/good"})
    async with EngineClient() as session:
        reading = await s.scrape(session)
    assert reading.error_kind == "too_large"


async def test_states_loading_up_down(zoo: Zoo) -> None:
    s = scraper(zoo.base, "life")
    s.config = s.config.model_copy(update={"url": f"{zoo.base}/good"})
    async with EngineClient() as session:
        zoo.health_status["good"] = 503  # SGLang-style "starting": never up yet -> loading
        assert (await s.scrape(session)).state == "loading"
        zoo.health_status["good"] = 200
        assert (await s.scrape(session)).state == "up"
        zoo.health_status["good"] = 503  # vLLM after engine death
        reading = await s.scrape(session)
        assert reading.state == "down" and reading.health_status == 503
        s.config = s.config.model_copy(update={"url": f"http://127.0.0.1:{unused_port()}"})
        reading = await s.scrape(session)
        assert reading.state == "down" and reading.error_kind == "refused"
        assert reading.errors_total["refused"] == 1


class SteppedClock:
    """The wall clock of targets.py, set by the test: a startup's end read without waiting for it."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    @staticmethod
    def perf_counter() -> float:
        return time.perf_counter()


async def test_a_startup_ends_at_the_first_200_the_watch_between_scrapes_sees(zoo: Zoo, monkeypatch) -> None:
    """The quick start at 10x scraped every 15 s measured a 24 s load as 41.9 s: the end was the scrape that first
    saw it up. The watch between scrapes (the runtime's, every second) times the first 200 itself."""
    s = scraper(zoo.base, "starting")
    s.config = s.config.model_copy(update={"url": f"{zoo.base}/good"})
    started = 1796227947.08  # the fixture's process_start_time_seconds
    clock = SteppedClock(started + 10.0)
    monkeypatch.setattr("oomguard.exporter.sources.targets.time", clock)
    async with EngineClient() as session:
        zoo.health_status["good"] = 503
        assert (await s.scrape(session)).state == "loading"
        await s.watch_startup(session)  # still loading: nothing timed
        clock.now = started + 24.0
        zoo.health_status["good"] = 200
        await s.watch_startup(session)  # the first 200
        clock.now = started + 25.0
        await s.watch_startup(session)  # the same spell of 200s: it began at 24
        clock.now = started + 39.0
        reading = await s.scrape(session)
        assert reading.state == "up" and reading.startup_seconds == pytest.approx(24.0)
        asked = zoo.health_requests["good"]
        await s.watch_startup(session)  # up: the watch leaves it to the scrapes
        assert zoo.health_requests["good"] == asked


async def test_health_404_falls_back_to_metrics(zoo: Zoo) -> None:
    s = scraper(zoo.base, "nohealth")
    s.config = s.config.model_copy(update={"url": f"{zoo.base}/good"})
    zoo.health_status["good"] = 404
    async with EngineClient() as session:
        reading = await s.scrape(session)
    assert reading.state == "up" and reading.health_status == 404


def test_limits_default_to_the_scrape_section_and_a_target_overrides_them() -> None:
    from oomguard.common.promtext import Limits
    from oomguard.exporter.config_loader import load_config

    config = load_config(
        None,
        {
            "scrape": {"sample_limit": 7, "label_value_length_limit": 64, "label_limit": 20},
            "targets": [
                {"name": "a", "url": "http://127.0.0.1:8000"},
                {
                    "name": "b",
                    "url": "http://127.0.0.1:8001",
                    "sample_limit": 500,
                    "label_value_length_limit": 9,
                    "label_limit": 3,
                },
            ],
        },
    )
    assert [config.target_limits(t) for t in config.targets] == [Limits(7, 64, 20), Limits(500, 9, 3)]
    assert load_config(None, {}).scrape.sample_limit == Limits().samples == 5000


async def test_a_body_over_a_limit_is_dropped_whole_and_says_which_setting(zoo: Zoo) -> None:
    from oomguard.common.promtext import Limits

    async with EngineClient() as session:
        cases = ((Limits(samples=5), "sample_limit"), (Limits(label_value_length=3), "label_value"),
                 (Limits(labels=2), "label_limit"))  # fmt: skip
        for limits, setting in cases:
            s = TargetScraper(
                TargetConfig(url=zoo.base, name="limited", local_process="no"),
                timeout=TIMEOUT,
                max_body_bytes=8 * 1024 * 1024,
                limits=limits,
            )
            s.config = s.config.model_copy(update={"url": f"{zoo.base}/good"})
            reading = await s.scrape(session)
            assert (reading.up, reading.error_kind, reading.engine_reading) == (False, "limit", None)
            assert setting in reading.error and "scrape." in reading.error
        # The same body under the defaults: 11 samples of the families read, labels of 17 characters at most.
        s = scraper(zoo.base, "default")
        s.config = s.config.model_copy(update={"url": f"{zoo.base}/good"})
        reading = await s.scrape(session)
        assert reading.up and reading.errors_total["limit"] == 0
