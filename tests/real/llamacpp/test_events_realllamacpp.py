"""Events from a real llama-server's own log: a context too large to allocate is exactly one event."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from support import value

from oomguard.exporter.config_loader import load_config
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app
from tests.real.llamacpp import harness

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
    config = load_config(
        None,
        {
            "state_dir": str(tmp_path / "state"),
            "events": {"quiet_seconds": 2, "poll_interval_seconds": 0.2, "kernel_log": False},
            "nvml": {"enabled": False},
            "targets": [{"name": "tiny", "url": server.url, "engine": "llamacpp", "logs": [str(log_path)]}],
        },
    )
    # The exporter starts first and takes the end of the (empty) log as its start: every line the server
    # writes afterwards must be read, and the failure in them counted once.
    log_path.touch()
    client = await aiohttp_client(make_app(Runtime(config, nvml_lib=None)))
    await asyncio.sleep(0.5)
    with server:
        code = await asyncio.to_thread(server.wait_exit, 60)
    log = server.log_text()
    assert code != 0, log[-3000:]
    # The lines the catalogue counts, as this version prints them.
    assert "failed to allocate CPU buffer of size" in log, log[-3000:]
    assert "failed to allocate buffer for kv cache" in log, log[-3000:]
    assert "exiting due to model loading error" in log, log[-3000:]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        text = await (await client.get("/metrics")).text()
        if value(text, "oomguard_target_events_total", target="tiny", kind="startup_memory") >= 1:
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(2.5)  # a second event, if any, would be counted by now (quiet_seconds 2)
    text = await (await client.get("/metrics")).text()
    counts = {k: value(text, "oomguard_target_events_total", target="tiny", kind=k) for k in KINDS}
    # The memory lines make the incident an OOM at start; the exit after them is the same incident.
    assert counts == {"startup_memory": 1.0, "cuda_oom": 0.0, "engine_death": 0.0}, counts
