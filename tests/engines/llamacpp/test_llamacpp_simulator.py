"""The simulated llama-server: its bodies read by the llama.cpp reader and /slots, one life as a process, and
`serve --simulate` running it through its OOM and a restart."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import pytest
from simulated_engines import counts_after_stop, http_get, log_events, run_life, simulated_runtime
from support import samples, value

from oomguard.common.process_start import start_time
from oomguard.common.promtext import FamilyExtractor
from oomguard.exporter.engines.llamacpp.reader import LlamaCppReader
from oomguard.exporter.engines.llamacpp.slots import kv_usage_ratio
from oomguard.exporter.events.catalogue import load_catalogue
from oomguard.exporter.web import make_app
from oomguard.simulate.engines.llamacpp import SLOTS, llamacpp_metrics_text, processing_deferred, slots_body
from oomguard.simulate.scenarios import SCENARIOS

QUICK = SCENARIOS["overcommit-quick"]  # 2 simulated minutes of load, dies 12.3 minutes after launch


def read(body: str) -> tuple[float | None, float | None]:
    (model,) = LlamaCppReader().read(FamilyExtractor(LlamaCppReader.families).extract(body)).models
    return model.requests_running, model.requests_waiting


@pytest.mark.parametrize("name", ["overcommit", "default-steady"])
def test_its_bodies_are_read_as_llamacpp(name: str) -> None:
    """Every simulated second of a first life: the batch churning, then (overcommit) the overload."""
    scenario = SCENARIOS[name]
    end = scenario.death_at(0) or scenario.load_seconds + 600
    overloaded = 0
    for t in range(int(scenario.load_seconds) + 1, int(end)):
        figures = scenario.engine(t)
        # The slots cap what runs: a request beyond them is deferred, with those the scenario queues.
        running, waiting = read(llamacpp_metrics_text(scenario, t))
        assert running == min(figures.running, SLOTS), t
        assert running + waiting == figures.running + figures.waiting, t
        overloaded += figures.running > SLOTS
        slots = json.loads(json.dumps(slots_body(scenario, t)))  # as it goes over the wire
        assert sum(s["is_processing"] for s in slots) == running
        assert kv_usage_ratio(slots) == pytest.approx(figures.kv_cache_usage, abs=1e-4), t
    assert overloaded > 0 if name == "overcommit" else overloaded == 0


def around(t0: float, t1: float) -> list[float]:
    """Moments of the scenario's clock about [t0, t1]: the process's start time is known to a jiffy or so."""
    return [t0 - 1 + i * 0.05 for i in range(int((t1 - t0 + 2) / 0.05) + 1)]


def test_one_life_loads_serves_and_dies_of_cudamalloc() -> None:
    # The load in 4 s, the death 24.6 s after launch. Not 60x: the load's 2 s were once gone before the simulator had
    # imported what it needs to listen (four test workers on two cores), and no 503 was seen.
    scale = 30.0
    health: list[tuple[int | None, str]] = []
    checked = 0

    def watch(port: int, child: subprocess.Popen[str]) -> None:
        nonlocal checked
        answer = http_get(port, "/health")
        if not health or health[-1] != answer:
            health.append(answer)
        launched = start_time(child.pid)
        if answer[0] == 200 and launched is not None and checked < 5:
            t0 = (time.time() - launched) * scale
            status, metrics = http_get(port, "/metrics")
            _, slots = http_get(port, "/slots")
            t1 = (time.time() - launched) * scale
            if status == 200:
                window = around(t0, t1)
                assert read(metrics) in {processing_deferred(QUICK, t) for t in window}, (t0, metrics)
                ratio = kv_usage_ratio(json.loads(slots))
                kv = [QUICK.engine(t).kv_cache_usage for t in window]
                assert min(kv) - 1e-3 <= ratio <= max(kv) + 1e-3, (t0, ratio, kv)
                checked += 1

    code, log = run_life("llamacpp", QUICK.name, scale, watch, timeout=60.0)
    assert code == 1, log
    assert checked == 5, health
    statuses = [status for status, _ in health]
    assert statuses[-1] in (200, None) and 503 in statuses, health  # it listens while it loads
    assert statuses.index(503) < statuses.index(200), health
    assert json.loads(dict(health)[503]) == {"error": {"code": 503, "message": "Loading model",
                                                       "type": "unavailable_error"}}  # fmt: skip
    assert json.loads(dict(health)[200]) == {"status": "ok"}
    # Its log, as the llama.cpp patterns read it: a start, then the death's CUDA OOM, last.
    catalogue = load_catalogue(engine="llamacpp")
    kinds = [{p.kind for p in catalogue if p.regex.search(line)} for line in log.splitlines()]
    assert kinds.count({"startup"}) == 1, log
    assert "cuda_oom" in set().union(*kinds[-5:]) and "cuda_oom" not in set().union(*kinds[:-5]), log


async def test_serve_simulate_runs_llamacpp_through_its_oom(tmp_path: Path, aiohttp_client) -> None:
    """Loading, up with the scenario's figures, the OOM read from its log as one event, relaunched as a restart."""
    scale = 60.0
    runtime = simulated_runtime("llamacpp", QUICK.name, scale, tmp_path / "engine.log")
    assert [t.name for t in runtime.config.targets] == ["sim-llamacpp"]
    client = await aiohttp_client(make_app(runtime))
    peak_running = peak_waiting = peak_kv = 0.0
    text = ""
    deadline = time.time() + (QUICK.oom_at + QUICK.restart_delay + QUICK.load_seconds) / scale + 15
    while time.time() < deadline:
        text = await (await client.get("/metrics")).text()
        # Its /metrics read (the state is /health's word: at the end of a load the two may differ for a scrape).
        if value(text, "oomguard_target_up", target="sim-llamacpp") == 1.0:
            peak_running = max(peak_running, value(text, "oomguard_engine_requests_running", target="sim-llamacpp"))
            peak_waiting = max(peak_waiting, value(text, "oomguard_engine_requests_waiting", target="sim-llamacpp"))
            # /slots is a request of its own: one that the engine's death refuses leaves the ratio out, not at 0.
            kv = samples(text).get(("oomguard_engine_kv_cache_usage_ratio", (("target", "sim-llamacpp"),)))
            peak_kv = max(peak_kv, kv if kv is not None else 0.0)
        if value(text, "oomguard_target_restarts_total", target="sim-llamacpp") >= 1.0:
            break
        await asyncio.sleep(0.2)
    # The overload: every slot at work and full, the scenario's queue and the requests beyond the slots deferred.
    assert (peak_running, peak_waiting, peak_kv) == (SLOTS, 48 + 16 - SLOTS, 1.0)
    assert value(text, "oomguard_target_restarts_total", target="sim-llamacpp") >= 1.0, text
    # Every OOM and every relaunch its log holds counted once (the engine stopped, the log final): a relaunch
    # dies some 2 s after its load, so a count at a given moment depends on that moment.
    counts = await counts_after_stop(runtime, tmp_path / "engine.log", "llamacpp", "sim-llamacpp")
    assert all(read == written >= 1 for read, written in counts.values()), counts
    text = await (await client.get("/metrics")).text()
    assert counted(text, "startup_memory") == 0.0  # the death's buffer line is part of the one CUDA OOM


def counted(text: str, kind: str) -> float:
    try:
        return value(text, "oomguard_target_events_total", target="sim-llamacpp", kind=kind)
    except KeyError:
        return 0.0


def test_a_start_without_memory_writes_the_kv_failure_and_exits() -> None:
    """startup-oom: the weights load, the KV cache cannot be allocated: one startup_memory event, exit 1."""
    scenario = SCENARIOS["startup-oom"]
    code, log = run_life("llamacpp", scenario.name, 60.0)
    assert code == 1, log
    # Its start (for the restart count), then the KV cache's failure as one startup_memory event.
    assert log_events("llamacpp", log) == (["startup_memory"], 1), log
    assert log.splitlines()[-1] == "main: exiting due to model loading error"
