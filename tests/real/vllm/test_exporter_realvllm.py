"""The exporter against a real vLLM server on CPU: loading, up, figures under load, killed, restarted.

Two server starts (~25-35 s each on 2 cores) cover the whole life of a target.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import psutil
import pynvml
import pytest
from support import samples, value, values

from oomguard.exporter.config_loader import load_config
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app
from tests.real.server import RecordingProxy, assert_restart_measured, scrapes_until_up, target_state
from tests.real.vllm import harness

pytestmark = pytest.mark.realvllm
TARGET = "tiny-vllm"
PROXIED = "tiny-vllm-via-proxy"


def server_figures(body: str) -> tuple[float, float, float]:
    """KV cache usage, waiting, preemptions as the server reports them (one engine here)."""
    return (
        values(body, "vllm:kv_cache_usage_perc")[0],
        values(body, "vllm:num_requests_waiting")[0],
        values(body, "vllm:num_preemptions_total")[0],
    )


def exporter_figures(text: str, target: str = TARGET) -> tuple[float, float, float]:
    labels = {"target": target, "model_name": harness.SERVED_NAME}
    return (
        value(text, "oomguard_engine_kv_cache_usage_ratio", **labels),
        value(text, "oomguard_engine_requests_waiting", **labels),
        value(text, "oomguard_engine_preemptions_total", **labels),
    )


def state(text: str) -> str:
    return target_state(text, TARGET)


def nvml_loads() -> bool:
    """Whether the real NVML starts on this machine (no driver here: the exporter must say nvml_up 0)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


async def states_until_up(client, server: harness.VllmServer, poll_seconds: float) -> tuple[list[str], str]:
    """The target's state at each scrape until it reads "up" with its /metrics read, and the last exposition."""
    seen = await scrapes_until_up(client, server, TARGET, seconds=240, poll_seconds=poll_seconds)
    return [s for s, _, _ in seen], seen[-1][2]


async def test_exporter_follows_a_real_vllm(tiny_model: Path, tmp_path: Path, aiohttp_client, aiohttp_server) -> None:
    server = harness.VllmServer(
        tiny_model,
        harness.free_port(),
        extra_args=("--num-gpu-blocks-override", "8", "--max-num-seqs", "4"),
        log_path=tmp_path / "vllm.log",
    )
    proxy = RecordingProxy(server.url)
    proxy_server = await aiohttp_server(proxy.app())
    config = load_config(
        None,
        {
            "targets": [
                {"name": TARGET, "url": server.url},
                {"name": PROXIED, "url": f"http://127.0.0.1:{proxy_server.port}", "local_process": "no"},
            ],
            "scrape": {"timeout_seconds": 5},
        },
    )
    # The real pynvml: on a machine without a driver this is the "no GPU" path, as in production.
    client = await aiohttp_client(make_app(Runtime(config, nvml_lib=pynvml)))
    server.start()
    try:
        # 1. While the model loads the port refuses: the target reads "loading", never "down".
        states, text = await states_until_up(client, server, poll_seconds=0.5)
        assert states[0] == "loading" and "down" not in states, states
        print(f"exporter saw {states.count('loading')} 'loading' scrapes before 'up'")

        # 2. The engine's own identity and config, and its processes found on this host.
        async with aiohttp.ClientSession() as session:
            body = await (await session.get(server.url + "/metrics")).text()
        assert value(text, "oomguard_engine_process_start_time_seconds", target=TARGET) == pytest.approx(
            values(body, "process_start_time_seconds")[0]
        )
        assert value(text, "oomguard_engine_gpu_memory_utilization_ratio", target=TARGET) == 0.92
        assert value(text, "oomguard_engine_kv_cache_blocks", target=TARGET) == 8
        root = psutil.Process(server.pid)
        tree_rss = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
        exported_rss = value(text, "oomguard_target_resident_memory_bytes", target=TARGET)
        print(f"RSS of the vLLM processes: exporter {exported_rss / 2**20:.0f} MiB, psutil {tree_rss / 2**20:.0f} MiB")
        assert exported_rss == pytest.approx(tree_rss, rel=0.15)
        assert value(text, "oomguard_nvml_up") == (1.0 if nvml_loads() else 0.0)

        # 3. Under load, the exporter's figures equal the server's own, taken at the same moment: a
        # recording proxy in front of the server keeps the very body it handed the exporter. (A gauge
        # read just before and just after may agree and still have moved in between.)
        # 16 requests at a time (8 KV blocks for 4 sequences: they preempt each other) until enough comparisons
        # under load and a preemption were seen, then none new.
        load = harness.run_load(server.url, n=96, prompt_tokens=120, max_tokens=380, slots=16)
        compared = busy = slow = 0
        while not load.done():
            text = await (await client.get("/metrics")).text()
            if value(text, "oomguard_target_up", target=PROXIED) == 0.0:
                # On 2 cores under this load the API server may answer /metrics after the timeout:
                # the exporter then says so (up 0, kind timeout) instead of guessing figures.
                slow += 1
                assert value(text, "oomguard_target_scrape_errors_total", target=PROXIED, kind="timeout") >= 1
                continue
            served = server_figures(proxy.last_metrics)
            assert exporter_figures(text, PROXIED) == served, (exporter_figures(text, PROXIED), served)
            compared += 1
            busy += served[0] > 0 or served[1] > 0
            if busy >= 6 and served[2] > 0:
                load.stop()
        statuses = await asyncio.to_thread(load.wait, 120)
        assert statuses and statuses == [200] * len(statuses), statuses
        final_text = await (await client.get("/metrics")).text()
        print(
            f"{len(statuses)} requests, {compared} exact comparisons, {busy} under load, {slow} scrapes timed out; "
            f"final {exporter_figures(final_text)}"
        )
        assert busy >= 3, (compared, busy)
        assert exporter_figures(final_text)[2] > 0, "the load must have caused preemptions"

        # 4. Killed (no restart follows yet): the target reads "down", not "loading".
        await asyncio.to_thread(server.kill)
        text = await (await client.get("/metrics")).text()
        assert state(text) == "down"
        assert value(text, "oomguard_target_up", target=TARGET) == 0.0
        assert value(text, "oomguard_target_scrape_errors_total", target=TARGET, kind="refused") >= 1
        assert ("oomguard_target_resident_memory_bytes", (("target", TARGET),)) not in samples(text)
        assert value(text, "oomguard_target_restarts_total", target=TARGET) == 0.0

        # 5. Started again, as an orchestrator would: "loading" while it loads (its new process is
        # found by its command line), then one restart, with the startup time measured from outside.
        server.start()
        outside_task = asyncio.ensure_future(asyncio.to_thread(server.wait_healthy, 240))
        states, text = await states_until_up(client, server, poll_seconds=0.25)
        outside = await outside_task  # launch to first /health 200, polled every 0.1 s by the harness
        assert "loading" in states, states
        measured = assert_restart_measured(text, TARGET, outside, server.launched_at)
        print(f"restart: startup measured by oomguard {measured:.2f} s, from outside {outside:.2f} s")
    finally:
        await asyncio.to_thread(server.stop)
        await proxy.close()
