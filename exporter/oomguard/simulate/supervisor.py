"""Runs a scenario: the simulated engine as a real child process, and the GPUs it uses.

The engine spans the scenario's GPUs (0 .. gpus - 1): each shows the engine's share of it
for the time, plus what an idle GPU shows, and lists the engine's pid with its bytes
(the simulated engine is one process; a real vLLM lists one worker per GPU, all children
of the listener, which the exporter matches alike). Further GPUs stay idle.

The supervisor plays the orchestrator too: when the engine dies (simulated CUDA OOM)
it relaunches it after the scenario's back-off, so restart loops look as they do
in production. The fake NVML reads the same scenario clock as the child.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from pathlib import Path

from oomguard.common.ports import free_port
from oomguard.common.process_start import start_time
from oomguard.common.time_scale import TimeScale
from oomguard.exporter.config import TargetConfig
from oomguard.exporter.engines import ENGINES
from oomguard.simulate.fake_nvml import FakeGpu, FakeNvml, FakeProcess
from oomguard.simulate.scenarios import GPU_TOTAL_BYTES, IDLE_GPU_BYTES, SCENARIOS

log = logging.getLogger(__name__)


# What the simulation's fake NVML answers for the driver's version: NVML's own "NVML started, driver ..." line, and
# oomguard_gpu_info's driver_version, then say that no real driver is read.
SIMULATED_DRIVER = "550.54.15 (simulated: oomguard's fake NVML, no real driver)"

# The foreign process of a scenario that shares its GPU: a pid no process on this host has (pid_max is at most
# 2^22), so the exporter counts its bytes as another process's, as it would a stranger's.
FOREIGN_PID = 4_194_304 + 7


class Simulation:
    def __init__(
        self,
        scenario: str,
        *,
        gpus: int = 1,
        time_scale: float = 1.0,
        log_path: Path | None = None,
        engine: str,
        simulator: str,
        told: tuple[str, str] | None = None,
    ) -> None:
        """`engine`: the simulated engine's name; `simulator`: its simulator's module (run as `python -m`); `told`:
        the flags it is told its reservation and tensor-parallel size with. simulate/engines/__init__.py gives all three
        from the engine's plugin."""
        self.scenario = SCENARIOS[scenario]
        self.engine = engine
        self.simulator = simulator
        self.told = told
        self.clock = TimeScale(time_scale)  # the scenario's: its seconds pass `time_scale` times faster
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.gpu_total = GPU_TOTAL_BYTES
        # `gpus` (the configuration's) is the number of fake GPUs; the scenario's engine may need more.
        self.nvml = FakeNvml(
            [
                FakeGpu(i, total_bytes=self.gpu_total, used_bytes=IDLE_GPU_BYTES)
                for i in range(max(gpus, self.scenario.gpus))
            ],
            before_call=self._refresh_on_count,
            driver_version=SIMULATED_DRIVER,
        )
        self.restarts = 0
        self._child: asyncio.subprocess.Process | None = None
        self._launched_at = 0.0
        self._first_launched_at: float | None = None
        self._task: asyncio.Task[None] | None = None

    def _refresh_on_count(self, call: str) -> None:
        # nvmlDeviceGetCount opens every read of the NVML source: bring the GPUs up to date.
        if call == "nvmlDeviceGetCount":
            self._refresh()

    def current_gpus(self) -> list[FakeGpu]:
        """The GPUs as they are now (for a reader other than NVML's: the simulated dcgm-exporter)."""
        self._refresh()
        return self.nvml.gpus

    def _refresh(self) -> None:
        first = self._first_launched_at
        foreign = self.scenario.foreign_ratio(self.clock.simulated(time.time() - first)) if first is not None else 0.0
        child = self._child
        if child is None or child.returncode is not None:
            self.show(None, foreign=foreign)
            return
        # The start time is read to a clock tick against a boot time taken once: it can be a few ms in the future.
        t = self.clock.simulated(max(0.0, time.time() - (start_time(child.pid) or self._launched_at)))
        self.show(t, pid=child.pid, life=self.restarts, foreign=foreign)

    def show(self, t: float | None, *, pid: int = 0, life: int = 0, foreign: float = 0.0) -> None:
        """Sets the fake GPUs as NVML shows them `t` simulated seconds after the engine's launch (in its
        life number `life`), the engine being process `pid`; `t` None: no engine runs, every GPU idle but for
        the foreign process, which holds `foreign` of GPU 0."""
        for gpu in self.nvml.gpus:
            processes, used = [], IDLE_GPU_BYTES
            if gpu.index == 0 and foreign > 0:
                foreign_bytes = int(foreign * self.gpu_total)
                processes.append(FakeProcess(FOREIGN_PID, foreign_bytes))
                used += foreign_bytes
            if t is None or gpu.index >= self.scenario.gpus:
                gpu.used_bytes, gpu.processes, gpu.utilization_percent = used, processes, 0
                continue
            engine_bytes = int(self.scenario.gpu_used_ratio(t, life, gpu.index) * self.gpu_total)
            gpu.used_bytes = used + engine_bytes
            gpu.processes = [FakeProcess(pid, engine_bytes), *processes]
            gpu.utilization_percent = 0 if t < self.scenario.load_seconds else 85

    @property
    def gpus(self) -> tuple[int, ...]:
        """The GPUs the simulated engine runs on."""
        return tuple(range(self.scenario.gpus))

    def target(self) -> TargetConfig:
        """The simulated engine as a target, named sim-ENGINE (sim-vllm by default): its URL, its GPUs, its log."""
        logs = (str(self.log_path),) if self.log_path else ()
        name = f"sim-{self.engine}"
        return TargetConfig(name=name, url=self.url, engine=self.engine, gpus=self.gpus, logs=logs)

    def told_args(self) -> list[str]:
        """The engine's reservation (a share of each GPU's total) and its tensor-parallel size on its command line,
        as its orchestrator passes them, where the engine takes both: the simulated engine's command line carries
        the scenario's (engine_args.py)."""
        if self.told is None:
            return []
        reservation, tensor_parallel = self.told
        return [reservation, str(self.scenario.gpu_memory_utilization), tensor_parallel, str(self.scenario.gpus)]

    async def start(self) -> None:
        self._task = asyncio.ensure_future(self._supervise())

    async def _supervise(self) -> None:
        while True:
            stderr = self.log_path.open("ab") if self.log_path else asyncio.subprocess.DEVNULL
            try:
                self._launched_at = time.time()
                if self._first_launched_at is None:
                    self._first_launched_at = self._launched_at
                foreign = self.scenario.foreign_ratio(self.clock.simulated(self._launched_at - self._first_launched_at))
                self._child = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    self.simulator,
                    "--scenario",
                    self.scenario.name,
                    "--port",
                    str(self.port),
                    "--time-scale",
                    str(self.clock.factor),
                    "--gpu-total-bytes",
                    str(self.gpu_total),
                    *self.told_args(),
                    # The life number goes in the environment: the command line must stay the same
                    # across restarts, as an orchestrator's does (restarts are recognised by it).
                    env={**os.environ, "OOMGUARD_SIM_LIFE": str(self.restarts), "OOMGUARD_SIM_FOREIGN": str(foreign)},
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=stderr,
                )
                code = await self._wait_or_kill(self._child)
            finally:
                if self.log_path:
                    stderr.close()  # type: ignore[union-attr]
            self.restarts += 1
            log.info("simulated engine exited with %s; relaunching (restart %d)", code, self.restarts)
            await asyncio.sleep(self.clock.real(self.scenario.restart_delay))

    async def _wait_or_kill(self, child: asyncio.subprocess.Process) -> int:
        """The child's exit code; a scenario's probe kills it (SIGKILL, nothing logged) once it has served a while."""
        kill_after = self.scenario.kill_after_serving
        if kill_after is None:
            return await child.wait()
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for loses a cancellation that comes as the child exits,
            # and the supervisor would relaunch the engine after stop().
            async with asyncio.timeout(self.clock.real(self.scenario.load_seconds + kill_after)):
                return await child.wait()
        except TimeoutError:
            child.kill()
            return await child.wait()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._child is not None and self._child.returncode is None:
            self._child.terminate()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await self._child.wait()
            if self._child.returncode is None:
                self._child.kill()
                await self._child.wait()


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
