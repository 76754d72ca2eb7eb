"""/slots of a real llama-server: the KV use oomguard computes from it, during and after a request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import llamacpp_harness as harness
import pytest

from oomguard.engines.llamacpp.slots import fetch_kv_usage_ratio

pytestmark = pytest.mark.realllamacpp
PROMPT, GENERATED, CTX = 64, 40, 4096


async def test_the_kv_use_follows_a_request(tiny_gguf: Path, tmp_path: Path) -> None:
    server = harness.LlamaServer(tiny_gguf, harness.free_port(), slots=2, ctx_per_slot=CTX, log_path=tmp_path / "a.log")
    async with aiohttp.ClientSession() as session:
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
