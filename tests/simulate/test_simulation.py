"""`oomguard serve --simulate`: the product run as a user runs it, through real processes and sockets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
from support import value

from oomguard.ports import free_port
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
        children: set[int] = set()
        deadline = time.time() + (scenario.oom_at + scenario.restart_delay + scenario.load_seconds) / scale + 8
        while time.time() < deadline:
            text = exporter.get()
            current = state(text)
            if not seen or seen[-1] != current:
                seen.append(current)
            if current == "up":
                peak_ratio = max(peak_ratio, value(text, "oomguard_gpu_memory_used_ratio", gpu="0"))
                peak_waiting = max(
                    peak_waiting,
                    value(text, "oomguard_engine_requests_waiting", target="sim-vllm", model_name="sim-llama-3-8b"),
                )
                children.add(int(value(text, "oomguard_engine_process_start_time_seconds", target="sim-vllm")))
            if seen[-3:] == ["down", "loading", "up"]:
                break
            time.sleep(0.2)
        assert seen[:2] == ["loading", "up"], seen
        assert seen[-3:] == ["down", "loading", "up"], seen
        assert peak_ratio > 0.95, peak_ratio
        assert peak_waiting > 10, peak_waiting
        assert len(children) == 2  # a new process start time after the restart
        # The simulated engine's OOM traceback, read from its log, is one event; the restart is one.
        text = exporter.get()
        assert value(text, "oomguard_target_events_total", target="sim-vllm", kind="cuda_oom") == 1.0
        assert value(text, "oomguard_target_restarts_total", target="sim-vllm") == 1.0
        startup = value(text, "oomguard_target_startup_seconds", target="sim-vllm")
        assert abs(startup - scenario.load_seconds / scale) < 1.0, startup
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
    time.sleep(0.2)
    assert not [
        pid for pid in engine_pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ]


def test_tp_skew_serves_two_gpus_and_judges_the_engine_by_its_worst() -> None:
    """`serve --simulate tp-skew` with one GPU configured: two GPUs, both at 90.6 %, then GPU 1 alone climbs;
    the target's figure follows GPU 1, and only GPU 1's headroom fills."""
    scale = 240.0
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
        "unknown scenario 'meltdown'; choose one of: steady, leak, overcommit, probe-kill, loading, "
        "default-steady, tight-steady, tp-skew" in result.stderr
    )
