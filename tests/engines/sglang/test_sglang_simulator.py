"""The simulated SGLang: its bodies read by the SGLang reader, and `serve --simulate` running it."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from simulated_engines import simulated_runtime

from oomguard.common.promtext import FamilyExtractor
from oomguard.exporter.config import ConfigError
from oomguard.exporter.engines import ENGINE_NAMES, ENGINES
from oomguard.exporter.engines.sglang.reader import SglangReader
from oomguard.simulate.checks import load_config
from oomguard.simulate.engines.sglang import sglang_metrics_text
from oomguard.simulate.scenarios import GIB, SCENARIOS


def test_its_bodies_are_read_as_sglang() -> None:
    scenario = SCENARIOS["overcommit"]
    body = sglang_metrics_text(scenario, scenario.load_seconds + 30, model="m", total_bytes=80 * GIB)
    reading = SglangReader().read(FamilyExtractor(SglangReader.families).extract(body))
    (model,) = reading.models
    figures = scenario.engine(scenario.load_seconds + 30)
    assert (model.requests_running, model.requests_waiting) == (figures.running, figures.waiting)
    assert model.kv_cache_usage_ratio == round(figures.kv_cache_usage, 2)
    memory = dict(reading.memory_bytes)
    assert memory["weights"] == pytest.approx(16 * GIB, rel=1e-3)
    assert memory["weights"] + memory["kv_cache"] == pytest.approx(scenario.gpu_memory_utilization * 80 * GIB, rel=1e-3)
    assert sglang_metrics_text(scenario, 1.0, model="m", total_bytes=80 * GIB) == ""  # still loading


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_every_engine_can_be_simulated(engine: str) -> None:
    assert load_config(None, {"simulation": {"scenario": "steady", "engine": engine}}).simulation.engine == engine


def test_only_engines_with_a_simulator_can_be_simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every engine has one today; a plugin added without one is refused, with the ones to choose from.
    monkeypatch.setitem(ENGINES, "tgi", replace(ENGINES["tgi"], simulator=None))
    with pytest.raises(ConfigError, match="'tgi' has no simulator; choose one of: vllm, sglang, triton"):
        load_config(None, {"simulation": {"scenario": "steady", "engine": "tgi"}})


async def test_serve_simulate_runs_sglang(tmp_path: Path) -> None:
    """Loading (503) then up, its reservation from /server_info in the joins, as the vLLM simulation does."""
    runtime = simulated_runtime("sglang", "default-steady", 20, tmp_path / "engine.log")
    assert [t.name for t in runtime.config.targets] == ["sim-sglang"]
    await runtime.start()
    try:
        states = []
        async with aiohttp.ClientSession():
            for _ in range(100):
                snapshot = await runtime.collection.snapshot()
                (target,) = snapshot.targets
                states.append(target.state)
                if target.state == "up" and target.engine_reading and target.engine_reading.memory_utilization_ratio:
                    break
                await asyncio.sleep(0.1)
        assert states[0] == "loading" and states[-1] == "up", states
        assert target.health_status == 200
        assert target.engine_reading.memory_utilization_ratio == SCENARIOS["default-steady"].gpu_memory_utilization
        assert snapshot.gpu_memory[("", "0")].reserved_bytes > 0
    finally:
        await runtime.stop()
