"""The simulated TGI: one life as a process (refused while loading, read by the TGI reader once up, its OOM at
the end), and `serve --simulate` running it through the OOM and the relaunch."""

from __future__ import annotations

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

from oomguard.common.promtext import FamilyExtractor
from oomguard.exporter.engines.tgi.reader import TgiReader
from oomguard.exporter.exposition import render
from oomguard.exporter.model import Snapshot, TargetReading
from oomguard.simulate.engines.tgi import max_total_tokens, tgi_metrics_text
from oomguard.simulate.scenarios import GIB, SCENARIOS

QUICK = SCENARIOS["overcommit-quick"]  # loads in 120 s, dies of CUDA OOM ~12 simulated minutes after launch


def test_its_body_is_read_as_tgi_with_the_scenarios_figures() -> None:
    t = QUICK.load_seconds + 200  # overloaded: the queue grows
    reading = TgiReader().read(
        FamilyExtractor(TgiReader.families).extract(tgi_metrics_text(QUICK, t, total_bytes=80 * GIB))
    )
    (model,) = reading.models
    figures = QUICK.engine(t)
    assert figures.waiting > 10
    assert (model.requests_waiting, model.requests_running) == (figures.waiting, figures.running)
    capacity = max_total_tokens(QUICK, 80 * GIB)
    assert model.kv_cache_usage_ratio == pytest.approx(figures.kv_cache_usage, abs=1 / capacity)
    assert model.preemptions_total is None  # TGI has no preemption metric
    assert reading.memory_utilization_ratio is None  # --cuda-memory-fraction is published nowhere


def test_one_life_refuses_while_loading_serves_then_dies_of_its_oom() -> None:
    seen: list[int | None] = []
    body = ""

    def watch(port: int, _: object) -> None:
        nonlocal body
        status, _ = http_get(port, "/health")
        if not seen or seen[-1] != status:
            seen.append(status)
        if status == 200 and not body:
            _, body = http_get(port, "/metrics")

    code, log = run_life("tgi", QUICK.name, 100.0, watch)  # 12.3 simulated minutes in ~7.4 s
    assert code == 1, log
    assert seen[0] is None and 200 in seen, seen  # refused while loading, then healthy
    (model,) = TgiReader().read(FamilyExtractor(TgiReader.families).extract(body)).models
    assert model.requests_running is not None and model.requests_running >= 4
    assert model.kv_cache_usage_ratio is not None and 0 < model.kv_cache_usage_ratio <= 1
    lines = log.splitlines()
    assert "text_generation_launcher: Args {" in lines[0]
    assert any("torch.OutOfMemoryError: CUDA out of memory" in line for line in lines)
    assert "Shard 0 crashed" in log
    # Read by TGI's patterns: one start, then one CUDA OOM for the whole death.
    assert log_events("tgi", log) == (["cuda_oom"], 1), log


def test_a_start_without_its_memory_fails_the_warm_up_and_exits() -> None:
    scenario = next(s for s in SCENARIOS.values() if s.startup_fails_from_life == 0)
    code, log = run_life("tgi", scenario.name, max(100.0, scenario.load_seconds))
    assert code == 1, log
    assert log_events("tgi", log)[0] == ["startup_memory"], log


async def test_serve_simulate_runs_tgi_through_its_oom_and_restart(tmp_path: Path) -> None:
    scale = 60.0
    runtime = simulated_runtime("tgi", QUICK.name, scale, tmp_path / "engine.log")
    assert [t.name for t in runtime.config.targets] == ["sim-tgi"]
    await runtime.start()
    try:
        peak_waiting = 0.0

        def look(snapshot: Snapshot, target: TargetReading) -> None:
            nonlocal peak_waiting
            # Its /metrics read: the state is /health's word, and a relaunch that starts listening between the
            # two requests of a scrape is up with its /metrics refused.
            if target.up:
                text = render(snapshot).decode()
                peak_waiting = max(peak_waiting, value(text, "oomguard_engine_requests_waiting", target="sim-tgi",
                                                       model_name=""))  # fmt: skip
                assert value(text, "oomguard_engine_requests_running", target="sim-tgi", model_name="") >= 4

        states = await states_through_restart(runtime, QUICK, scale, look)
        assert states[:2] == ["loading", "up"], states
        assert came_back_up(states), states
        assert peak_waiting > 10, peak_waiting
        # Every OOM and every relaunch its log holds counted once (the engine stopped, the log final).
        counts = await counts_after_stop(runtime, tmp_path / "engine.log", "tgi", "sim-tgi")
        assert all(counted == written >= 1 for counted, written in counts.values()), counts
    finally:
        await runtime.stop()
