"""The simulated Triton (TensorRT-LLM backend): its bodies read by the Triton reader, one life as a process, a start
without memory, and `serve --simulate` running it through its OOM and a restart."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from simulated_engines import (
    came_back_up,
    counts_after_stop,
    http_get,
    log_events,
    run_life,
    simulated_runtime,
    states_through_restart,
)
from support import value

from oomguard.common.process_start import start_time
from oomguard.common.promtext import FamilyExtractor
from oomguard.exporter.engines.triton.reader import TritonReader
from oomguard.exporter.exposition import render
from oomguard.exporter.model import EngineReading, Snapshot, TargetReading
from oomguard.simulate.engines.triton import kv_blocks, triton_metrics_text
from oomguard.simulate.scenarios import GIB, SCENARIOS, EngineFigures, Scenario

QUICK = SCENARIOS["overcommit-quick"]  # dies 12.3 simulated minutes in: 7.4 s at 100x
TOTAL = 80 * GIB


def read(body: str) -> EngineReading:
    return TritonReader().read(FamilyExtractor(TritonReader.families).extract(body))


@pytest.mark.parametrize("serving", [30.0, 200.0, 500.0])  # churning, then overloaded with a full pool
def test_its_bodies_are_read_as_triton_with_the_scenarios_figures(serving: float) -> None:
    t = QUICK.load_seconds + serving
    reading = read(triton_metrics_text(QUICK, t, model="tensorrt_llm", total_bytes=TOTAL))
    (model,) = reading.models
    figures = QUICK.engine(t)
    assert model.model_name == "tensorrt_llm"
    assert (model.requests_running, model.requests_waiting) == (figures.running, figures.waiting)
    blocks = kv_blocks(QUICK, TOTAL)
    assert model.kv_cache_usage_ratio == pytest.approx(figures.kv_cache_usage, abs=1 / blocks)
    assert (reading.kv_cache_blocks, reading.kv_cache_block_size_tokens) == (blocks, 64.0)
    # A share of what the weights leave: no reservation is passed off as gpu_memory_utilization.
    assert reading.memory_utilization_ratio is None


def figures_around(scenario: Scenario, t0: float, t1: float) -> list[EngineFigures]:
    """The scenario's figures at any time between t0 and t1 (the request's time is known to that window)."""
    return [scenario.engine(t0 + (t1 - t0) * i / 40) for i in range(41)]


def run_triton_life(scenario: Scenario, scale: float) -> tuple[int, str, list[tuple[int | None, int | None]], int]:
    """Runs one life of the simulator as the runner does; returns its exit code, its log, the (/metrics,
    /v2/health/ready) statuses seen in turn, and how many /metrics bodies matched the scenario's figures."""
    seen: list[tuple[int | None, int | None]] = []
    matched = 0

    def watch(port: int, child: subprocess.Popen[str]) -> None:
        nonlocal matched
        before = time.time()
        status, body = http_get(port, "/metrics")
        after = time.time()
        health, _ = http_get(port, "/v2/health/ready")
        if not seen or seen[-1] != (status, health):
            seen.append((status, health))
        launched = start_time(child.pid)
        if status == 200 and launched is not None:
            # The simulator's clock starts with its process, known to a clock tick: a window around it.
            window = ((before - launched) * scale - 2.0, (after - launched) * scale + 2.0)
            (model,) = read(body).models
            got = (model.requests_running, model.requests_waiting)
            assert got in {(f.running, f.waiting) for f in figures_around(scenario, *window)}, (got, window)
            matched += 1

    code, log = run_life("triton", scenario.name, scale, watch, poll_seconds=0.05)
    return code, log, seen, matched


def test_one_life_refuses_while_loading_serves_then_dies_of_its_oom() -> None:
    code, log, seen, matched = run_triton_life(QUICK, 100.0)
    assert code == 1, log
    # Nothing listens while the model loads; then /metrics, and the metrics port's 404 for /v2/health/ready.
    assert seen[0] == (None, None), seen
    assert (200, 404) in seen, seen
    assert matched >= 5, matched
    lines = log.splitlines()
    assert "[TensorRT-LLM][ERROR] CUDA runtime error in" in lines[-1] and "out of memory" in lines[-1], log
    assert log_events("triton", log) == (["cuda_oom"], 1), log  # its OOM, once; its gRPC service line, a start


def test_a_start_without_its_memory_fails_the_load_and_exits() -> None:
    scenario = SCENARIOS["startup-oom"]
    code, log, seen, _ = run_triton_life(scenario, 100.0)
    assert code == 1, log
    assert set(seen) == {(None, None)}, seen  # it never listened
    assert log.splitlines()[-1] == "error: creating server: Internal - failed to load all models", log
    assert log_events("triton", log) == (["startup_memory"], 0), log


async def test_serve_simulate_runs_triton_through_its_oom_and_restart(tmp_path: Path) -> None:
    scale = 60.0
    runtime = simulated_runtime("triton", QUICK.name, scale, tmp_path / "engine.log")
    assert [t.name for t in runtime.config.targets] == ["sim-triton"]
    await runtime.start()
    try:
        peak_waiting = peak_kv = 0.0

        def look(snapshot: Snapshot, target: TargetReading) -> None:
            nonlocal peak_waiting, peak_kv
            if target.state == "up" and target.up:
                assert target.health_status == 404  # the metrics port's answer, counted as up with a good body
                text = render(snapshot).decode()
                labels = {"target": "sim-triton", "model_name": "tensorrt_llm"}
                assert value(text, "oomguard_engine_requests_running", **labels) >= 4
                peak_waiting = max(peak_waiting, value(text, "oomguard_engine_requests_waiting", **labels))
                peak_kv = max(peak_kv, value(text, "oomguard_engine_kv_cache_usage_ratio", **labels))

        states = await states_through_restart(runtime, QUICK, scale, look)
        assert states[:2] == ["loading", "up"], states
        assert came_back_up(states), states
        assert peak_waiting > 10 and peak_kv == 1.0, (peak_waiting, peak_kv)
        # Every OOM and every relaunch its log holds counted once (the engine stopped, the log final).
        counts = await counts_after_stop(runtime, tmp_path / "engine.log", "triton", "sim-triton")
        assert all(counted == written >= 1 for counted, written in counts.values()), counts
    finally:
        await runtime.stop()
