"""The serve loop the simulators share (simulate/serve.py), run as the runner runs it: one life of each simulated
engine, from its start to its CUDA OOM, as a child process on a real port."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from oomguard.ports import free_port
from oomguard.simulate.scenarios import SCENARIOS

SCALE = 100.0  # overcommit-quick's first life, 12.3 simulated minutes, in 7.4 s (the imports count: a second or two)
SCENARIO = SCENARIOS["overcommit-quick"]


def health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_one_life_serves_then_dies_of_its_oom(engine: str) -> None:
    port = free_port()
    child = subprocess.Popen(
        [sys.executable, "-m", f"oomguard.engines.{engine}.simulator", "--scenario", SCENARIO.name,
         "--port", str(port), "--time-scale", str(SCALE)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen: list[int | None] = []
    try:
        while child.poll() is None:
            status = health(port)
            if not seen or seen[-1] != status:
                seen.append(status)
            time.sleep(0.02)
        _, log = child.communicate(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 1, log
    assert 200 in seen, seen  # it served between its load and its death
    # It writes its death last: the CUDA OOM traceback of its engine.
    assert "torch.OutOfMemoryError: CUDA out of memory" in log.splitlines()[-1 if engine == "vllm" else -2], log
    if engine == "sglang":
        # While its KV pool is full, the scheduler retracts requests: one line each time, with how many.
        retracted = [line for line in log.splitlines() if "KV cache pool is full. Retract requests." in line]
        total = SCENARIO.engine(SCENARIO.death_at(0) or 0.0).preemptions
        counts = [int(line.split("#retracted_reqs: ")[1].split(",")[0]) for line in retracted]
        assert len(counts) > 1 and sum(counts) <= total, (counts, total)
    else:
        assert None in seen[: seen.index(200)], seen  # vLLM refuses connections while it loads
