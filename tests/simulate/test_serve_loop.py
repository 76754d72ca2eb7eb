"""The serve loop the simulators share (simulate/serve.py), run as the supervisor runs it: one life of each simulated
engine, from its start to its CUDA OOM, as a child process on a real port."""

from __future__ import annotations

import pytest
from simulated_engines import http_get, run_life

from oomguard.simulate.scenarios import SCENARIOS

SCALE = 100.0  # overcommit-quick's first life, 12.3 simulated minutes, in 7.4 s (the imports count: a second or two)
SCENARIO = SCENARIOS["overcommit-quick"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_one_life_serves_then_dies_of_its_oom(engine: str) -> None:
    seen: list[int | None] = []

    def watch(port: int, _: object) -> None:
        status = http_get(port, "/health")[0]
        if not seen or seen[-1] != status:
            seen.append(status)

    code, log = run_life(engine, SCENARIO.name, SCALE, watch)
    assert code == 1, log
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
