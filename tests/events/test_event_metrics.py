"""Events through the running exporter: log incidents, XIDs, zeros from the start, promtool-clean."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support import promtool_check_metrics, samples, value

from oomguard.exporter.config_loader import load_config
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app
from oomguard.simulate.fake_nvml import FakeGpu, FakeNvml

OOM = """(EngineCore pid=7) ERROR 12-02 12:00:00 [core.py:701] EngineCore encountered a fatal error.
(EngineCore pid=7) Traceback (most recent call last):
(EngineCore pid=7) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.
"""


async def test_events_reach_the_exposition(tmp_path: Path, aiohttp_client, promtool: str) -> None:
    log = tmp_path / "vllm.log"
    log.touch()
    lib = FakeNvml([FakeGpu(0), FakeGpu(1)])
    config = load_config(
        None,
        {
            "state_dir": str(tmp_path / "state"),
            "events": {"quiet_seconds": 0.3, "poll_interval_seconds": 0.05, "kernel_log": False},
            "targets": [{"name": "vllm", "url": "http://127.0.0.1:9", "logs": [str(log)], "local_process": "no"}],
        },
    )
    client = await aiohttp_client(make_app(Runtime(config, nvml_lib=lib)))
    text = await (await client.get("/metrics")).text()
    for kind in ("cuda_oom", "startup_memory", "engine_death"):
        assert value(text, "oomguard_target_events_total", target="vllm", kind=kind) == 0.0
    assert ("oomguard_target_last_event_timestamp_seconds", (("kind", "cuda_oom"), ("target", "vllm"))) not in samples(
        text
    )

    await asyncio.sleep(0.2)  # the follower has taken the end of the (empty) file as its start
    with log.open("a") as f:
        f.write(OOM)
    lib.xid_queue.put((1, 79))
    for _ in range(60):
        text = await (await client.get("/metrics")).text()
        found = samples(text)
        if (
            found.get(("oomguard_target_events_total", (("kind", "cuda_oom"), ("target", "vllm")))) == 1.0
            and ("oomguard_gpu_events_total", (("gpu", "1"), ("kind", "xid"), ("xid", "79"))) in found
        ):
            break
        await asyncio.sleep(0.1)
    assert value(text, "oomguard_target_events_total", target="vllm", kind="cuda_oom") == 1.0
    assert value(text, "oomguard_target_events_total", target="vllm", kind="engine_death") == 0.0
    assert value(text, "oomguard_target_last_event_timestamp_seconds", target="vllm", kind="cuda_oom") > 1.7e9
    assert value(text, "oomguard_gpu_events_total", gpu="1", kind="xid", xid="79") == 1.0
    assert value(text, "oomguard_gpu_last_event_timestamp_seconds", gpu="1", kind="xid") > 1.7e9
    assert value(text, "oomguard_event_source_lines_read_total", target="vllm", source=f"file:{log}") == 3.0
    assert value(text, "oomguard_event_source_read_errors_total", target="vllm", source=f"file:{log}") == 0.0
    assert promtool_check_metrics(promtool, text.encode()) == ""
    assert (tmp_path / "state" / "events-state.json").exists()
