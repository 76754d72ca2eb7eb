"""Discovery of local engines against real processes: a Runtime with no targets finds a stand-in vLLM by its
command line, scrapes it, exports its settings, follows its restart and forgets it once it is gone."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from support import samples

from oomguard.common.ports import free_port
from oomguard.exporter.config_loader import load_config
from oomguard.exporter.exposition import render
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.sources.local.cmdline import engine_port, find_engines, listening_ports
from oomguard.exporter.sources.local.settings import read_settings
from oomguard.simulate.fake_nvml import FakeGpu, FakeNvml, FakeProcess
from tests.sources.local.local_engines import StubVllm, vllm_stub, wait_listening

QUIET = {"events": {"kernel_log": False, "xid": False}, "trend": {"enabled": False}}
FLAGS = ("--max-num-seqs", "64", "--max-model-len=2048")


@pytest.fixture
def stub(tmp_path: Path) -> Any:
    engines: list[StubVllm] = []

    def make(*flags: str, python: str = sys.executable) -> StubVllm:
        engine = StubVllm(vllm_stub(tmp_path / f"stub{len(engines)}"), free_port(), *flags, python=python)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()


@pytest.fixture
async def runtime() -> AsyncIterator[Callable[[dict[str, Any]], Any]]:
    started: list[Runtime] = []

    async def start(overrides: dict[str, Any]) -> Runtime:
        rt = Runtime(load_config(None, {**QUIET, **overrides}), nvml_lib=FakeNvml([FakeGpu(0)]))
        await rt.start()
        started.append(rt)
        return rt

    yield start
    for rt in started:
        await rt.stop()


async def metrics(rt: Runtime) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    assert rt.collection is not None
    return samples(render(await rt.collection.snapshot()).decode())


def of(got: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float | None:
    """The sample of `name` whose labels include `labels`, None when there is none."""
    for (sample, have), value in got.items():
        if sample == name and set(labels.items()) <= set(have):
            return value
    return None


async def until(rt: Runtime, check: Callable[[dict[Any, float]], bool], timeout: float = 20.0) -> dict[Any, float]:
    deadline = time.monotonic() + timeout
    while True:
        got = await metrics(rt)
        if check(got):
            return got
        assert time.monotonic() < deadline, "timed out; last exposition had: " + repr(
            sorted({k for k in got if "oomguard_target" in k[0] or "setting" in k[0]})
        )
        await asyncio.sleep(0.1)


def state(got: dict[Any, float], target: str) -> str | None:
    for name in ("up", "loading", "down"):
        if of(got, "oomguard_target_state", target=target, state=name) == 1.0:
            return name
    return None


async def test_no_targets_finds_the_engine_scrapes_it_follows_a_restart_and_forgets_it(stub, runtime) -> None:
    engine = stub(*FLAGS)
    engine.start(load_seconds=0.5)  # not listening at first, as vLLM while it loads
    rt = await runtime({"discovery": {"interval_seconds": 0.2, "forget_after_seconds": 2}})
    assert rt.config.discovers_local
    target = f"127.0.0.1:{engine.port}"

    got = await until(rt, lambda g: state(g, target) == "up")
    assert of(got, "oomguard_target_info", target=target, engine="vllm") == 1.0
    assert of(got, "oomguard_engine_requests_running", target=target) is not None  # the real body was read
    setting = "oomguard_engine_setting"
    assert of(got, setting, target=target, engine="vllm", setting="max_num_seqs", origin="flag") == 64
    assert of(got, setting, target=target, setting="max_model_len", origin="flag") == 2048
    assert of(got, setting, target=target, setting="gpu_memory_utilization", origin="default") == 0.9
    assert of(got, "oomguard_source_success", source="local_discovery") == 1.0
    assert of(got, "oomguard_target_restarts_total", target=target) == 0

    # Killed and relaunched with the same command line: loading while it does not listen, the same target.
    engine.stop()
    engine.start(load_seconds=1.5)
    got = await until(rt, lambda g: state(g, target) in ("loading", "down"))
    await asyncio.sleep(0.6)  # several discovery polls while it does not listen
    got = await until(
        rt, lambda g: state(g, target) == "up" and bool(of(g, "oomguard_target_restarts_total", target=target))
    )
    assert of(got, "oomguard_target_restarts_total", target=target) == 1
    assert of(got, setting, target=target, setting="max_num_seqs", origin="flag") == 64

    # Gone for good: dropped once forget_after_seconds have passed without a process of its command line.
    engine.stop()
    gone_at = time.monotonic()
    await asyncio.sleep(1.0)
    got = await metrics(rt)
    assert state(got, target) == "down"  # still there: a death is seen before the target goes
    got = await until(rt, lambda g: of(g, "oomguard_target_info", target=target) is None)
    # Forgotten 2 s after the last poll that saw its process: that poll came at most an interval (0.2 s) before
    # the kill, give or take the scheduling of a busy host.
    assert time.monotonic() - gone_at >= 1.5
    assert of(got, setting, target=target) is None


async def test_a_configured_target_on_the_same_port_wins_and_gets_the_settings(stub, runtime) -> None:
    engine = stub(*FLAGS)
    engine.start()
    wait_listening(engine.port)
    url = f"http://127.0.0.1:{engine.port}"
    rt = await runtime(
        {"targets": [{"url": url, "name": "mine"}], "discovery": {"local": "on", "interval_seconds": 0.2}}
    )
    got = await until(
        rt, lambda g: state(g, "mine") == "up" and of(g, "oomguard_engine_setting", target="mine") is not None
    )
    await asyncio.sleep(0.5)  # discovery polls meanwhile
    got = await metrics(rt)
    assert of(got, "oomguard_target_info", target=f"127.0.0.1:{engine.port}") is None
    assert of(got, "oomguard_engine_setting", target="mine", setting="max_num_seqs", origin="flag") == 64
    # Discovery ran (other engines on this host may be found) and left this port to the configured target.
    assert rt.local_discovery is not None and engine.port not in rt.local_discovery.known
    assert of(got, "oomguard_source_success", source="local_discovery") == 1.0


async def test_configured_targets_turn_auto_discovery_off(runtime) -> None:
    rt = await runtime({"targets": [{"url": "http://127.0.0.1:1"}]})
    assert rt.local_discovery is None
    got = await metrics(rt)
    assert of(got, "oomguard_source_success", source="local_discovery") is None


def test_the_installed_version_selects_the_defaults(stub, tmp_path: Path) -> None:
    """A V0 vLLM (0.7.3) installed in the engine's environment: its max_num_seqs default, 256, is known."""
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    python = env / "bin" / "python3"
    python.symlink_to(sys.executable)
    site = env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "vllm-0.7.3.dist-info").mkdir(parents=True)
    engine = stub(python=str(python))
    engine.start()
    wait_listening(engine.port)
    assert engine.proc is not None
    found = {e.pid: e for e in find_engines()}[engine.proc.pid]
    assert found.engine == "vllm" and found.cmdline[0] == str(python)
    settings = read_settings("vllm", engine.proc.pid, found.cmdline)
    assert settings["max_num_seqs"].value == 256 and settings["max_num_seqs"].origin == "default"


LAUNCHER = """#!{python}
import os, socket, subprocess, sys, time
if os.path.basename(sys.argv[0]) == "text-generation-launcher":
    port = sys.argv[sys.argv.index("--port") + 1]
    router = os.path.join(os.path.dirname(sys.argv[0]), "text-generation-router")
    child = subprocess.Popen([router, "--port", port, "--max-concurrent-requests", "64"])
    child.wait()
else:
    s = socket.socket()
    s.bind(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])))
    s.listen()
    time.sleep(600)
"""


def test_tgi_is_found_by_its_launcher_with_its_router_port_and_environment(tmp_path: Path) -> None:
    """A launcher and the router it starts are one engine; the port is the router's; CUDA_MEMORY_FRACTION is read
    from the launcher's environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("text-generation-launcher", "text-generation-router"):
        script = bin_dir / name
        script.write_text(LAUNCHER.format(python=sys.executable))
        script.chmod(0o755)
    port = free_port()
    env = {**os.environ, "CUDA_MEMORY_FRACTION": "0.6"}
    import subprocess

    launcher = subprocess.Popen(
        [str(bin_dir / "text-generation-launcher"), "--model-id", "m", "--port", str(port)], env=env
    )
    try:
        wait_listening(port)
        found = [e for e in find_engines() if e.pid == launcher.pid or launcher.pid in e.pids]
        assert [e.pid for e in found] == [launcher.pid]  # the router under it is not an engine of its own
        assert found[0].engine == "tgi"
        assert engine_port(found[0], listening_ports()) == (port, "127.0.0.1")
        settings = read_settings("tgi", launcher.pid, found[0].cmdline)
        assert settings["cuda_memory_fraction"].value == 0.6 and settings["cuda_memory_fraction"].origin == "flag"
        assert settings["max_concurrent_requests"].origin == "default"
    finally:
        for pid in found[0].pids if found else ():
            if pid != launcher.pid:
                os.kill(pid, 9)
        launcher.kill()
        launcher.wait()


def test_a_listener_that_is_not_the_engine_gives_no_settings() -> None:
    """A configured vLLM target whose port is held by another program (a proxy, this test) claims no defaults."""
    assert read_settings("vllm", os.getpid(), (sys.executable, "-m", "pytest", "--max-num-seqs", "8")) == {}


async def test_a_loading_engine_is_judged_above_the_reservation_its_command_line_tells(stub, runtime) -> None:
    """A long warm-up: vLLM allocates its KV cache, then warms up for minutes without listening. Its process is found
    by the port its command line names, its reservation read there: the GPU (95.6 % used, the engine's 0.95 and
    another process's 0.5 GiB) is judged above the reservation, not on its total."""
    engine = stub("--gpu-memory-utilization", "0.95")
    engine.start(load_seconds=120.0)  # never listens within this test
    assert engine.proc is not None
    total = 80 * 2**30
    held = [FakeProcess(engine.proc.pid, int(0.95 * total)), FakeProcess(4_194_311, 2**29)]  # the engine, another
    gpu = FakeGpu(0, total_bytes=total, used_bytes=sum(p.used_bytes or 0 for p in held), processes=held)
    rt = Runtime(
        load_config(None, {**QUIET, "targets": [{"url": f"http://127.0.0.1:{engine.port}", "name": "warming"}]}),
        nvml_lib=FakeNvml([gpu]),
    )
    await rt.start()
    try:
        got = await until(rt, lambda g: of(g, "oomguard_gpu_memory_headroom_used_ratio", gpu="0") is not None)
    finally:
        await rt.stop()
    assert state(got, "warming") == "loading"
    assert of(got, "oomguard_engine_setting", target="warming", setting="gpu_memory_utilization", origin="flag") == 0.95
    assert of(got, "oomguard_gpu_memory_engine_reserved_bytes", gpu="0") == pytest.approx(0.95 * total)
    # The other process's 0.5 GiB of the 4 GiB headroom: 12.5 %, where used/total reads 95.6 %.
    assert of(got, "oomguard_gpu_memory_headroom_used_ratio", gpu="0") == pytest.approx(0.125)
    assert of(got, "oomguard_engine_gpu_memory_utilization_ratio", target="warming") is None  # not reported yet


async def test_a_loading_engine_on_another_port_is_not_the_targets(stub, runtime) -> None:
    engine = stub("--gpu-memory-utilization", "0.95")
    engine.start(load_seconds=120.0)
    rt = await runtime({"targets": [{"url": f"http://127.0.0.1:{free_port()}", "name": "other"}]})
    for _ in range(3):  # each collection looks for the loading engine of its port
        got = await metrics(rt)
        assert state(got, "other") == "loading"
        assert of(got, "oomguard_engine_setting", target="other") is None


async def test_a_discovered_engine_is_a_target_from_its_first_load_on_judged_above_its_told_reservation(
    stub,
) -> None:
    """A long warm-up with nothing configured: a vLLM in its first load (never listened) is a target at the port its
    command line tells, loading, its GPU judged above its 0.95 (its way to up: the first test above)."""
    engine = stub("--gpu-memory-utilization", "0.95")
    engine.start(load_seconds=120.0)  # never listens within this test
    assert engine.proc is not None
    total = 80 * 2**30
    held = [FakeProcess(engine.proc.pid, int(0.95 * total)), FakeProcess(4_194_311, 2**29)]
    gpu = FakeGpu(0, total_bytes=total, used_bytes=sum(p.used_bytes or 0 for p in held), processes=held)
    rt = Runtime(load_config(None, {**QUIET, "discovery": {"interval_seconds": 0.1}}), nvml_lib=FakeNvml([gpu]))
    await rt.start()
    target = f"127.0.0.1:{engine.port}"
    try:
        got = await until(rt, lambda g: of(g, "oomguard_gpu_memory_headroom_used_ratio", gpu="0") is not None)
    finally:
        await rt.stop()
    assert state(got, target) == "loading"
    assert of(got, "oomguard_engine_setting", target=target, engine="vllm", setting="gpu_memory_utilization",
              origin="flag") == 0.95  # fmt: skip
    assert of(got, "oomguard_gpu_memory_headroom_used_ratio", gpu="0") == pytest.approx(0.125)


async def test_an_engine_with_a_config_file_waits_until_it_listens(stub, runtime) -> None:
    engine = stub("--config", "serve.yaml")
    engine.start(load_seconds=120.0)
    rt = await runtime({"discovery": {"interval_seconds": 60}})
    assert rt.local_discovery is not None
    await rt.local_discovery.poll()  # its process is there from its launch: one poll sees it
    assert engine.port not in rt.local_discovery.known
