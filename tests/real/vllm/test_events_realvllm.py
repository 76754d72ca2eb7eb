"""Events from a real vLLM's own log: a startup with too little KV cache is exactly one event."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from support import value

from tests.real.server import events_once_quiet, exporter_before_the_server
from tests.real.vllm import harness

pytestmark = pytest.mark.realvllm
KINDS = ("startup_memory", "cuda_oom", "engine_death")


async def test_startup_memory_failure_is_one_event(tiny_model: Path, tmp_path: Path, aiohttp_client) -> None:
    # 2 blocks of 128 tokens cannot hold one 512-token sequence: vLLM refuses to start.
    log_path = tmp_path / "vllm.log"
    server = harness.VllmServer(tiny_model, harness.free_port(), ("--num-gpu-blocks-override", "2"), log_path)
    client = await exporter_before_the_server(server, log_path, tmp_path / "state", aiohttp_client)
    with server:
        code = await asyncio.to_thread(server.wait_exit, 240)
    log = server.log_text()
    if keep := os.environ.get("OOMGUARD_KEEP_LOG"):  # to read what vLLM wrote
        Path(keep).write_text(log)
    assert code != 0, log[-3000:]
    assert log.count("larger than the available KV cache memory") >= 2, "vLLM prints the cause more than once"
    counts, text = await events_once_quiet(client, "startup_memory", KINDS, seconds=10)
    assert counts == {"startup_memory": 1.0, "cuda_oom": 0.0, "engine_death": 0.0}, counts
    lines = value(text, "oomguard_event_source_lines_read_total", target="tiny", source=f"file:{log_path}")
    assert lines == log_path.read_bytes().count(b"\n")  # bytes: read_text() would turn each \r into a line too
