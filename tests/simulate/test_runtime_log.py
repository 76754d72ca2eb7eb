"""The simulated engine's log: a temporary file of the runtime's own, removed when it stops (a user's
`make run` left one `oomguard-sim-*.log` in /tmp per run)."""

from __future__ import annotations

import asyncio
import time

from oomguard.exporter.runtime import Runtime
from oomguard.simulate.checks import load_config
from oomguard.simulate.host import SimulatedHost


async def test_the_simulation_log_is_removed_at_stop() -> None:
    config = load_config(None, {"simulation": {"scenario": "steady", "time_scale": 30}})
    host = SimulatedHost(config)
    runtime = Runtime(config, simulated=host)
    log = host._own_log
    assert log is not None and not log.exists()
    await runtime.start()
    try:
        deadline = time.monotonic() + 20
        while not log.exists():  # the engine writes its first line as it starts
            assert time.monotonic() < deadline, "the simulated engine never wrote its log"
            await asyncio.sleep(0.05)
    finally:
        await runtime.stop()
    assert not log.exists()


async def test_a_log_the_caller_names_is_kept(tmp_path) -> None:
    named = tmp_path / "engine.log"
    config = load_config(None, {"simulation": {"scenario": "steady", "time_scale": 30}})
    runtime = Runtime(config, simulated=SimulatedHost(config, log_path=named))
    await runtime.start()
    try:
        deadline = time.monotonic() + 20
        while not named.exists():
            assert time.monotonic() < deadline, "the simulated engine never wrote its log"
            await asyncio.sleep(0.05)
    finally:
        await runtime.stop()
    assert named.exists()
