"""Runs a scenario: the simulated engine as a real child process, and the GPUs it uses.

The runner plays the orchestrator too: when the engine dies (simulated CUDA OOM)
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

from oomguard.config import TargetConfig
from oomguard.engines import ENGINES
from oomguard.ports import free_port
from oomguard.simulate.fake_nvml import GIB, FakeGpu, FakeNvml, FakeProcess
from oomguard.simulate.scenarios import SCENARIOS
from oomguard.sources.processes import start_time

log = logging.getLogger(__name__)

IDLE_GPU_BYTES = 512 * 1024**2  # what an idle GPU shows: contexts of monitoring tools


SIMULATED_TARGET = "sim-vllm"


class Simulation:
    def __init__(
        self,
        scenario: str,
        *,
        gpus: int = 1,
        time_scale: float = 1.0,
        log_path: Path | None = None,
        engine: str = "vllm",
    ) -> None:
        self.scenario = SCENARIOS[scenario]
        simulator = ENGINES[engine].simulator
        if simulator is None:
            raise ValueError(f"engine {engine!r} has no simulator")
        self.engine = engine
        self.simulator = simulator
        self.time_scale = time_scale
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.gpu_total = 80 * GIB
        self.nvml = FakeNvml(
            [FakeGpu(i, total_bytes=self.gpu_total, used_bytes=IDLE_GPU_BYTES) for i in range(gpus)],
            before_call=self._refresh_on_count,
        )
        self.restarts = 0
        self._child: asyncio.subprocess.Process | None = None
        self._launched_at = 0.0
        self._task: asyncio.Task[None] | None = None

    def _refresh_on_count(self, call: str) -> None:
        # nvmlDeviceGetCount opens every read of the NVML source: bring the GPUs up to date.
        if call != "nvmlDeviceGetCount":
            return
        gpu = self.nvml.gpus[0]
        child = self._child
        if child is None or child.returncode is not None:
            gpu.used_bytes, gpu.processes, gpu.utilization_percent = IDLE_GPU_BYTES, [], 0
            return
        t = (time.time() - (start_time(child.pid) or self._launched_at)) * self.time_scale
        engine_bytes = int(self.scenario.gpu_used_ratio(t, self.restarts) * self.gpu_total)
        gpu.used_bytes = IDLE_GPU_BYTES + engine_bytes
        gpu.processes = [FakeProcess(child.pid, engine_bytes)]
        gpu.utilization_percent = 0 if t < self.scenario.load_seconds else 85

    def target(self) -> TargetConfig:
        """The simulated engine as a target: its URL, the GPU it runs on, its log."""
        logs = (str(self.log_path),) if self.log_path else ()
        return TargetConfig(name=SIMULATED_TARGET, url=self.url, engine=self.engine, gpus=(0,), logs=logs)

    async def start(self) -> None:
        self._task = asyncio.ensure_future(self._supervise())

    async def _supervise(self) -> None:
        while True:
            stderr = self.log_path.open("ab") if self.log_path else asyncio.subprocess.DEVNULL
            try:
                self._launched_at = time.time()
                self._child = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    self.simulator,
                    "--scenario",
                    self.scenario.name,
                    "--port",
                    str(self.port),
                    "--time-scale",
                    str(self.time_scale),
                    "--gpu-total-bytes",
                    str(self.gpu_total),
                    # The life number goes in the environment: the command line must stay the same
                    # across restarts, as an orchestrator's does (restarts are recognised by it).
                    env={**os.environ, "OOMGUARD_SIM_LIFE": str(self.restarts)},
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=stderr,
                )
                code = await self._wait_or_kill(self._child)
            finally:
                if self.log_path:
                    stderr.close()  # type: ignore[union-attr]
            self.restarts += 1
            log.info("simulated engine exited with %s; relaunching (restart %d)", code, self.restarts)
            await asyncio.sleep(self.scenario.restart_delay / self.time_scale)

    async def _wait_or_kill(self, child: asyncio.subprocess.Process) -> int:
        """The child's exit code; a scenario's probe kills it (SIGKILL, nothing logged) once it has served a while."""
        kill_after = self.scenario.kill_after_serving
        if kill_after is None:
            return await child.wait()
        try:
            return await asyncio.wait_for(child.wait(), (self.scenario.load_seconds + kill_after) / self.time_scale)
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
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._child.wait(), 5)
            if self._child.returncode is None:
                self._child.kill()
                await self._child.wait()
