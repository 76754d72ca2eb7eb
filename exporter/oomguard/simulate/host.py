"""The simulated host the exporter runs beside: what the composition root (cli.py's `serve --simulate`, the drill, the
tests) builds from the configuration's `simulation:` and hands the exporter's runtime (`Runtime(config,
simulated=SimulatedHost(config))`, the runtime's `Simulated`).

It holds the simulated engine's supervisor (supervisor.py, given what the engine's plugin knows of its simulator),
its GPUs (a fake NVML, or a simulated dcgm-exporter beside it: `simulation.gpu_source: dcgm`) and the scenario's
clock, which every duration the exporter judges runs on (clock.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

from oomguard.common.time_scale import TimeScale
from oomguard.exporter.config import Config, DcgmConfig
from oomguard.exporter.model import TrendSettings
from oomguard.simulate.clock import events_on_clock, trend_on_clock
from oomguard.simulate.dcgm_exporter import SimulatedDcgmExporter
from oomguard.simulate.supervisor import simulation

log = logging.getLogger(__name__)

SIMULATED_NODE = "sim-node"  # the hostname the simulated dcgm-exporter writes


class SimulatedHost:
    def __init__(self, config: Config, *, log_path: Path | None = None, start_engine: bool = True) -> None:
        """The simulation `config.simulation` names. `log_path`: the engine's log (the caller's; None: one of our
        own, removed at stop). `start_engine=False` leaves the engine to be started by the caller (the drill starts
        it once Prometheus scrapes: `host.engine.start()`)."""
        sim = config.simulation
        if not sim.scenario:
            raise ValueError("the configuration simulates nothing: set simulation.scenario")
        self._own_log = (
            None if log_path else Path(tempfile.gettempdir()) / f"oomguard-sim-{os.getpid()}-{secrets.token_hex(4)}.log"
        )
        self.log_path = log_path or self._own_log
        self.engine = simulation(
            sim.scenario, gpus=sim.gpus, time_scale=sim.time_scale, log_path=self.log_path, engine=sim.engine
        )
        # The cluster mode's GPU source: a simulated dcgm-exporter beside the engine, its URL known at start.
        self.dcgm = (
            SimulatedDcgmExporter(
                self.engine.current_gpus, node=SIMULATED_NODE, pod=("sim", f"sim-{sim.engine}", sim.engine),
                pod_gpus=self.engine.gpus, version=sim.dcgm_version,
            )
            if sim.gpu_source == "dcgm"
            else None
        )  # fmt: skip
        self.clock = TimeScale(sim.time_scale)
        self._start_engine = start_engine
        log.info("simulation %r: engine at %s, its log in %s", sim.scenario, self.engine.url, self.log_path)

    @property
    def nvml(self) -> Any:
        return self.engine.nvml

    def configure(self, config: Config) -> Config:
        """The engine a target; every duration the exporter judges on the scenario's clock (clock.py)."""
        config = config.model_copy(update={"targets": (*config.targets, self.engine.target())})
        return events_on_clock(config, self.clock)

    def trend_settings(self, config: Config) -> TrendSettings:
        return trend_on_clock(config, self.clock)

    async def start(self, config: Config) -> Config:
        if self.dcgm is not None:
            await self.dcgm.start()
            dcgm = DcgmConfig(urls=(self.dcgm.url,), timeout_seconds=config.nvml.timeout_seconds)
            config = config.model_copy(update={"dcgm": dcgm})
        if self._start_engine:
            await self.engine.start()
        return config

    async def stop(self) -> None:
        await self.engine.stop()  # first: its supervisor would make the log again at a relaunch
        if self.dcgm is not None:
            await self.dcgm.stop()
        if self._own_log is not None:
            await asyncio.to_thread(self._own_log.unlink, missing_ok=True)
