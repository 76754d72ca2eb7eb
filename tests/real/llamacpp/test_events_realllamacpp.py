"""Events from a real llama-server's own log: a context too large to allocate is exactly one event."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.real.llamacpp import harness
from tests.real.server import events_once_quiet, exporter_before_the_server

pytestmark = pytest.mark.realllamacpp
KINDS = ("startup_memory", "cuda_oom", "engine_death")


async def test_a_context_too_large_is_one_startup_memory_event(tiny_gguf: Path, tmp_path: Path, aiohttp_client) -> None:
    # 2^24 tokens of f32 KV cache for one slot: 512 GiB, more than any test machine has, so the CPU buffer's
    # allocation fails at start, as a GPU's cudaMalloc does where the context does not fit. --fit off: by
    # default llama-server would shrink the context to fit.
    log_path = tmp_path / "llama.log"
    server = harness.LlamaServer(
        tiny_gguf, harness.free_port(), slots=1, ctx_per_slot=2**24, extra_args=("--fit", "off"), log_path=log_path
    )
    client = await exporter_before_the_server(server, log_path, tmp_path / "state", aiohttp_client, engine="llamacpp")
    with server:
        code = await asyncio.to_thread(server.wait_exit, 60)
    log = server.log_text()
    assert code != 0, log[-3000:]
    # The lines the catalogue counts, as this version prints them.
    assert "failed to allocate CPU buffer of size" in log, log[-3000:]
    assert "failed to allocate buffer for kv cache" in log, log[-3000:]
    assert "exiting due to model loading error" in log, log[-3000:]
    counts, _ = await events_once_quiet(client, "startup_memory", KINDS, seconds=15)
    # The memory lines make the incident an OOM at start; the exit after them is the same incident.
    assert counts == {"startup_memory": 1.0, "cuda_oom": 0.0, "engine_death": 0.0}, counts
