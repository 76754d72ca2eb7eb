"""Events on their own time (events/log_clock.py): OOMs written while the exporter was stopped are counted one
each, as they would have been live; steps of the exporter's wall clock lose and double nothing."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from oomguard.exporter.config_loader import load_config
from oomguard.exporter.events.log_clock import LogClock, is_clock
from oomguard.exporter.events.runner import EventRunner

DAY = "12-06"


def stamp(t: float) -> str:
    """vLLM's record header time for `t` seconds after midnight: "12-06 00:00:07"."""
    return f"{DAY} {time.strftime('%H:%M:%S', time.gmtime(t))}"


def oom(t: float, pid: int = 7) -> list[str]:
    """vLLM's engine core dying of CUDA OOM at `t`, as it writes it: each line of its record with its header."""
    head = f"(EngineCore pid={pid}) ERROR {stamp(t)} [core.py:701] "
    return [
        f"{head}EngineCore encountered a fatal error.",
        f"{head}Traceback (most recent call last):",
        f'{head}  File "vllm/v1/engine/core.py", line 701, in run_engine_core',
        f"{head}torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    ]


def cri(t: float, lines: list[str]) -> list[str]:
    """The lines as the container runtime writes them, stamped at `t` (2026-12-06, UTC)."""
    at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(1796515200 + t))
    return [f"{at}.{int(t % 1 * 1e9):09d}Z stderr F {line}" for line in lines]


def raw_oom() -> list[str]:
    """PyTorch's OOM as Python writes it to stderr, with no header of the engine's: only the transport stamps it."""
    return ["Traceback (most recent call last):", '  File "serve.py", line 9, in main',
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]  # fmt: skip


class Clocks:
    """The exporter's wall clock and its monotonic clock, apart: a test steps one and not the other."""

    def __init__(self) -> None:
        self.wall = 1_800_000_000.0
        self.mono = 1000.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


def runner(tmp_path: Path, clocks: Clocks, *, quiet: float = 1, rearm: float = 2, pods: bool = False) -> EventRunner:
    target = {"name": "vllm", "url": "http://127.0.0.1:8000"}
    if pods:
        target["k8s_pod_logs"] = {"namespace": "llm", "pod": "vllm-0", "container": "vllm"}  # type: ignore[assignment]
    else:
        target["logs"] = [str(tmp_path / "vllm.log")]  # type: ignore[assignment]
    config = load_config(
        None,
        {
            "state_dir": str(tmp_path / "state"),
            "events": {"kernel_log": False, "quiet_seconds": quiet, "rearm_seconds": rearm,
                       "k8s_pods_dir": str(tmp_path / "pods")},
            "targets": [target],
        },
    )  # fmt: skip
    return EventRunner(config, clock=lambda: clocks.wall, monotonic=lambda: clocks.mono)


def write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write("".join(line + "\n" for line in lines))


def settle(r: EventRunner, clocks: Clocks) -> dict[str, int]:
    """Polls until every incident has closed, on the monotonic clock; the counts."""
    r.poll()
    clocks.advance(100)
    r.poll()
    return r.counts["vllm"].total if "vllm" in r.counts else {}


@pytest.mark.parametrize("pods", [False, True], ids=["a file, the engine's stamps", "CRI, the runtime's stamps"])
def test_ooms_written_while_the_exporter_was_stopped_count_one_each(tmp_path: Path, pods: bool) -> None:
    """Five OOMs 3.5 s apart (quiet spell 1 s, re-arm 2 s), watched or written while the exporter was stopped:
    judged on the poll's clock, the stopped case would read as one burst, 1; on the lines' own times, 5 both ways."""
    log = tmp_path / ("pods/llm_vllm-0_uid/vllm/0.log" if pods else "vllm.log")
    write(log, [])
    clocks = Clocks()

    def incident(t: float) -> list[str]:
        return cri(t, raw_oom()) if pods else oom(t)

    # Watched: each written as it happens.
    r = runner(tmp_path, clocks, pods=pods)
    r.poll()
    for i in range(5):
        write(log, incident(3.5 * i))
        r.poll()
        clocks.advance(3.5)
    assert settle(r, clocks) == {"cuda_oom": 5}
    r.close()
    # Stopped: five more written while it is away, read in one go after its restart.
    for i in range(5):
        write(log, incident(100 + 3.5 * i))
    clocks.advance(60)
    r = runner(tmp_path, clocks, pods=pods)
    assert settle(r, clocks) == {"cuda_oom": 10}


def test_a_sigkill_loop_counts_every_oom_written(tmp_path: Path) -> None:
    """The exporter is killed over and over (no close: only what each poll saved), at random points, some in the
    middle of a traceback, while the engine dies of OOM every 20 s and restarts: written = counted."""
    rng = random.Random(36)
    log = tmp_path / "vllm.log"
    write(log, [])
    clocks = Clocks()
    r = runner(tmp_path, clocks)
    r.poll()
    written = 0
    for i in range(60):
        lines = oom(20.0 * i, pid=100 + i)
        written += 1
        cut = rng.randrange(len(lines) + 1)
        write(log, lines[:cut])
        if rng.random() < 0.5:
            r.poll()
        if rng.random() < 0.5:  # SIGKILL; the engine writes the rest meanwhile; the next exporter starts from the
            clocks.advance(rng.choice([0.5, 1.0, 30.0]))  # last saved state, after a while
            write(log, lines[cut:])
            r = runner(tmp_path, clocks)
        else:
            write(log, lines[cut:])
        for _ in range(rng.randrange(3)):
            r.poll()
            clocks.advance(rng.choice([0.2, 0.5, 3.0]))
    assert settle(r, clocks) == {"cuda_oom": written}


def test_wall_clock_steps_lose_and_double_nothing(tmp_path: Path) -> None:
    """Only the exporter's wall clock steps (time.time()), its monotonic clock goes on."""
    log = tmp_path / "vllm.log"
    write(log, [])
    clocks = Clocks()
    r = runner(tmp_path, clocks)
    r.poll()
    # Back an hour while an OOM is open: it is counted once its quiet spell is over, not an hour later.
    write(log, oom(0))
    r.poll()
    clocks.wall -= 3600
    clocks.advance(1.5)
    r.poll()
    assert r.counts["vllm"].total == {"cuda_oom": 1}
    # Back an hour just after a counted OOM: a separate one 20 s later counts (the re-arm is 2 s).
    clocks.wall -= 3600
    clocks.advance(20)
    write(log, oom(21.5))
    r.poll()
    clocks.advance(1.5)
    r.poll()
    assert r.counts["vllm"].total == {"cuda_oom": 2}
    # Forward an hour in the middle of one traceback: one OOM, not two.
    clocks.advance(20)
    lines = oom(43)
    write(log, lines[:2])
    r.poll()
    clocks.wall += 3600
    clocks.advance(0.3)
    write(log, lines[2:])
    r.poll()
    assert settle(r, clocks) == {"cuda_oom": 3}


def test_an_incident_open_when_the_exporter_restarts_behind_by_an_hour_closes_in_time(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    write(log, [])
    clocks = Clocks()
    r = runner(tmp_path, clocks)
    r.poll()
    write(log, oom(0)[:2])
    r.poll()  # saved with the incident open
    clocks.wall -= 3600  # the exporter comes back with its wall clock an hour behind
    clocks.advance(5)
    write(log, oom(0)[2:])
    r = runner(tmp_path, clocks)
    r.poll()
    clocks.advance(1.5)
    r.poll()
    assert r.counts["vllm"].total == {"cuda_oom": 1}
    # The event's time is where the log was (the wall clock an hour behind does not move it back).
    assert r.counts["vllm"].last["cuda_oom"] == pytest.approx(1_800_000_000.0, abs=10)


def test_the_log_clock_counts_no_interval_twice() -> None:
    """Live, a raw line between two stamped ones is at the time it was read; the next stamped line is as far after
    the previous stamped one as their stamps say, not that far after the raw line as well. A stamp that steps back
    moves nothing; a damaged saved clock is a fresh one."""
    clock = LogClock(wall=5000.0, mono=10.0)
    assert clock.line(10.0, engine=100.0) == 5000.0
    assert clock.line(14.0) == 5004.0  # raw, read 4 s later
    assert clock.line(14.5, engine=104.5) == 5004.5
    assert clock.line(14.5, engine=50.0) == 5004.5  # the engine's clock stepped back an hour
    assert clock.line(15.0, engine=51.0) == 5005.5
    assert clock.now(20.0) == 5010.5
    assert LogClock(1.0, 0.0, {"at": "x"}).at == 1.0 and not is_clock({"engine": [1.0]})
    assert LogClock(1.0, 0.0, clock.state()).at == 5005.5 and is_clock(clock.state())


def test_cluster_mode_wall_clock_steps_lose_and_double_nothing() -> None:
    """The cluster mode's log (through the API, stamped by the node): the exporter's wall clock stepping an hour
    back, then forward, in the middle of tracebacks, while the node's stamps go on."""
    from oomguard.exporter.config import EventsConfig, TargetConfig
    from oomguard.exporter.events.registry import SavedState, pod_api_log

    clocks = Clocks()
    target = TargetConfig(url="http://10.0.0.1:8000", name="llm/vllm-0", engine="vllm")
    events = EventsConfig(quiet_seconds=1, rearm_seconds=2)
    log, reader = pod_api_log(target, events, SavedState(), ("llm", "vllm-0", "vllm"), from_start=True)
    log.monotonic = lambda: clocks.mono  # type: ignore[attr-defined]
    reader.new_stream()
    counted: list[str] = []

    def offer(t: float, lines: list[str]) -> None:
        for line in cri(t, lines):
            at, _stream, _tag, text = line.split(" ", 3)
            reader.offer(f"{at} {text}")

    def poll() -> None:
        counted.extend(e.kind for e in log.poll(clocks.wall) if e.kind != "startup")

    for i, step in enumerate((-3600.0, 3600.0, -3600.0)):
        lines = raw_oom()
        offer(10.0 * i, lines[:2])
        poll()
        clocks.wall += step  # mid-traceback
        clocks.advance(0.2)
        offer(10.0 * i + 0.2, lines[2:])
        poll()
        clocks.advance(10)
        poll()
    assert counted == ["cuda_oom"] * 3
