"""Events from a real vLLM's own log: a startup with too little KV cache is exactly one event."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from support import value

from oomguard.exporter.config_loader import load_config
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app
from tests.real.vllm import harness

pytestmark = pytest.mark.realvllm


async def test_startup_memory_failure_is_one_event(tiny_model: Path, tmp_path: Path, aiohttp_client) -> None:
    # 2 blocks of 128 tokens cannot hold one 512-token sequence: vLLM refuses to start.
    log_path = tmp_path / "vllm.log"
    server = harness.VllmServer(tiny_model, harness.free_port(), ("--num-gpu-blocks-override", "2"), log_path)
    config = load_config(
        None,
        {
            "state_dir": str(tmp_path / "state"),
            "events": {"quiet_seconds": 2, "poll_interval_seconds": 0.2, "kernel_log": False},
            "nvml": {"enabled": False},
            "targets": [{"name": "tiny", "url": server.url, "logs": [str(log_path)]}],
        },
    )
    # The exporter starts first and takes the end of the (empty) log as its start: every line
    # vLLM writes afterwards must be read, and the failure in them counted once.
    log_path.touch()
    client = await aiohttp_client(make_app(Runtime(config, nvml_lib=None)))
    await asyncio.sleep(0.5)
    with server:
        code = await asyncio.to_thread(server.wait_exit, 240)
    log = server.log_text()
    if keep := os.environ.get("OOMGUARD_KEEP_LOG"):  # to read what vLLM wrote
        Path(keep).write_text(log)
    assert code != 0, log[-3000:]
    assert log.count("larger than the available KV cache memory") >= 2, "vLLM prints the cause more than once"
    for _ in range(50):
        text = await (await client.get("/metrics")).text()
        if value(text, "oomguard_target_events_total", target="tiny", kind="startup_memory") >= 1:
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(2.5)  # a second event, if any, would be counted by now
    text = await (await client.get("/metrics")).text()
    counts = {
        k: value(text, "oomguard_target_events_total", target="tiny", kind=k)
        for k in ("startup_memory", "cuda_oom", "engine_death")
    }
    assert counts == {"startup_memory": 1.0, "cuda_oom": 0.0, "engine_death": 0.0}, counts
    lines = value(text, "oomguard_event_source_lines_read_total", target="tiny", source=f"file:{log_path}")
    assert lines == log_path.read_bytes().count(b"\n")  # bytes: read_text() would turn each \r into a line too
