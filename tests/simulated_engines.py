"""What the simulator tests share: one life of a simulated engine as the runner runs it, and its log read by the
engine's own patterns.

Each engine's test says what it watches while the life runs (`watch(port)` every `poll_seconds`) and what its
log must hold; this starts the process on a free port, kills it if the test fails, and returns its end.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from support import value

from oomguard.common.ports import free_port
from oomguard.exporter.engines import ENGINES
from oomguard.exporter.events.catalogue import load_catalogue
from oomguard.exporter.events.detector import IncidentDetector
from oomguard.exporter.exposition import render
from oomguard.exporter.model import Snapshot, TargetReading
from oomguard.exporter.runtime import Runtime
from oomguard.simulate.checks import load_config
from oomguard.simulate.host import SimulatedHost
from oomguard.simulate.scenarios import Scenario


def http_get(port: int, path: str) -> tuple[int | None, str]:
    """(status, body) of a GET on the simulator; status None when nothing listens (it is still loading)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()  # a loading engine's 503 says so in its body
    except OSError:
        return None, ""


def run_life(
    engine: str,
    scenario: str,
    scale: float,
    watch: Callable[[int, subprocess.Popen[str]], None] | None = None,
    *,
    poll_seconds: float = 0.02,
    timeout: float = 30.0,
) -> tuple[int, str]:
    """Runs one life of `engine`'s simulator (`python -m oomguard.simulate.engines.<engine>`) to its end, calling
    `watch(port, child)` while it lives; returns its exit code and its log (stderr)."""
    port = free_port()
    child = subprocess.Popen(
        [sys.executable, "-m", f"oomguard.simulate.engines.{engine}", "--scenario", scenario,
         "--port", str(port), "--time-scale", str(scale)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    try:
        while child.poll() is None and time.monotonic() < deadline:
            if watch is not None:
                watch(port, child)
            time.sleep(poll_seconds)
        _, log = child.communicate(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return child.returncode, log


def log_events(engine: str, log: str) -> tuple[list[str], int]:
    """The event kinds `engine`'s patterns find in a log (each incident closed), and how many startup lines."""
    detector = IncidentDetector(load_catalogue(engine), grammar=ENGINES[engine].log_grammar)
    events = []
    for line in log.splitlines():
        events += detector.feed(line, 0.0)  # a startup line closes the incident before it
    return [e.kind for e in events + detector.tick(600.0)], len(detector.take_starts())


def simulated_runtime(engine: str, scenario: str, scale: float, log: Path) -> Runtime:
    """`oomguard serve --simulate` on `engine`'s simulator (no trend, no kernel log or XIDs), its log written to
    `log`: the runtime, not started."""
    config = load_config(None, {
        "simulation": {"scenario": scenario, "engine": engine, "time_scale": scale},
        "trend": {"enabled": False},
        "events": {"kernel_log": False, "xid": False},
    })  # fmt: skip
    return Runtime(config, simulated=SimulatedHost(config, log_path=log))


def came_back_up(states: list[str]) -> bool:
    """`states` (each change of a target's state once) went up, then not up, then up again. What lies between
    is down, then loading; or loading alone when the orchestrator relaunched the engine between two looks (its
    back-off is half a second at 60x), so a test cannot count on seeing down."""
    return len(states) >= 4 and states[1] == "up" and states[-1] == "up"


async def states_through_restart(
    runtime: Runtime, scenario: Scenario, scale: float, look: Callable[[Snapshot, TargetReading], None]
) -> list[str]:
    """Reads the started `runtime`'s one target every 0.2 s, calling `look(snapshot, target)` on each reading, until
    it came back up after its OOM (came_back_up) or the first life, the orchestrator's back-off, the second load
    and 15 s of slack have passed; returns each change of its state once."""
    states: list[str] = []
    deadline = time.time() + ((scenario.oom_at or 0) + scenario.restart_delay + scenario.load_seconds) / scale + 15
    while time.time() < deadline:
        snapshot = await runtime.collection.snapshot()
        (target,) = snapshot.targets
        if not states or states[-1] != target.state:
            states.append(target.state)
        look(snapshot, target)
        if came_back_up(states):
            break
        await asyncio.sleep(0.2)
    return states


async def counts_after_stop(runtime: Runtime, log: Path, engine: str, target: str) -> dict[str, tuple[float, int]]:
    """Stops the simulated engine (no more lives, so its log is final), then reads the exporter until it has caught
    up with that log: {"cuda_oom": (events counted, CUDA OOMs the log holds), "restarts": (restarts counted, starts
    in the log - 1)}, the log read by `engine`'s own patterns.

    A relaunch of the quick scenario dies sooner than the first life (some 2 s at 60x), so what a snapshot holds at
    a given moment after a relaunch depends on that moment: compare with the final log instead."""
    assert isinstance(runtime.simulated, SimulatedHost)
    await runtime.simulated.engine.stop()
    kinds, starts = log_events(engine, log.read_text())
    written = {"cuda_oom": kinds.count("cuda_oom"), "restarts": starts - 1}
    counted: dict[str, float] = {}
    for _ in range(40):  # the log is read on the event poller's own beat (0.5 s)
        text = render(await runtime.collection.snapshot()).decode()
        counted = {"cuda_oom": value(text, "oomguard_target_events_total", target=target, kind="cuda_oom"),
                   "restarts": value(text, "oomguard_target_restarts_total", target=target)}  # fmt: skip
        if counted == written:
            break
        await asyncio.sleep(0.25)
    return {name: (counted[name], written[name]) for name in written}
