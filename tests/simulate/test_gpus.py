"""The simulation's GPUs over simulated time, without starting the engine: what NVML shows on each GPU
(used bytes, the engine's pid and its bytes), for one GPU, for vLLM's reservation and for tensor parallelism."""

from __future__ import annotations

import asyncio
import time
from itertools import pairwise

import pytest

from oomguard.exporter.engines import ENGINES
from oomguard.exporter.events.catalogue import load_catalogue
from oomguard.exporter.events.detector import IncidentDetector
from oomguard.exporter.join import GpuClaim, join, join_gpu, up_gpus
from oomguard.exporter.model import ProcessTree
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.sources.nvml import NvmlSource
from oomguard.simulate.checks import load_config
from oomguard.simulate.engines.vllm import oom_traceback
from oomguard.simulate.host import SimulatedHost
from oomguard.simulate.scenarios import GPU_TOTAL_BYTES, SCENARIOS
from oomguard.simulate.supervisor import IDLE_GPU_BYTES, Simulation, simulation

PID = 4242
MINUTE = 60.0


def still(name: str, gpus: int = 1) -> Simulation:
    sim = simulation(name, gpus=gpus)
    sim.nvml.before_call = None  # the GPUs stay as `show` sets them: no engine process to follow
    return sim


def used(sim: Simulation) -> list[float]:
    """Each GPU's used share, as NVML's memory call answers it."""
    lib = sim.nvml
    lib.nvmlInit()
    out = []
    for index in range(lib.nvmlDeviceGetCount()):
        memory = lib.nvmlDeviceGetMemoryInfo(lib.nvmlDeviceGetHandleByIndex(index), version=lib.nvmlMemory_v2)
        out.append(memory.used / memory.total)
    lib.nvmlShutdown()
    return out


def processes(sim: Simulation) -> list[list[tuple[int, int]]]:
    lib = sim.nvml
    lib.nvmlInit()
    out = [
        [(p.pid, p.usedGpuMemory) for p in lib.nvmlDeviceGetComputeRunningProcesses(lib.nvmlDeviceGetHandleByIndex(i))]
        for i in range(lib.nvmlDeviceGetCount())
    ]
    lib.nvmlShutdown()
    return out


def serving_times(name: str, until: float, step: float = 7.3) -> list[float]:
    scenario = SCENARIOS[name]
    t, out = scenario.load_seconds, []
    while t < until:
        out.append(t)
        t += step
    return out


@pytest.mark.parametrize(
    ("name", "gpus", "configured", "fake", "target"),
    [("steady", 1, 1, 1, (0,)), ("steady", 1, 3, 3, (0,)), ("tp-skew", 2, 1, 2, (0, 1)), ("tp-skew", 2, 4, 4, (0, 1))],
)
def test_the_scenario_says_its_gpus_and_the_configuration_how_many_exist(
    name: str, gpus: int, configured: int, fake: int, target: tuple[int, ...]
) -> None:
    sim = still(name, gpus=configured)
    assert SCENARIOS[name].gpus == gpus
    assert len(sim.nvml.gpus) == fake  # max(configuration, scenario)
    assert sim.target().gpus == target


def test_serve_simulate_tp_skew_has_its_two_gpus() -> None:
    """`oomguard serve --simulate tp-skew` (simulation.gpus left at 1): two fake GPUs, the target on both."""
    config = load_config(None, {"simulation": {"scenario": "tp-skew"}, "events": {"kernel_log": False}})
    host = SimulatedHost(config, start_engine=False)
    runtime = Runtime(config, simulated=host)
    assert len(host.engine.nvml.gpus) == 2
    assert [t.gpus for t in runtime.config.targets if t.name == "sim-vllm"] == [(0, 1)]


@pytest.mark.parametrize(("name", "utilization", "low", "high"), [
    ("default-steady", 0.90, 0.905, 0.907),
    ("tight-steady", 0.95, 0.955, 0.957),
])  # fmt: skip
def test_vllm_holds_its_reservation_steadily_for_hours(name: str, utilization: float, low: float, high: float) -> None:
    sim = still(name)
    scenario = sim.scenario
    assert scenario.gpu_memory_utilization == utilization and scenario.death_at(0) is None
    reservation = utilization * GPU_TOTAL_BYTES
    for t in serving_times(name, 4 * 3600):
        sim.show(t, pid=PID)
        assert low < used(sim)[0] < high, t
        [[(pid, engine_bytes)]] = processes(sim)
        # The engine holds its reservation, never more: the rest is the idle GPU's own use.
        assert pid == PID and 0.998 * reservation < engine_bytes <= reservation, t
        assert sim.nvml.gpus[0].used_bytes == IDLE_GPU_BYTES + engine_bytes
    # Its KV cache churns meanwhile (inside the reservation, unseen by NVML).
    kv = [scenario.engine(t).kv_cache_usage for t in serving_times(name, 3600)]
    assert max(kv) - min(kv) > 0.3


def test_no_engine_leaves_every_gpu_idle() -> None:
    sim = still("tp-skew", gpus=3)
    sim.show(900.0, pid=PID)
    assert [bool(p) for p in processes(sim)] == [True, True, False]
    sim.show(None)
    assert processes(sim) == [[], [], []]
    assert [g.used_bytes for g in sim.nvml.gpus] == [IDLE_GPU_BYTES] * 3
    assert used(sim)[2] == pytest.approx(IDLE_GPU_BYTES / GPU_TOTAL_BYTES)


def test_tp_skew_one_gpu_climbs_beyond_the_reservation_to_oom_the_other_stays() -> None:
    sim = still("tp-skew")
    scenario = sim.scenario
    oom = scenario.death_at(0)
    assert oom is not None and scenario.oom_gpu == 1
    skew_starts = scenario.load_seconds + scenario.skew_after
    # Loading: both ranks load the same shard sizes.
    sim.show(10.0, pid=PID)
    assert used(sim)[0] == pytest.approx(used(sim)[1], abs=1e-9) and used(sim)[0] < 0.2
    # Serving, before the skew: both at 90.6 %, the engine's pid on each with its bytes.
    for t in serving_times("tp-skew", skew_starts):
        sim.show(t, pid=PID)
        assert all(0.905 < u < 0.907 for u in used(sim)), t
        assert [[pid for pid, _ in p] for p in processes(sim)] == [[PID], [PID]]
    # Then GPU 1 alone climbs 0.4 % of the GPU per minute; GPU 0 stays.
    history = []
    for t in serving_times("tp-skew", oom - 0.1, step=MINUTE):
        if t > skew_starts:
            sim.show(t, pid=PID)
            history.append((t, *used(sim)))
    assert all(0.905 < gpu0 < 0.907 for _, gpu0, _ in history)
    for (t0, _, a), (t1, _, b) in pairwise(history):
        assert (b - a) / ((t1 - t0) / MINUTE) == pytest.approx(0.004, abs=0.001)  # give or take the workspace
    # Minutes of warning: 95 % (half the headroom) is crossed 11 minutes before the OOM, 97.5 % 4.75 before.
    crosses_95 = next(t for t, _, gpu1 in history if gpu1 > 0.95)
    crosses_975 = next(t for t, _, gpu1 in history if gpu1 > 0.975)
    assert (oom - crosses_95) / MINUTE > 10 and (oom - crosses_975) / MINUTE > 4
    sim.show(oom, pid=PID)
    gpu0, gpu1 = used(sim)
    assert gpu1 > 0.99 and 0.905 < gpu0 < 0.907
    [[(_, own0)], [(_, own1)]] = processes(sim)
    reservation = scenario.gpu_memory_utilization * GPU_TOTAL_BYTES
    assert own0 <= reservation < own1 - 0.08 * GPU_TOTAL_BYTES
    # After its OOM the engine is relaunched: its next life loads and serves both GPUs alike again.
    sim.show(scenario.load_seconds + 60, pid=PID + 1, life=1)
    assert all(0.905 < u < 0.907 for u in used(sim))
    assert [[pid for pid, _ in p] for p in processes(sim)] == [[PID + 1], [PID + 1]]


def test_tp_skew_through_the_exporters_join_the_worst_gpu_and_its_headroom() -> None:
    """Read as the exporter reads NVML, joined as it joins: the target is judged by GPU 1."""
    sim = still("tp-skew")
    scenario = sim.scenario
    tree = ProcessTree(root_pid=PID, pids=frozenset({PID}), resident_bytes=1e9, start_time_seconds=0.0)
    utilization = scenario.gpu_memory_utilization

    def joined(t: float) -> tuple[float, float, list[float]]:
        sim.show(t, pid=PID)
        gpus = up_gpus(NvmlSource(sim.nvml).read().gpus)
        target = join(GpuClaim((0, 1), tree), gpus, utilization)
        assert target.used_bytes is not None and target.over_budget_bytes is not None
        own = target.own_by_gpu or {}
        ratios = []
        for index in (0, 1):
            gpu = join_gpu(gpus[("", str(index))], [(utilization, own)])
            assert gpu is not None
            ratios.append(gpu.headroom_used_ratio)
        return target.used_bytes / GPU_TOTAL_BYTES, target.over_budget_bytes / GPU_TOTAL_BYTES, ratios

    worst, over, (headroom0, headroom1) = joined(scenario.load_seconds + 120)
    assert 0.905 < worst < 0.907 and over <= 0
    # Healthy: only the idle GPU's own use is in the headroom (0.5 GiB of 8 GiB).
    assert headroom0 == pytest.approx(headroom1, abs=0.01) == pytest.approx(0.0625, abs=0.01)
    worst, over, (headroom0, headroom1) = joined((scenario.death_at(0) or 0.0) - 1)
    assert worst > 0.99 and over > 0.08
    assert headroom0 == pytest.approx(0.0625, abs=0.01) and headroom1 > 0.9


def test_the_tp_oom_traceback_names_its_gpu_and_is_one_cuda_oom() -> None:
    scenario = SCENARIOS["tp-skew"]
    text = oom_traceback(scenario, life=0, pid=PID, total_bytes=GPU_TOTAL_BYTES)
    assert "GPU 1 has a total capacity of 80.00 GiB" in text and f"(Worker_TP1 pid={PID})" in text
    detector = IncidentDetector(load_catalogue("vllm"), grammar=ENGINES["vllm"].log_grammar)
    kinds = [e.kind for line in text.splitlines() for e in detector.feed(line, 100.0)]
    kinds += [e.kind for e in detector.tick(200.0)]
    assert kinds == ["cuda_oom"]


def test_long_warmup_holds_its_reservation_from_the_pool_on_while_its_port_is_closed() -> None:
    sim = still("long-warmup")
    scenario = sim.scenario
    assert scenario.kv_allocated_at is not None and scenario.load_seconds - scenario.kv_allocated_at >= 5 * MINUTE
    sim.show(scenario.kv_allocated_at / 2, pid=PID)
    assert used(sim)[0] < 0.2  # the weights
    for t in (scenario.kv_allocated_at, scenario.load_seconds - 1, scenario.load_seconds + 600):
        sim.show(t, pid=PID)
        assert 0.955 < used(sim)[0] < 0.957, t  # the pool at 0.95: NVML reads 95.6 % while it warms up


async def test_a_warming_simulated_engine_is_judged_above_the_reservation_on_its_command_line() -> None:
    """A long warm-up, end to end: the simulated vLLM (a real process, told --gpu-memory-utilization 0.95) has allocated
    its pool and does not listen yet; the exporter finds it by its port flag and judges GPU 0 above 0.95."""
    config = load_config(None, {
        "simulation": {"scenario": "long-warmup", "time_scale": 30.0},
        "events": {"kernel_log": False, "xid": False}, "trend": {"enabled": False},
    })  # fmt: skip
    host = SimulatedHost(config)
    runtime = Runtime(config, simulated=host)
    await runtime.start()
    try:
        assert runtime.collection is not None
        scenario = host.engine.scenario
        # The warm-up lasts (330 - 30) / 30 = 10 s here: long enough to see it, not to wait on the clock.
        deadline = time.monotonic() + (scenario.load_seconds - (scenario.kv_allocated_at or 0)) / 30.0
        while True:
            snapshot = await runtime.collection.snapshot()
            [target] = [t for t in snapshot.targets if t.name == "sim-vllm"]
            gpu = snapshot.gpu_memory.get(("", "0"))
            if gpu is not None and gpu.used_bytes / gpu.total_bytes > 0.95:
                break
            assert time.monotonic() < deadline, f"no reservation while warming: {target.state}, {snapshot.gpu_memory}"
            await asyncio.sleep(0.1)
    finally:
        await runtime.stop()
    assert target.state == "loading" and target.engine_reading is None  # its port closed: nothing reported
    assert target.settings["gpu_memory_utilization"].value == 0.95
    assert target.process is not None and target.process.root_pid in {p.pid for p in snapshot.gpus.gpus[0].processes}
    assert gpu.reserved_bytes == pytest.approx(0.95 * GPU_TOTAL_BYTES)
    assert gpu.headroom_used_ratio < 0.25  # the idle GPU's 0.5 GiB of the 4 GiB headroom, not 95.6 % of the total


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_launch_read_a_tick_early_shows_no_negative_memory(name: str) -> None:
    # The engine's start time is read to a clock tick against a boot time taken once, so "now" can be a few ms
    # before it: the age is then negative. NVML's process memory is unsigned: a negative share reached the
    # exporter wrapped to about 2**64 bytes (the drill's diagnosis read 21474836390 % of the GPU beyond the
    # reservation).
    sim = still(name)
    sim.show(-0.3, pid=PID)
    assert all(0 <= used_bytes <= GPU_TOTAL_BYTES for gpu in processes(sim) for _, used_bytes in gpu)
    assert all(0 <= share <= 1 for share in used(sim))


def test_the_fake_refuses_a_negative_process_memory_as_nvml_never_reports_one() -> None:
    from oomguard.simulate.fake_nvml import FakeProcess

    with pytest.raises(ValueError, match="never reports"):
        FakeProcess(PID, -1)


def test_the_simulated_nvml_says_it_is_simulated(caplog: pytest.LogCaptureFixture) -> None:
    """`NVML started, driver 550.54.15` read as a real driver on a machine with none: the simulation's start line,
    and its GPUs' driver_version, say that the NVML is oomguard's fake."""
    caplog.set_level("INFO", logger="oomguard.exporter.sources.nvml")
    reading = NvmlSource(still("incident").nvml).read()
    assert reading.up and "simulated" in reading.driver_version and "fake NVML" in reading.driver_version
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("NVML started")]
    assert line == "NVML started, driver 550.54.15 (simulated: oomguard's fake NVML, no real driver)"
