"""/slots of a real llama-server: the KV use oomguard computes from it, during and after a request, and the
scraper's reading of it on each scrape."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from oomguard.common.engine_client import EngineClient
from oomguard.exporter.config import TargetConfig
from oomguard.exporter.engines.llamacpp.slots import fetch_kv_usage_ratio
from oomguard.exporter.sources.targets import TargetScraper
from tests.real.llamacpp import harness

pytestmark = pytest.mark.realllamacpp
PROMPT, GENERATED, CTX = 64, 40, 4096


async def test_the_kv_use_follows_a_request(tiny_gguf: Path, tmp_path: Path) -> None:
    server = harness.LlamaServer(tiny_gguf, harness.free_port(), slots=2, ctx_per_slot=CTX, log_path=tmp_path / "a.log")
    async with EngineClient() as session:
        with server:
            await asyncio.to_thread(server.wait_healthy, 60)
            assert await fetch_kv_usage_ratio(session, server.url, 5) == 0.0  # no slot has served yet
            request = asyncio.ensure_future(
                asyncio.to_thread(harness.completion, server.url, list(range(3, 3 + PROMPT)), GENERATED)
            )
            during: list[float] = []
            while not request.done():
                ratio = await fetch_kv_usage_ratio(session, server.url, 5)
                assert ratio is not None
                during.append(ratio)
                await asyncio.sleep(0.05)
            status, answer = await request
            assert status == 200 and answer["tokens_predicted"] == GENERATED, answer
            after = await fetch_kv_usage_ratio(session, server.url, 5)
        print(f"KV use during the request: {sorted(set(during))}; after: {after}")
        # One slot at work holds its prompt and the tokens generated so far, out of both slots' context.
        busy = [r for r in during if r > 0]
        assert busy, during
        assert all(PROMPT / (2 * CTX) <= r <= (PROMPT + GENERATED) / (2 * CTX) for r in busy), busy
        assert max(busy) > min(busy), "the use grows as tokens are generated"
        assert after == 0.0  # the finished slot keeps its tokens only for reuse

        # With --no-slots the endpoint answers 501: no figure, no error.
        off = harness.LlamaServer(
            tiny_gguf, harness.free_port(), extra_args=("--no-slots",), log_path=tmp_path / "b.log"
        )
        with off:
            await asyncio.to_thread(off.wait_healthy, 60)
            assert await fetch_kv_usage_ratio(session, off.url, 5) is None


async def test_the_scraper_reads_the_kv_use_on_each_scrape(tiny_gguf: Path, tmp_path: Path) -> None:
    """The exporter's scrape of a real llama-server carries its KV use from /slots, beside /metrics."""
    server = harness.LlamaServer(tiny_gguf, harness.free_port(), slots=2, ctx_per_slot=CTX, log_path=tmp_path / "c.log")
    config = TargetConfig(url=server.url, name="tiny-llamacpp", engine="llamacpp", local_process="no")
    scraper = TargetScraper(config, timeout=5.0, max_body_bytes=1 << 20)
    async with EngineClient() as session:
        with server:
            await asyncio.to_thread(server.wait_healthy, 60)
            request = asyncio.ensure_future(
                asyncio.to_thread(harness.completion, server.url, list(range(3, 3 + PROMPT)), GENERATED)
            )
            during: list[float | None] = []
            while not request.done():
                reading = await scraper.scrape(session)
                assert reading.up and reading.engine_reading is not None, reading.error
                during.append(reading.engine_reading.models[0].kv_cache_usage_ratio)
                await asyncio.sleep(0.05)
            assert (await request)[0] == 200
            after = (await scraper.scrape(session)).engine_reading
    assert None not in during, during
    busy = [r for r in during if r]
    assert busy and all(PROMPT / (2 * CTX) <= r <= (PROMPT + GENERATED) / (2 * CTX) for r in busy), during
    assert after is not None and after.models[0].kv_cache_usage_ratio == 0.0
