"""Histories for the backtest's tests, made without real time: the drill's scenarios as NVML and the engine would
have shown them (simulate/supervisor.py `Simulation.show` on the fake NVML, `Scenario.engine` for the engine's figures,
the supervisor's lives and back-offs), and synthetic fleets.

A scenario's history is what the drill's exporter reads, on the simulation's own clock: the engine's lives (each
loads, serves, dies of its OOM or its probe, or fails at start), the orchestrator's back-off between them, the
configured target on the engine's GPUs all along (loading, up or down), its reservation told while it loads and
given by the engine once it serves. Its OOMs are the lives' deaths by CUDA OOM and the starts that failed for
memory, as the engine's log says them.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from oomguard.backtest.ooms import Oom
from oomguard.drill.scenarios import SCENARIOS as DRILLS
from oomguard.simulate.scenarios import SCENARIOS
from oomguard.simulate.supervisor import simulation

T0 = 1_714_521_600.0  # 2024-05-01 00:00:00 UTC
PID = 4242  # the simulated engine's, in NVML's per-process list
COLUMNS = (
    "time", "node", "gpu", "used_bytes", "total_bytes", "engine_used_bytes", "target", "engine", "state",
    "kv_cache_usage", "waiting", "running", "preemptions_total", "gpu_memory_utilization", "max_num_seqs",
)  # fmt: skip


@dataclass(frozen=True)
class Life:
    number: int
    launched: float  # simulated seconds since the first launch
    ends: float  # math.inf: lives past the scenario's end
    how: str  # cuda_oom, startup_memory, probe_kill, "" (never ends)


def lives(name: str, until: float) -> list[Life]:
    """The engine's lives in the drill `name` over its first `until` simulated seconds (supervisor.py)."""
    scenario = SCENARIOS[DRILLS[name].simulation]
    out, at, number = [], 0.0, 0
    while at < until:
        if not scenario.starts(number):
            ends, how = at + scenario.load_seconds * 0.8, "startup_memory"  # the simulator exits after the weights
        elif (death := scenario.death_at(number)) is not None:
            ends, how = at + death, "cuda_oom"
        elif scenario.kill_after_serving is not None:
            ends, how = at + scenario.load_seconds + scenario.kill_after_serving, "probe_kill"
        else:
            ends, how = math.inf, ""
        out.append(Life(number, at, ends, how))
        at, number = ends + scenario.restart_delay, number + 1
    return out


def scenario_rows(
    name: str, *, step: float = 5.0, t0: float = T0, time_scale: float = 1.0
) -> tuple[list[dict[str, object]], list[Oom]]:
    """The drill `name` as a history of rows (files.py's columns) every `step` simulated seconds, and its OOMs.
    `time_scale`: on the drill's clock, `time_scale` times faster (its times divided: a simulated minute is two real
    seconds at 30x), as the drill's exporter and Prometheus see it."""
    drill = DRILLS[name]
    scenario = SCENARIOS[drill.simulation]
    sim = simulation(drill.simulation, engine=drill.engine)
    sim.nvml.before_call = None  # the GPUs stay as `show` sets them: no engine process to follow
    until = drill.minutes * 60
    timeline = lives(name, until)
    target = f"sim-{drill.engine}"
    rows: list[dict[str, object]] = []
    for i in range(int(until / step) + 1):
        t = i * step
        life = next((life for life in timeline if life.launched <= t < life.ends), None)
        foreign = scenario.foreign_ratio(t)
        age = None if life is None else t - life.launched
        sim.show(age, pid=PID, life=life.number if life else 0, foreign=foreign)
        engine: dict[str, object] = {"target": target, "engine": drill.engine}
        if life is None:
            engine["state"] = "down"
        elif age is not None and (age < scenario.load_seconds or not scenario.starts(life.number)):
            # Loading: no /metrics, the reservation told on its command line (simulate/supervisor.py told_args).
            engine.update(state="loading", gpu_memory_utilization=scenario.gpu_memory_utilization)
        else:
            assert life is not None and age is not None
            figures = scenario.engine(age, life.number)
            engine.update(
                state="up", kv_cache_usage=figures.kv_cache_usage, waiting=figures.waiting, running=figures.running,
                preemptions_total=figures.preemptions, gpu_memory_utilization=scenario.gpu_memory_utilization,
            )  # fmt: skip
        for gpu in sim.nvml.gpus:
            row: dict[str, object] = {"time": t0 + t / time_scale, "node": "", "gpu": gpu.index,
                                      "used_bytes": gpu.used_bytes, "total_bytes": sim.gpu_total}  # fmt: skip
            if gpu.index < scenario.gpus:
                row.update(engine)
                # NVML's per-process list as the node agent reads it: the engine's own bytes, the foreign process apart.
                row["engine_used_bytes"] = sum(p.used_bytes for p in gpu.processes if p.pid == PID)
            rows.append(row)
    ooms = [
        Oom(t0 + life.ends / time_scale, target=target, source=life.how)
        for life in timeline
        if life.how in ("cuda_oom", "startup_memory") and life.ends <= until
    ]
    return rows, ooms


def write_csv(path: Path, rows: list[dict[str, object]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, COLUMNS, extrasaction="raise")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return path


def write_ooms(path: Path, ooms: list[Oom]) -> Path:
    lines = []
    for oom in ooms:
        place = " ".join(f"{k}={v}" for k, v in (("gpu", oom.gpu), ("node", oom.node), ("target", oom.target)) if v)
        lines.append(f"{oom.t:.3f} {place}".strip())
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def synthetic_rows(
    *, hours: float, gpus: int = 8, step: float = 15.0, t0: float = T0, node: str = "node-1",
    leak: tuple[int, float, float] | None = None, engine_figures: bool = True,
) -> list[dict[str, object]]:  # fmt: skip
    """A fleet of `gpus` vLLM engines at gpu_memory_utilization 0.9, one per GPU, steady around their reservation;
    `leak` = (gpu, from hour, to hour): that GPU's memory beyond the reservation fills its headroom over the span."""
    out: list[dict[str, object]] = []
    total = 85e9
    for i in range(int(hours * 3600 / step)):
        t = i * step
        for g in range(gpus):
            ratio = 0.905 + 0.0005 * math.sin(i / 7.0 + g)
            if leak is not None and g == leak[0] and leak[1] * 3600 <= t < leak[2] * 3600:
                ratio += (t - leak[1] * 3600) / ((leak[2] - leak[1]) * 3600) * 0.094
            row: dict[str, object] = {"time": t0 + t, "node": node, "gpu": g, "used_bytes": round(ratio * total),
                                      "total_bytes": total, "target": f"vllm-{g}"}  # fmt: skip
            if engine_figures:
                row.update(
                    engine="vllm", kv_cache_usage=round(0.3 + 0.2 * ((i % 40) / 40), 3), waiting=1, running=5,
                    preemptions_total=i // 100, gpu_memory_utilization=0.9,
                )  # fmt: skip
            out.append(row)
    return out
