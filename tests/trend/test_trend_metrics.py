"""Trend gauges: rendered from a known trend, and live from the background sampler on a simulated leak."""

from __future__ import annotations

import asyncio

import pytest
from support import promtool_check_metrics, samples, value

from oomguard.exporter.config_loader import load_config
from oomguard.exporter.exposition import render
from oomguard.exporter.model import EngineReading, Snapshot, SourceResult, TargetReading, Trend, TrendKey, TrendReading
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app
from oomguard.simulate.supervisor import simulation

GIB = 1024**3


def test_trend_gauges_from_a_known_trend(promtool: str) -> None:
    climbing = Trend("climbing", 0.8, 1e-4, 5e-5, 900.0, 4000.0)
    steady = Trend("steady", 0.3, 0.0, None, 10.0, None)
    target = TargetReading(
        name="llama", engine="vllm", url="http://127.0.0.1:8000", gpus=(0,), up=True, state="up",
        scrape_duration_seconds=0.01, engine_reading=EngineReading(models=(), memory_utilization_ratio=0.9),
    )  # fmt: skip
    snapshot = Snapshot(
        gpus=None, targets=(target,), sources={"targets": SourceResult(True, 0.01)}, collected_at=0.0,
        trends={
            TrendKey("gpu", "0", "gpu"): TrendReading(climbing, 80 * GIB),
            TrendKey("target", "llama", "gpu"): TrendReading(climbing, 80 * GIB),
            TrendKey("target", "llama", "host"): TrendReading(steady, 64 * GIB),
        },
        trend_samples_total=42, trend_errors_total=1,
    )  # fmt: skip
    text = render(snapshot).decode()
    assert promtool_check_metrics(promtool, text.encode()) == ""
    assert value(text, "oomguard_gpu_memory_trend_state", gpu="0", state="climbing") == 1.0
    assert value(text, "oomguard_gpu_memory_trend_state", gpu="0", state="steady") == 0.0
    assert value(text, "oomguard_gpu_memory_slope_bytes_per_second", gpu="0", window="short") == pytest.approx(
        1e-4 * 80 * GIB
    )
    assert value(text, "oomguard_gpu_memory_seconds_to_full", gpu="0") == 4000.0
    assert value(text, "oomguard_gpu_memory_climb_seconds", gpu="0") == 900.0
    # budget 0.9 at 5e-5 of capacity per second from 0.8: 0.1 / 5e-5 = 2000 s
    assert value(text, "oomguard_target_memory_seconds_to_budget", target="llama") == pytest.approx(2000.0)
    assert value(text, "oomguard_target_memory_trend_state", target="llama", memory="host", state="steady") == 1.0
    assert ("oomguard_target_memory_seconds_to_full", (("memory", "host"), ("target", "llama"))) not in samples(text)
    host_long = (("memory", "host"), ("target", "llama"), ("window", "long"))
    assert ("oomguard_target_memory_slope_bytes_per_second", host_long) not in samples(text)
    assert value(text, "oomguard_trend_samples_total") == 42.0


async def test_sampler_flags_the_simulated_leak(aiohttp_client) -> None:
    """The leak scenario at 60x, with the trend windows shrunk to match: climbing within seconds."""
    sim = simulation("leak", time_scale=60.0)
    trend = {
        "interval_seconds": 0.1, "short_window_seconds": 2, "long_window_seconds": 30,
        "climb_min_seconds": 3, "tolerance_ratio": 0.005, "climb_min_rise_ratio": 0.02,
        "climb_min_slope_ratio_per_minute": 0.05,
    }  # fmt: skip
    config = load_config(None, {"trend": trend, "targets": [{"name": "sim", "url": sim.url, "gpus": [0]}]})
    await sim.start()
    try:
        client = await aiohttp_client(make_app(Runtime(config, nvml_lib=sim.nvml)))
        for _ in range(200):
            text = await (await client.get("/metrics")).text()
            found = samples(text)
            # Both series climb; each is analysed in its turn (analysis_interval_seconds), so one may be a turn behind.
            climbing = ("oomguard_gpu_memory_trend_state", (("gpu", "0"), ("state", "climbing")))
            if found.get(climbing) == 1.0 and value(
                text, "oomguard_target_memory_trend_state", target="sim", memory="gpu", state="climbing"
            ):
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the simulated leak was never flagged as climbing")
        assert value(text, "oomguard_target_memory_trend_state", target="sim", memory="gpu", state="climbing") == 1.0
        level = value(text, "oomguard_gpu_memory_used_ratio", gpu="0")
        # The scenario climbs 1 % per simulated minute: at 60x, 1 % of the GPU per second.
        truth = (1.0 - level) / 0.01
        assert value(text, "oomguard_gpu_memory_seconds_to_full", gpu="0") == pytest.approx(truth, rel=0.35)
        assert value(text, "oomguard_gpu_memory_slope_bytes_per_second", gpu="0", window="long") > 0
        to_budget = value(text, "oomguard_target_memory_seconds_to_budget", target="sim")  # budget: 0.6 of the GPU
        assert to_budget == pytest.approx(max(0.0, (0.6 - level) / 0.01), abs=1.5)
        assert value(text, "oomguard_trend_samples_total") > 10
    finally:
        await sim.stop()
