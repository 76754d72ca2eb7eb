"""llama.cpp's KV use read from /slots on each scrape, beside /metrics, on a stand-in llama-server.

/metrics and /slots are the bodies captured from a real b11434 server (tests/fixtures/llamacpp/); /slots is
also switched off as `--no-slots` answers (501), broken, slow, too large, or in another version's fields.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

import pytest
from aiohttp import web
from support import FIXTURES, fixture_body, value

from oomguard.common.engine_client import EngineClient
from oomguard.exporter.config import TargetConfig
from oomguard.exporter.config_loader import load_config
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.sources.targets import TargetScraper
from oomguard.exporter.web import make_app
from oomguard.simulate.fake_nvml import FakeNvml

SLOTS = json.loads((FIXTURES / "llamacpp" / "slots.json").read_text(encoding="utf-8"))
SLOTS_RATIO = (89 + 90) / (2 * 2048)  # both slots at work, of 2048 tokens each (test_llamacpp.py)
NO_SLOTS = {"error": {"code": 501, "message": "This server does not support slots endpoint.",
                       "type": "not_supported_error"}}  # fmt: skip


class FakeLlamaServer:
    """/metrics and /health as a serving llama-server answers them; /slots as `slots` says."""

    def __init__(self) -> None:
        self.slots: Callable[[], web.Response] = lambda: web.json_response(SLOTS)  # the captured body
        self.slots_delay = 0.0
        self.metrics_status = 200
        self.hits: dict[str, int] = {}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{path}", self.answer)
        return app

    async def answer(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        self.hits[path] = self.hits.get(path, 0) + 1
        if path == "/metrics":
            return web.Response(text=fixture_body("llamacpp", "metrics.prom"), status=self.metrics_status)
        if path == "/health":
            return web.json_response({"status": "ok"} if self.metrics_status == 200 else {}, status=self.metrics_status)
        if path == "/slots":
            await asyncio.sleep(self.slots_delay)
            return self.slots()
        return web.Response(status=404)


@pytest.fixture
async def llama(aiohttp_server) -> tuple[FakeLlamaServer, str]:
    fake = FakeLlamaServer()
    server = await aiohttp_server(fake.app())
    return fake, f"http://127.0.0.1:{server.port}"


def scraper(url: str, *, timeout: float = 2.0, max_body_bytes: int = 1 << 20) -> TargetScraper:
    config = TargetConfig(url=url, name="llama-0", engine="llamacpp", local_process="no")
    return TargetScraper(config, timeout=timeout, max_body_bytes=max_body_bytes)


async def kv_after_scrape(s: TargetScraper) -> float | None:
    async with EngineClient() as session:
        reading = await s.scrape(session)
    assert reading.up and reading.state == "up" and reading.error == "", reading.error
    assert reading.engine_reading is not None
    (model,) = reading.engine_reading.models
    assert (model.requests_running, model.requests_waiting) == (2.0, 1.0)  # /metrics read whatever /slots says
    return model.kv_cache_usage_ratio


async def test_each_scrape_reads_the_slots(llama: tuple[FakeLlamaServer, str]) -> None:
    fake, url = llama
    s = scraper(url)
    assert await kv_after_scrape(s) == pytest.approx(SLOTS_RATIO)
    fake.slots = lambda: web.json_response([{**slot, "is_processing": False} for slot in SLOTS])  # requests done
    assert await kv_after_scrape(s) == 0.0
    assert fake.hits["/slots"] == 2 == fake.hits["/metrics"]  # one GET of /slots per scrape


async def test_the_kv_use_is_exported(llama: tuple[FakeLlamaServer, str], aiohttp_client) -> None:
    _, url = llama
    config = load_config(None, {"targets": [{"name": "llama-0", "url": url, "engine": "llamacpp",
                                              "local_process": "no"}]})  # fmt: skip
    client = await aiohttp_client(make_app(Runtime(config, nvml_lib=FakeNvml(library_present=False))))
    text = await (await client.get("/metrics")).text()
    assert value(text, "oomguard_engine_kv_cache_usage_ratio", target="llama-0", model_name="") == pytest.approx(
        SLOTS_RATIO
    )


async def test_slots_switched_off_give_no_figure_and_no_warning(
    llama: tuple[FakeLlamaServer, str], caplog: pytest.LogCaptureFixture
) -> None:
    fake, url = llama
    fake.slots = lambda: web.json_response(NO_SLOTS, status=501)  # llama-server --no-slots
    with caplog.at_level(logging.WARNING, logger="oomguard.exporter.sources.targets"):
        assert await kv_after_scrape(scraper(url)) is None
    assert not caplog.records


@pytest.mark.parametrize(
    "slots",
    [
        # A version whose working slot does not say how many tokens it holds, or whose slots do not say they work.
        [{"id": 0, "n_ctx": 2048, "is_processing": True}],
        [{"id": 0, "n_ctx": 2048, "state": 1}],
        [{"id": 0, "is_processing": False}],  # no size
    ],
)
async def test_another_versions_fields_give_no_figure(llama: tuple[FakeLlamaServer, str], slots: list) -> None:
    fake, url = llama
    fake.slots = lambda: web.json_response(slots)
    assert await kv_after_scrape(scraper(url)) is None


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (lambda: web.Response(text="<html>not json</html>"), "sent no JSON"),
        (lambda: web.json_response({"slots": SLOTS}), "not a list of slots"),
        (lambda: web.json_response({"error": {"code": 503, "message": "Loading model"}}, status=503), "HTTP 503"),
        (lambda: web.json_response([SLOTS[0]] * 400), "more than 65536 bytes"),
    ],
    ids=["not-json", "object", "http-503", "too-large"],
)
async def test_a_bad_answer_fails_only_the_kv_figure_and_is_logged_once(
    llama: tuple[FakeLlamaServer, str],
    caplog: pytest.LogCaptureFixture,
    answer: Callable[[], web.Response],
    message: str,
) -> None:
    fake, url = llama
    fake.slots = answer
    s = scraper(url, max_body_bytes=65536)  # the fixture's /metrics is well under it; 400 slots are not
    with caplog.at_level(logging.WARNING, logger="oomguard.exporter.sources.targets"):
        for _ in range(3):
            assert await kv_after_scrape(s) is None
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and message in warnings[0], warnings
    assert "llama-0" in warnings[0] and "KV cache use" in warnings[0]


async def test_a_hung_slots_costs_no_more_than_the_scrape_timeout(llama: tuple[FakeLlamaServer, str]) -> None:
    fake, url = llama
    fake.slots_delay = 5.0
    s = scraper(url, timeout=0.5)
    started = time.monotonic()
    assert await kv_after_scrape(s) is None
    # /slots leaves with /metrics and /health, under the same timeout: the scrape waits for it once, not in turn.
    assert time.monotonic() - started < 1.5


async def test_a_loading_server_logs_nothing_of_its_slots(
    llama: tuple[FakeLlamaServer, str], caplog: pytest.LogCaptureFixture
) -> None:
    fake, url = llama
    fake.metrics_status = 503
    fake.slots = lambda: web.json_response({"error": {"code": 503, "message": "Loading model"}}, status=503)
    with caplog.at_level(logging.WARNING, logger="oomguard.exporter.sources.targets"):
        async with EngineClient() as session:
            reading = await scraper(url).scrape(session)
    assert reading.state == "loading" and reading.engine_reading is None
    assert not [r for r in caplog.records if "KV cache" in r.getMessage()]
