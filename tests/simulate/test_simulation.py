"""`oomguard serve --simulate`: the product run as a user runs it, through real processes and sockets."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
from simulated_engines import came_back_up
from support import samples, value

from oomguard.common.ports import free_port
from oomguard.simulate.scenarios import SCENARIOS


class Exporter:
    def __init__(self, scenario: str, time_scale: float) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "oomguard",
                "serve",
                "--simulate",
                scenario,
                "--simulate.time-scale",
                str(time_scale),
                "--web.listen-address",
                f"127.0.0.1:{self.port}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def get(self, path: str = "/metrics") -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
            return response.read().decode()

    def wait_listening(self) -> None:
        for _ in range(100):
            try:
                self.get("/-/healthy")
                return
            except OSError:
                time.sleep(0.1)
        self.proc.kill()
        pytest.fail(f"exporter did not start:\n{self.proc.communicate()[0]}")

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.communicate(timeout=15)[0]


def state(text: str) -> str:
    return next(
        s for s in ("up", "loading", "down") if value(text, "oomguard_target_state", target="sim-vllm", state=s) == 1.0
    )


def engine_lives(exporter: Exporter) -> list[int]:
    """The pids of the simulated engines the exporter's simulation runs now."""
    lives = []
    for child in psutil.Process(exporter.proc.pid).children():
        try:
            if "oomguard.simulate.engines.vllm" in child.cmdline():
                lives.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return lives


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def exited_within(seconds: float, pids: list[int], at_least: int) -> bool:
    """Whether `at_least` of `pids` have exited (or are zombies) within `seconds`: a process ends a little after
    what it did last, so a look at one moment would race it."""
    deadline = time.monotonic() + seconds
    while True:
        if len([pid for pid in pids if not alive(pid)]) >= at_least:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_overcommit_runs_the_incident_loop() -> None:
    """Loading, serving, memory past 90 %, CUDA OOM, down, loading again (a restart), up again."""
    scale = 60.0
    scenario = SCENARIOS["overcommit"]
    exporter = Exporter("overcommit", scale)
    try:
        exporter.wait_listening()
        seen: list[str] = []
        peak_ratio = 0.0
        peak_waiting = 0.0
        start_times: list[int] = []
        # Every engine process the simulation launched: each loads for 4 s here, so none is missed at 0.2 s.
        lives: list[int] = []
        born: dict[int, float] = {}  # each life's process start (psutil), for the startup's bounds
        text = ""
        deadline = time.time() + (scenario.oom_at + scenario.restart_delay + scenario.load_seconds) / scale + 8
        while time.time() < deadline:
            for pid in engine_lives(exporter):
                if pid not in lives:
                    lives.append(pid)
                    with contextlib.suppress(psutil.NoSuchProcess):
                        born[pid] = psutil.Process(pid).create_time()
            text = exporter.get()
            current = state(text)
            if not seen or seen[-1] != current:
                seen.append(current)
            # Its /metrics read (the state is /health's word: at the end of a load the two may differ for a scrape).
            if value(text, "oomguard_target_up", target="sim-vllm") == 1.0:
                peak_ratio = max(peak_ratio, value(text, "oomguard_gpu_memory_used_ratio", gpu="0"))
                peak_waiting = max(
                    peak_waiting,
                    value(text, "oomguard_engine_requests_waiting", target="sim-vllm", model_name="sim-llama-3-8b"),
                )
                start = int(value(text, "oomguard_engine_process_start_time_seconds", target="sim-vllm"))
                if start not in start_times:
                    start_times.append(start)
            if came_back_up(seen) and len(start_times) >= 2:
                break
            time.sleep(0.2)
        assert seen[:2] == ["loading", "up"], seen
        assert came_back_up(seen), seen
        assert peak_ratio > 0.95, peak_ratio
        assert peak_waiting > 10, peak_waiting
        assert len(start_times) >= 2, start_times  # a new process start time after the restart
        # Each relaunch counted once, in the text that showed the engine up again (the engine it showed loads for
        # 4 s and serves for 1.85 s after it: no other life began meanwhile).
        assert value(text, "oomguard_target_restarts_total", target="sim-vllm") == len(lives) - 1 >= 1, lives
        # The simulated engine's OOM traceback, read from its log, is one event: one for each life that has died
        # (the log is read on the event poller's beat; the relaunch may die too in the meantime).
        for _ in range(20):
            ooms = value(text, "oomguard_target_events_total", target="sim-vllm", kind="cuda_oom")
            if ooms >= len(lives) - 1:
                break
            time.sleep(0.25)
            text = exporter.get()
        # A life that wrote its traceback exits right after it: each counted OOM is a life that is gone.
        assert len(lives) - 1 <= ooms, (ooms, lives)
        assert exited_within(5.0, lives, at_least=int(ooms)), (ooms, lives)
        # The last life's startup: not shorter than the scenario's load (4 s here), and not longer than that life had
        # lived when the text was read. (Not "4 s give or take one": a life's clock starts with its process, and on a
        # busy machine its imports alone can outlast the load: 5.65 s was measured once, with four test workers.)
        startup = value(text, "oomguard_target_startup_seconds", target="sim-vllm")
        read_at = time.time()
        last = max(born, key=born.__getitem__)
        assert scenario.load_seconds / scale - 0.3 <= startup <= read_at - born[last] + 0.3, (startup, born, read_at)
    finally:
        log = exporter.stop()
    assert exporter.proc.returncode == 0, log


def test_stopping_the_exporter_stops_the_simulated_engine() -> None:
    exporter = Exporter("steady", 25.0)
    try:
        exporter.wait_listening()
        engine_pids = [c.pid for c in psutil.Process(exporter.proc.pid).children(recursive=True)]
        assert engine_pids, "the simulated engine runs as a child process"
        for _ in range(50):
            if state(exporter.get()) == "up":
                break
            time.sleep(0.1)
        text = exporter.get()
        assert value(text, "oomguard_engine_gpu_memory_utilization_ratio", target="sim-vllm") == 0.9
        assert 0.85 < value(text, "oomguard_gpu_memory_used_ratio", gpu="0") < 0.9
        assert value(text, "oomguard_target_resident_memory_bytes", target="sim-vllm") > 10e6
        assert "sim-vllm" in exporter.get("/")
    finally:
        exporter.stop()
    assert exited_within(5.0, engine_pids, at_least=len(engine_pids)), [pid for pid in engine_pids if alive(pid)]


def test_tp_skew_serves_two_gpus_and_judges_the_engine_by_its_worst() -> None:
    """`serve --simulate tp-skew` with one GPU configured: two GPUs, both at 90.6 %, then GPU 1 alone climbs;
    the target's figure follows GPU 1, and only GPU 1's headroom fills."""
    # 60x: the 5 steady minutes last 5 s. At 240x they lasted 1.25 s from the engine's start, and its imports took
    # longer than that once with four test workers on two cores: the first /metrics already showed the climb.
    scale = 60.0
    scenario = SCENARIOS["tp-skew"]
    exporter = Exporter("tp-skew", scale)
    try:
        exporter.wait_listening()
        deadline = time.time() + (scenario.oom_at or 0.0) / scale + 8
        seen_steady = seen_skew = False
        while time.time() < deadline and not seen_skew:
            text = exporter.get()
            if state(text) == "up":
                gpu0, gpu1 = (value(text, "oomguard_gpu_memory_used_ratio", gpu=g) for g in ("0", "1"))
                assert 0.905 < gpu0 < 0.907, gpu0
                worst = value(text, "oomguard_target_gpu_memory_used_bytes", target="sim-vllm")
                assert worst == value(text, "oomguard_gpu_memory_used_bytes", gpu="0" if gpu0 > gpu1 else "1")
                headroom = [value(text, "oomguard_gpu_memory_headroom_used_ratio", gpu=g) for g in ("0", "1")]
                if gpu1 < 0.907:
                    seen_steady = True
                    assert max(headroom) < 0.1, headroom
                elif gpu1 > 0.95:
                    seen_skew = True
                    assert headroom[0] < 0.1 < 0.5 < headroom[1], headroom
            time.sleep(0.2)
        assert seen_steady and seen_skew
        for gpu in ("0", "1"):
            assert value(text, "oomguard_target_gpu_info", target="sim-vllm", gpu=gpu) == 1.0
    finally:
        log = exporter.stop()
    assert exporter.proc.returncode == 0, log


def test_unknown_scenario_is_refused() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "oomguard", "serve", "--simulate", "meltdown", "--web.listen-address", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ},
    )
    assert result.returncode == 1
    assert (
        "unknown scenario 'meltdown'; choose one of: hot-steady, slow-leak, incident, probe-kill, long-loading, "
        "default-steady, tight-steady, tp-skew" in result.stderr
    )


CLIMBING = ("oomguard_gpu_memory_trend_state", (("gpu", "0"), ("state", "climbing")))


def test_quick_start_shows_the_climb_before_the_first_oom() -> None:
    """`make run` (the incident at 10x) and the drill's clock (30x): the trend's windows run on the simulation's
    clock, so memory reads `climbing`, with a time to full, simulated minutes before the first CUDA OOM (on real
    seconds, a 2-minute window and a 5-minute climb at 30x read the climb as a sawtooth until the OOM)."""
    scales = (10.0, 30.0)
    exporters = {scale: Exporter("incident", scale) for scale in scales}
    started = time.time()
    first_climb: dict[float, tuple[float, float]] = {}  # scale -> (real seconds in, seconds to full then)
    first_oom: dict[float, float] = {}
    try:
        for exporter in exporters.values():
            exporter.wait_listening()
        oom_at = SCENARIOS["incident"].oom_at or 0.0
        deadline = started + oom_at / min(scales) + 60
        while time.time() < deadline and len(first_oom) < len(scales):
            for scale, exporter in exporters.items():
                if scale in first_oom:
                    continue
                found, now = samples(exporter.get()), time.time() - started
                if found.get(("oomguard_target_events_total", (("kind", "cuda_oom"), ("target", "sim-vllm")))):
                    first_oom[scale] = now
                elif scale not in first_climb and found.get(CLIMBING):
                    first_climb[scale] = (now, found[("oomguard_gpu_memory_seconds_to_full", (("gpu", "0"),))])
            time.sleep(0.5)
    finally:
        logs = {scale: exporter.stop() for scale, exporter in exporters.items()}
    assert set(first_oom) == set(scales), (first_oom, logs)
    for scale in scales:
        assert scale in first_climb, f"{scale:g}x: never climbing before the first OOM\n{logs[scale][-2000:]}"
        climb_at, to_full = first_climb[scale]
        lead_minutes = (first_oom[scale] - climb_at) * scale / 60
        print(f"{scale:g}x: climbing {lead_minutes:.1f} simulated minutes before the first OOM, "
              f"then {to_full * scale / 60:.1f} simulated minutes to full")  # fmt: skip
        assert lead_minutes >= 2.0, (scale, first_climb, first_oom)
        assert to_full > 0
    assert "oomguard drill --scenario incident" in logs[10.0], logs[10.0][-2000:]
