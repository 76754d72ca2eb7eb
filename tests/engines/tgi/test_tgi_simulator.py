"""The simulated TGI: one life as a process (refused while loading, read by the TGI reader once up, its OOM at
the end), and `serve --simulate` running it through the OOM and the relaunch."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from support import value

from oomguard.config import load_config
from oomguard.engines import ENGINES
from oomguard.engines.tgi.reader import TgiReader
from oomguard.engines.tgi.simulator import max_total_tokens, tgi_metrics_text
from oomguard.events.catalogue import load_catalogue
from oomguard.events.detector import IncidentDetector
from oomguard.exposition import render
from oomguard.ports import free_port
from oomguard.promtext import FamilyExtractor
from oomguard.runtime import Runtime
from oomguard.simulate.scenarios import GIB, SCENARIOS

QUICK = SCENARIOS["overcommit-quick"]  # loads in 120 s, dies of CUDA OOM ~12 simulated minutes after launch


def get(port: int, path: str) -> tuple[int | None, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return None, ""  # refused: the router is not started yet


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
    scale = 100.0  # 12.3 simulated minutes in ~7.4 s
    port = free_port()
    child = subprocess.Popen(
        [sys.executable, "-m", "oomguard.engines.tgi.simulator", "--scenario", QUICK.name, "--port", str(port),
         "--time-scale", str(scale)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    started = time.time()
    seen: list[int | None] = []
    body = ""
    try:
        while child.poll() is None and time.time() - started < 30:
            status, _ = get(port, "/health")
            if not seen or seen[-1] != status:
                seen.append(status)
            if status == 200 and not body:
                _, body = get(port, "/metrics")
            time.sleep(0.02)
        _, log = child.communicate(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 1, log
    assert seen[0] is None and 200 in seen, seen  # refused while loading, then healthy
    (model,) = TgiReader().read(FamilyExtractor(TgiReader.families).extract(body)).models
    assert model.requests_running is not None and model.requests_running >= 4
    assert model.kv_cache_usage_ratio is not None and 0 < model.kv_cache_usage_ratio <= 1
    lines = log.splitlines()
    assert "text_generation_launcher: Args {" in lines[0]
    assert any("torch.OutOfMemoryError: CUDA out of memory" in line for line in lines)
    assert "Shard 0 crashed" in log
    # Read by TGI's patterns: one start, then one CUDA OOM for the whole death.
    detector = IncidentDetector(load_catalogue("tgi"), line_prefix=ENGINES["tgi"].log_line_prefix)
    for line in lines:
        detector.feed(line, 0.0)
    assert [e.kind for e in detector.take_starts()] == ["startup"]
    assert [e.kind for e in detector.tick(600.0)] == ["cuda_oom"]


def test_a_start_without_its_memory_fails_the_warm_up_and_exits() -> None:
    scenario = next(s for s in SCENARIOS.values() if s.startup_fails_from_life == 0)
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "oomguard.engines.tgi.simulator", "--scenario", scenario.name, "--port", str(port),
         "--time-scale", str(max(100.0, scenario.load_seconds))],
        stderr=subprocess.PIPE, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    detector = IncidentDetector(load_catalogue("tgi"), line_prefix=ENGINES["tgi"].log_line_prefix)
    for line in result.stderr.splitlines():
        detector.feed(line, 0.0)
    assert [e.kind for e in detector.tick(600.0)] == ["startup_memory"], result.stderr


async def test_serve_simulate_runs_tgi_through_its_oom_and_restart(tmp_path: Path) -> None:
    scale = 60.0
    config = load_config(
        None,
        {
            "simulation": {"scenario": QUICK.name, "engine": "tgi", "time_scale": scale},
            "trend": {"enabled": False},
            "events": {"kernel_log": False, "xid": False},
        },
    )
    runtime = Runtime(config, simulation_log=tmp_path / "engine.log")
    assert [t.name for t in runtime.config.targets] == ["sim-tgi"]
    await runtime.start()
    try:
        states: list[str] = []
        peak_waiting = 0.0
        text = ""
        # the first life, the orchestrator's back-off, the second load, and some slack
        deadline = time.time() + ((QUICK.oom_at or 0) + QUICK.restart_delay + QUICK.load_seconds) / scale + 15
        while time.time() < deadline:
            snapshot = await runtime.collection.snapshot()
            text = render(snapshot).decode()
            (target,) = snapshot.targets
            if not states or states[-1] != target.state:
                states.append(target.state)
            if target.state == "up":
                peak_waiting = max(peak_waiting, value(text, "oomguard_engine_requests_waiting", target="sim-tgi",
                                                       model_name=""))  # fmt: skip
                assert value(text, "oomguard_engine_requests_running", target="sim-tgi", model_name="") >= 4
            if states[-3:] == ["down", "loading", "up"]:
                break
            await asyncio.sleep(0.2)
        assert states[:2] == ["loading", "up"], states
        assert states[-3:] == ["down", "loading", "up"], states
        assert peak_waiting > 10, peak_waiting
        await asyncio.sleep(1.0)  # the event poller reads the log every 0.5 s
        text = render(await runtime.collection.snapshot()).decode()
        assert value(text, "oomguard_target_events_total", target="sim-tgi", kind="cuda_oom") == 1.0, text
        assert value(text, "oomguard_target_restarts_total", target="sim-tgi") == 1.0
    finally:
        await runtime.stop()
