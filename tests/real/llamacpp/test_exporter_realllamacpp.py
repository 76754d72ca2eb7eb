"""The exporter against a real llama-server on CPU: loading, up, figures under load, killed, restarted.

Two starts of the server (a second or two each with the tiny model) cover the whole life of a target.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from support import value

from oomguard.exporter.config_loader import load_config
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app
from oomguard.simulate.fake_nvml import FakeNvml
from tests.real.llamacpp import harness
from tests.real.server import RecordingProxy, Scrape, assert_restart_measured, target_state
from tests.real.server import scrapes_until_up as real_scrapes_until_up

pytestmark = pytest.mark.realllamacpp
TARGET = "tiny-llamacpp"
PROXIED = "tiny-llamacpp-via-proxy"
SLOTS = 2
LOAD_TOKENS = 40  # tokens generated per request: about 1.5 s a request on one thread


def server_figures(body: str) -> tuple[float, float]:
    """Running and waiting requests as the server reports them."""
    return (
        value(body, "llamacpp:requests_processing"),
        value(body, "llamacpp:requests_deferred"),
    )


def exporter_figures(text: str, target: str = TARGET) -> tuple[float, float]:
    labels = {"target": target, "model_name": ""}
    return (
        value(text, "oomguard_engine_requests_running", **labels),
        value(text, "oomguard_engine_requests_waiting", **labels),
    )


def state(text: str) -> str:
    return target_state(text, TARGET)


async def scrapes_until_up(client, server: harness.LlamaServer) -> list[Scrape]:
    return await real_scrapes_until_up(client, server, TARGET, seconds=60, poll_seconds=0.02)


async def test_exporter_follows_a_real_llama_server(
    tiny_gguf: Path, tmp_path: Path, aiohttp_client, aiohttp_server
) -> None:
    server = harness.LlamaServer(tiny_gguf, harness.free_port(), slots=SLOTS, log_path=tmp_path / "llama.log")
    proxy = RecordingProxy(server.url)
    proxy_server = await aiohttp_server(proxy.app())
    config = load_config(
        None,
        {
            "targets": [
                {"name": TARGET, "url": server.url, "engine": "llamacpp"},
                {
                    "name": PROXIED,
                    "url": f"http://127.0.0.1:{proxy_server.port}",
                    "engine": "llamacpp",
                    "local_process": "no",
                },
            ],
            "scrape": {"timeout_seconds": 5},
        },
    )
    # No NVML here (a CPU server): the library is absent, and the exporter says so (nvml_up 0).
    client = await aiohttp_client(make_app(Runtime(config, nvml_lib=FakeNvml(library_present=False))))
    server.start()
    try:
        # 1. While it loads the model, llama-server answers /health 503 "Loading model": "loading", never "down".
        seen = await scrapes_until_up(client, server)
        states = [s for s, _, _ in seen]
        assert "down" not in states, states
        assert ("loading", 503.0) in [(s, code) for s, code, _ in seen], [(s, c) for s, c, _ in seen]
        text = seen[-1][2]
        assert value(text, "oomguard_nvml_up") == 0.0
        print(f"exporter saw {states.count('loading')} 'loading' scrapes before 'up'")

        # 2. Under load (more requests than slots), the exporter's figures equal the server's own, taken at the
        # same moment: the recording proxy keeps the very body it handed the exporter.
        load = harness.run_load(server.url, n=3 * SLOTS, prompt_tokens=64, n_predict=LOAD_TOKENS)
        compared = 0
        seen_figures: set[tuple[float, float]] = set()
        while not load.done():
            text = await (await client.get("/metrics")).text()
            assert value(text, "oomguard_target_up", target=PROXIED) == 1.0
            served = server_figures(proxy.last_metrics)
            assert exporter_figures(text, PROXIED) == served, (exporter_figures(text, PROXIED), served)
            compared += 1
            seen_figures.add(served)
            await asyncio.sleep(0.05)
        statuses = await asyncio.to_thread(load.wait, 120)
        assert statuses == [200] * (3 * SLOTS)
        print(f"{compared} exact comparisons; (running, waiting) seen: {sorted(seen_figures)}")
        # Every slot busy with requests deferred behind them, seen at least once.
        assert any(running == SLOTS and waiting > 0 for running, waiting in seen_figures), seen_figures
        # All answered: the server's gauges come back to zero (it updates them on its own loop, so wait for it).
        deadline = time.monotonic() + 10
        while exporter_figures(final := await (await client.get("/metrics")).text()) != (0.0, 0.0):
            assert time.monotonic() < deadline, exporter_figures(final)
            await asyncio.sleep(0.05)

        # 3. Killed (no restart follows yet): the target reads "down", not "loading".
        await asyncio.to_thread(server.kill)
        text = await (await client.get("/metrics")).text()
        assert state(text) == "down"
        assert value(text, "oomguard_target_up", target=TARGET) == 0.0
        assert value(text, "oomguard_target_scrape_errors_total", target=TARGET, kind="refused") >= 1
        assert value(text, "oomguard_target_restarts_total", target=TARGET) == 0.0

        # 4. Started again, as an orchestrator would: one restart, with the startup time measured from outside.
        server.start()
        outside_task = asyncio.ensure_future(asyncio.to_thread(server.wait_healthy, 60))
        seen = await scrapes_until_up(client, server)
        outside = await outside_task  # launch to first /health 200, polled every 0.05 s by the harness
        measured = assert_restart_measured(seen[-1][2], TARGET, outside, server.launched_at)
        print(
            f"restart: states {[s for s, _, _ in seen]}; startup by oomguard {measured:.2f} s, outside {outside:.2f} s"
        )
    finally:
        await asyncio.to_thread(server.stop)
        await proxy.close()


async def test_a_restarted_server_reads_loading_while_it_loads(tiny_gguf: Path, tmp_path: Path, aiohttp_client) -> None:
    server = harness.LlamaServer(tiny_gguf, harness.free_port(), log_path=tmp_path / "llama.log")
    config = load_config(None, {"targets": [{"name": TARGET, "url": server.url, "engine": "llamacpp"}]})
    client = await aiohttp_client(make_app(Runtime(config, nvml_lib=FakeNvml(library_present=False))))
    server.start()
    try:
        await scrapes_until_up(client, server)
        await asyncio.to_thread(server.kill)
        server.start()
        seen = await scrapes_until_up(client, server)
        during = [(s, code) for s, code, _ in seen[:-1]]
        assert 503.0 in [code for _, code in during], during  # it was seen loading: the test can tell
        assert {s for s, code in during if code == 503} == {"loading"}, during
    finally:
        await asyncio.to_thread(server.stop)
