"""The engines' simulators, one module each (`python -m oomguard.simulate.engines.vllm`), and `simulation()`: the
supervisor (simulate/supervisor.py) given what an engine's plugin knows of its simulator."""

from __future__ import annotations

from pathlib import Path

from oomguard.exporter.engines import ENGINES
from oomguard.simulate.supervisor import Simulation


def simulation(
    scenario: str, *, engine: str = "vllm", gpus: int = 1, time_scale: float = 1.0, log_path: Path | None = None
) -> Simulation:
    """`scenario` (simulate/scenarios.py) played by `engine`'s simulator, told its flags as an orchestrator would."""
    plugin = ENGINES[engine]
    if plugin.simulator is None:
        raise ValueError(f"engine {engine!r} has no simulator")
    return Simulation(
        scenario, gpus=gpus, time_scale=time_scale, log_path=log_path, engine=engine, simulator=plugin.simulator,
        told=plugin.knobs.told_flags,
    )  # fmt: skip
