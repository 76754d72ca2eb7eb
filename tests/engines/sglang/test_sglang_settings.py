"""SGLang's mem_fraction_static: fetched from /server_info (or /get_server_info), once per engine life,
and never failing a scrape."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import pytest
from aiohttp import web
from support import fixture_body

from oomguard.common.engine_client import EngineClient
from oomguard.exporter.config import TargetConfig
from oomguard.exporter.engines.base import ReservationError
from oomguard.exporter.engines.sglang.settings import mem_fraction_static
from oomguard.exporter.sources.targets import TargetScraper

INFO = {"model_path": "meta-llama/Llama-3.1-8B-Instruct", "mem_fraction_static": 0.871, "tp_size": 1}


class FakeSglang:
    """An SGLang server as oomguard sees it: /metrics, /health, and its server information."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.routes: dict[str, web.Response | None] = {"/server_info": None, "/get_server_info": None}
        self.health = 200
        self.metrics_ok = True
        self.slow = False

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/health", self.health_handler)
        app.router.add_get("/{path:(get_)?server_info}", self.info)
        return app

    async def metrics(self, _: web.Request) -> web.Response:
        if not self.metrics_ok:
            return web.Response(status=503)
        return web.Response(text=fixture_body("sglang", "sglang-0.5.x-tp1.prom"))

    async def health_handler(self, _: web.Request) -> web.Response:
        return web.Response(status=self.health)

    async def info(self, request: web.Request) -> web.Response:
        self.hits[request.path] += 1
        if self.slow:
            await asyncio.sleep(5)
        answer = self.routes[request.path]
        return answer if answer is not None else web.json_response(INFO)


@pytest.fixture
async def sglang(aiohttp_server):
    fake = FakeSglang()
    server = await aiohttp_server(fake.app())
    fake.base = f"http://127.0.0.1:{server.port}"  # type: ignore[attr-defined]
    return fake


async def fetch(base: str, timeout: float = 2.0) -> float | None:
    async with EngineClient() as session:
        return await mem_fraction_static(session, base, timeout)


async def test_from_server_info(sglang: FakeSglang) -> None:
    assert await fetch(sglang.base) == 0.871
    assert sglang.hits == {"/server_info": 1}


async def test_older_versions_answer_on_get_server_info(sglang: FakeSglang) -> None:
    sglang.routes["/server_info"] = web.Response(status=404)
    assert await fetch(sglang.base) == 0.871
    assert sglang.hits == {"/server_info": 1, "/get_server_info": 1}


async def test_a_server_without_either_path_publishes_none(sglang: FakeSglang) -> None:
    sglang.routes = {path: web.Response(status=404) for path in sglang.routes}
    assert await fetch(sglang.base) is None


@pytest.mark.parametrize(
    "body", [{"tp_size": 1}, {"mem_fraction_static": None}, {"mem_fraction_static": "0.8"}, {"mem_fraction_static": 7}]
)
async def test_no_usable_fraction_is_none(sglang: FakeSglang, body: dict) -> None:
    sglang.routes["/server_info"] = web.json_response(body)
    assert await fetch(sglang.base) is None


@pytest.mark.parametrize(
    ("answer", "message"),
    [(web.Response(status=500), "HTTP 500"), (web.Response(text="<html>"), "not JSON")],
)
async def test_failures_raise_for_a_retry(sglang: FakeSglang, answer: web.Response, message: str) -> None:
    sglang.routes["/server_info"] = answer
    with pytest.raises(ReservationError, match=message):
        await fetch(sglang.base)


async def test_a_slow_server_times_out(sglang: FakeSglang) -> None:
    sglang.slow = True
    with pytest.raises(TimeoutError):
        await fetch(sglang.base, timeout=0.2)


def scraper(base: str) -> TargetScraper:
    config = TargetConfig(url=base, name="sglang-0", engine="sglang", local_process="no")
    return TargetScraper(config, timeout=1.0, max_body_bytes=1 << 20)


async def test_the_scraper_fetches_it_once_per_life_and_joins_it_to_the_reading(sglang: FakeSglang) -> None:
    s = scraper(sglang.base)
    async with EngineClient() as session:
        for _ in range(3):
            reading = await s.scrape(session)
            assert reading.up and reading.state == "up"
            assert reading.engine_reading is not None
            assert reading.engine_reading.memory_utilization_ratio == 0.871
            assert reading.engine_reading.reservation_ratio == 0.871  # as vLLM's gpu_memory_utilization
        assert sglang.hits == {"/server_info": 1}
        # The engine goes down and comes back: a new life, perhaps with other arguments.
        sglang.health, sglang.metrics_ok = 503, False
        down = await s.scrape(session)
        assert down.state == "down" and down.engine_reading is None
        sglang.health, sglang.metrics_ok = 200, True
        info_again = {**INFO, "mem_fraction_static": 0.8}
        sglang.routes["/server_info"] = web.json_response(info_again)
        again = await s.scrape(session)
        assert again.engine_reading is not None and again.engine_reading.memory_utilization_ratio == 0.8
        assert sglang.hits == {"/server_info": 2}


async def test_a_failed_fetch_does_not_fail_the_scrape_and_is_retried_later(sglang: FakeSglang) -> None:
    s = scraper(sglang.base)
    sglang.routes["/server_info"] = web.Response(status=500)
    async with EngineClient() as session:
        reading = await s.scrape(session)
        assert reading.up and reading.error == ""
        assert reading.engine_reading is not None and reading.engine_reading.memory_utilization_ratio is None
        await s.scrape(session)
        assert sglang.hits == {"/server_info": 1}  # not again before the retry delay
        assert s.reservation is not None
        later = time.monotonic() + s.reservation.retry_seconds
        s.reservation.clock = lambda: later  # the retry delay has passed
        sglang.routes["/server_info"] = None  # answers again
        reading = await s.scrape(session)
        assert reading.engine_reading is not None and reading.engine_reading.memory_utilization_ratio == 0.871


async def test_a_hung_server_info_costs_one_timeout_not_the_scrape(sglang: FakeSglang) -> None:
    s = scraper(sglang.base)
    s.timeout = 0.3
    sglang.slow = True
    async with EngineClient() as session:
        reading = await s.scrape(session)
    assert reading.up and reading.engine_reading is not None
    assert reading.engine_reading.memory_utilization_ratio is None


async def test_503_while_starting_is_loading(sglang: FakeSglang) -> None:
    """SGLang answers /health 503 until it serves: never up yet, that is loading, not down."""
    s = scraper(sglang.base)
    sglang.health, sglang.metrics_ok = 503, False
    async with EngineClient() as session:
        first = await s.scrape(session)
        assert (first.state, first.health_status) == ("loading", 503)
        sglang.health, sglang.metrics_ok = 200, True
        assert (await s.scrape(session)).state == "up"
    assert sglang.hits == {"/server_info": 1}  # fetched once it served, not while loading


def test_the_fraction_reserves_its_gpus_as_gpu_memory_utilization_does() -> None:
    """Joined like vLLM's: the budget on its GPU, and the GPU's headroom left beyond the reservation."""
    from oomguard.exporter.join import join_gpus, join_targets
    from oomguard.exporter.model import EngineReading, GpuReading, GpuReadings, TargetReading

    gib = 2**30
    nvml = GpuReadings(True, gpus=(GpuReading(0, True, total_bytes=80 * gib, used_bytes=74 * gib, processes=()),))
    reading = EngineReading(models=(), memory_utilization_ratio=0.871)
    target = TargetReading("sglang-0", "sglang", "http://h:30000", (0,), True, "up", 0.01, engine_reading=reading)
    memory = join_targets(nvml, [target])
    assert memory["sglang-0"].budget_bytes == pytest.approx(0.871 * 80 * gib)
    gpu = join_gpus(nvml, [target], memory)[("", "0")]  # GPU 0 of the one node, unnamed outside Kubernetes
    assert gpu.reserved_bytes == pytest.approx(0.871 * 80 * gib)
    assert gpu.unreserved_used_bytes == pytest.approx(74 * gib - 0.871 * 80 * gib)


class FakeFinder:
    """The process finder's one question here: is a new process with the engine's command line running?"""

    def __init__(self) -> None:
        self.new_process = False

    def restarted(self, port: int) -> bool:
        return self.new_process


@pytest.mark.parametrize(("new_process", "state"), [(True, "loading"), (False, "down")])
async def test_503_after_a_restart_is_loading_again(sglang: FakeSglang, new_process: bool, state: str) -> None:
    """A restarted SGLang answers 503 while it loads, where a restarted vLLM refuses: loading either way; a 503
    from the same process is an engine that died."""
    config = TargetConfig(url=sglang.base, name="sglang-0", engine="sglang", local_process="yes")
    finder = FakeFinder()
    s = TargetScraper(config, timeout=1.0, max_body_bytes=1 << 20, finder=finder)  # type: ignore[arg-type]
    async with EngineClient() as session:
        assert (await s.scrape(session)).state == "up"
        sglang.health, sglang.metrics_ok = 503, False
        finder.new_process = new_process
        assert (await s.scrape(session)).state == state


async def test_a_body_that_arrives_in_parts_is_read_whole(aiohttp_server) -> None:
    """The answer in three writes, 50 ms apart (chunked): a single read of the stream gave the first part only."""
    body = json.dumps({**INFO, "padding": "x" * 200_000}).encode()

    async def info(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(body), len(body) // 3 + 1):
            await response.write(body[start : start + len(body) // 3 + 1])
            await asyncio.sleep(0.05)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/server_info", info)
    server = await aiohttp_server(app)
    assert await fetch(f"http://127.0.0.1:{server.port}") == 0.871
