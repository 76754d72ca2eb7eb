"""The joins, on the setups that matter: reserving engines at 0.90 and 0.95, the incident, tensor
parallelism with one GPU climbing, remote engines, sleep mode, reservations that cannot hold."""

from __future__ import annotations

from dataclasses import replace

import pytest

from oomguard.exporter.join import join_gpus, join_targets
from oomguard.exporter.model import (
    EngineReading,
    EngineSetting,
    GpuProcess,
    GpuReading,
    GpuReadings,
    ProcessTree,
    TargetReading,
)

GIB = 2.0**30
TOTAL = 80 * GIB
IDLE = 0.5 * GIB  # what an idle GPU shows: contexts of monitoring tools, another pid
ENGINE, WORKER_0, WORKER_1, OTHER = 1000, 1001, 1002, 4242


def gpu(index: int, *procs: tuple[int, float]) -> GpuReading:
    used = sum(b for _, b in procs)
    return GpuReading(
        index, True, total_bytes=TOTAL, used_bytes=used, processes=tuple(GpuProcess(p, "", b) for p, b in procs)
    )


def vllm(
    gpus: tuple[int, ...] = (0,), utilization: float = 0.90, local: bool = True, sleep: str | None = None
) -> TargetReading:
    process = ProcessTree(ENGINE, frozenset({ENGINE, WORKER_0, WORKER_1}), 2 * GIB, 0.0) if local else None
    reading = EngineReading((), memory_utilization_ratio=utilization, sleep_state=sleep)
    return TargetReading("vllm", "vllm", "http://127.0.0.1:8000", gpus, True, "up", 0.01, 200, 0.001, reading,
                         process=process)  # fmt: skip


def joined(nvml_gpus: list[GpuReading], *targets: TargetReading):
    nvml = GpuReadings(True, gpus=tuple(nvml_gpus))
    memory = join_targets(nvml, targets)
    return memory, {int(index): g for (_node, index), g in join_gpus(nvml, targets, memory).items()}  # one node: ""


def test_a_healthy_vllm_at_090_uses_six_percent_of_its_headroom() -> None:
    # NVML at 90.6 %: the engine holds its reservation, the idle GPU's 0.5 GiB is someone else's.
    _, gpus = joined([gpu(0, (WORKER_0, 0.90 * TOTAL), (OTHER, IDLE))], vllm())
    g = gpus[0]
    assert g.used_bytes / g.total_bytes == pytest.approx(0.906, abs=1e-3)
    assert g.reserved_bytes == pytest.approx(72 * GIB)
    assert (g.engine_used_bytes, g.over_reservation_bytes, g.other_used_bytes) == (72 * GIB, 0.0, IDLE)
    assert g.unreserved_used_bytes == IDLE
    assert g.headroom_used_ratio == pytest.approx(IDLE / (8 * GIB))  # 0.0625


def test_a_healthy_vllm_at_095_too() -> None:
    _, gpus = joined([gpu(0, (WORKER_0, 0.947 * TOTAL), (OTHER, IDLE))], vllm(utilization=0.95))
    g = gpus[0]
    assert g.used_bytes / g.total_bytes == pytest.approx(0.953, abs=1e-3)
    assert g.over_reservation_bytes == 0.0  # a little under its reservation is not beyond it
    assert g.headroom_used_ratio == pytest.approx(IDLE / (4 * GIB))  # 0.125


def test_the_incident_memory_beyond_the_reservation_eats_the_headroom() -> None:
    # 98 % of the GPU: 7.9 GiB of the engine's use beyond its 72 GiB, plus the idle 0.5 GiB.
    own = 0.98 * TOTAL - IDLE
    memory, gpus = joined([gpu(0, (WORKER_0, own), (OTHER, IDLE))], vllm())
    assert gpus[0].over_reservation_bytes == pytest.approx(own - 72 * GIB)
    assert gpus[0].headroom_used_ratio == pytest.approx(0.8)
    assert memory["vllm"].over_budget_bytes == pytest.approx(own - 72 * GIB)


def test_a_remote_engine_whose_pids_are_unknown_is_judged_above_its_reservation() -> None:
    _, gpus = joined([gpu(0, (77, 0.90 * TOTAL), (OTHER, IDLE))], vllm(local=False))
    g = gpus[0]
    assert (g.engine_used_bytes, g.over_reservation_bytes, g.other_used_bytes) == (None, None, None)
    assert g.unreserved_used_bytes == pytest.approx(IDLE)
    assert g.headroom_used_ratio == pytest.approx(0.0625)


def test_tensor_parallel_is_judged_by_its_worst_gpu() -> None:
    skewed = 0.99 * TOTAL - IDLE
    memory, gpus = joined(
        [gpu(0, (WORKER_0, 0.90 * TOTAL), (OTHER, IDLE)), gpu(1, (WORKER_1, skewed), (OTHER, IDLE))],
        vllm(gpus=(0, 1)),
    )
    target = memory["vllm"]
    assert target.used_bytes / target.total_bytes == pytest.approx(0.99)  # not the average, 94.8 %
    assert target.budget_bytes == pytest.approx(72 * GIB)  # the budget holds per GPU
    assert target.over_budget_bytes == pytest.approx(skewed - 72 * GIB)
    assert target.own_bytes == pytest.approx(0.90 * TOTAL + skewed)  # inventory: both GPUs
    assert gpus[0].headroom_used_ratio == pytest.approx(0.0625)
    assert gpus[1].headroom_used_ratio == pytest.approx(0.9)


def test_a_sleeping_engine_reserves_nothing() -> None:
    _, gpus = joined([gpu(0, (WORKER_0, 1 * GIB), (OTHER, IDLE))], vllm(sleep="weights_offloaded"))
    assert gpus == {}  # no known reservation: the plain thresholds apply to this GPU


def test_a_gpu_without_an_engine_has_no_reservation() -> None:
    _, gpus = joined([gpu(0, (WORKER_0, 0.90 * TOTAL)), gpu(1, (OTHER, 0.5 * TOTAL))], vllm(gpus=(0,)))
    assert set(gpus) == {0}


def test_an_engine_whose_utilization_is_unknown_reserves_nothing() -> None:
    _, gpus = joined([gpu(0, (WORKER_0, 0.90 * TOTAL))], vllm(utilization=None))  # type: ignore[arg-type]
    assert gpus == {}


def test_other_use_while_the_engine_fills_its_reservation_is_beyond_the_headroom() -> None:
    # Loading: the engine holds 40 GiB of its 72, another process 20 GiB: once the engine has its
    # reservation the GPU needs 92 GiB. Above 1: the reservation cannot be honoured.
    _, gpus = joined([gpu(0, (WORKER_0, 40 * GIB), (OTHER, 20 * GIB))], vllm())
    assert gpus[0].headroom_used_ratio == pytest.approx(20 / 8)


def test_reservations_that_take_the_whole_gpu() -> None:
    a = vllm(utilization=0.6)
    b_process = ProcessTree(2000, frozenset({2000}), GIB, 0.0)
    b = TargetReading("other", "vllm", "http://127.0.0.1:8001", (0,), True, "up", 0.01,
                      engine_reading=EngineReading((), memory_utilization_ratio=0.5), process=b_process)  # fmt: skip
    # b still loading (35 % of its 50 %): the two reservations already exceed the GPU.
    _, gpus = joined([gpu(0, (WORKER_0, 0.6 * TOTAL), (2000, 0.35 * TOTAL), (OTHER, IDLE))], a, b)
    assert gpus[0].reserved_bytes == pytest.approx(1.1 * TOTAL)
    assert gpus[0].headroom_used_ratio == 1.0  # no headroom at all, and something else is in use


# -- the reservation an engine was told, while it does not report one (its warm-up) -------------------------------
def warming(
    settings: dict[str, EngineSetting], *, state: str = "loading", reading: EngineReading | None = None
) -> TargetReading:
    """A local vLLM whose /metrics refuses (loading: its KV cache allocated, its CUDA graphs being captured)."""
    process = ProcessTree(ENGINE, frozenset({ENGINE, WORKER_0}), 2 * GIB, 0.0)
    return TargetReading("vllm", "vllm", "http://127.0.0.1:8000", (), reading is not None, state, 0.01, None, None,
                         reading, error_kind="refused", process=process, settings=settings)  # fmt: skip


def test_a_warming_engine_is_judged_above_the_reservation_it_was_told() -> None:
    # 0.95 told on its command line, the pool allocated: NVML reads 95.6 %, of which 0.5 GiB is not the engine's.
    memory, gpus = joined(
        [gpu(0, (WORKER_0, 0.95 * TOTAL), (OTHER, IDLE))],
        warming({"gpu_memory_utilization": EngineSetting(0.95, "flag")}),
    )
    g = gpus[0]
    assert g.used_bytes / g.total_bytes == pytest.approx(0.956, abs=1e-3)
    assert g.reserved_bytes == pytest.approx(0.95 * TOTAL)
    assert g.headroom_used_ratio == pytest.approx(IDLE / (0.05 * TOTAL))  # 12.5 %: far from any threshold
    assert memory["vllm"].budget_bytes == pytest.approx(0.95 * TOTAL)
    assert memory["vllm"].over_budget_bytes == pytest.approx(0.0)


def test_sglangs_mem_fraction_static_is_a_reservation_too() -> None:
    target = replace(warming({"mem_fraction_static": EngineSetting(0.88, "flag")}), engine="sglang")
    _, gpus = joined([gpu(0, (WORKER_0, 0.88 * TOTAL))], target)
    assert gpus[0].reserved_bytes == pytest.approx(0.88 * TOTAL)


def test_the_value_the_engine_reports_wins_over_the_one_it_was_told() -> None:
    reading = EngineReading((), memory_utilization_ratio=0.80)
    target = warming({"gpu_memory_utilization": EngineSetting(0.95, "flag")}, state="up", reading=reading)
    _, gpus = joined([gpu(0, (WORKER_0, 0.80 * TOTAL))], target)
    assert gpus[0].reserved_bytes == pytest.approx(0.80 * TOTAL)


def test_an_engine_up_without_its_own_value_keeps_the_one_it_was_told() -> None:
    # SGLang before its /server_info answered: its /metrics has no reservation yet.
    target = warming({"mem_fraction_static": EngineSetting(0.9, "flag")}, state="up", reading=EngineReading(()))
    _, gpus = joined([gpu(0, (WORKER_0, 0.90 * TOTAL))], target)
    assert gpus[0].reserved_bytes == pytest.approx(0.90 * TOTAL)


@pytest.mark.parametrize(
    ("state", "reading"),
    [("down", None), ("up", EngineReading((), sleep_state="discard_all"))],
    ids=["down: its memory went with it", "asleep: its memory released"],
)
def test_no_told_reservation_for_an_engine_that_holds_nothing(state: str, reading: EngineReading | None) -> None:
    target = warming({"gpu_memory_utilization": EngineSetting(0.95, "flag")}, state=state, reading=reading)
    _, gpus = joined([gpu(0, (WORKER_0, 1 * GIB), (OTHER, 0.9 * TOTAL))], target)
    assert gpus == {}  # judged on used/total: 91 %, which is someone else's


@pytest.mark.parametrize("value", [0.0, 1.5])
def test_a_told_value_that_is_no_share_is_no_reservation(value: float) -> None:
    _, gpus = joined(
        [gpu(0, (WORKER_0, 0.95 * TOTAL))], warming({"gpu_memory_utilization": EngineSetting(value, "flag")})
    )
    assert gpus == {}


def test_two_nodes_gpu_0_are_two_gpus_each_joined_to_its_own_pods() -> None:
    """The cluster mode: dcgm-exporter's GPUs of two nodes, no process lists, each GPU naming the pod using it."""
    from oomguard.exporter.model import PodRef

    def dcgm_gpu(node: str, pod: str, used: float) -> GpuReading:
        return GpuReading(0, True, total_bytes=TOTAL, used_bytes=used, node=node, pods=(("llm", pod),))

    def pod_target(name: str, node: str) -> TargetReading:
        t = vllm(gpus=(), local=False)
        return replace(t, name=f"llm/{name}", pod=PodRef("llm", name, "vllm", node=node))

    a, b = pod_target("vllm-a", "gpu-a"), pod_target("vllm-b", "gpu-b")
    # A configured target of the exporter's own node ("" outside Kubernetes) claims no other node's GPU 0.
    local = replace(vllm(gpus=(0,), local=False), name="configured")
    nvml = GpuReadings(True, gpus=(dcgm_gpu("gpu-a", "vllm-a", 0.95 * TOTAL), dcgm_gpu("gpu-b", "vllm-b", 0.5 * TOTAL)))
    memory = join_targets(nvml, [a, b, local])
    assert memory["llm/vllm-a"].gpus == (("gpu-a", "0"),) and memory["llm/vllm-a"].used_bytes == 0.95 * TOTAL
    assert memory["llm/vllm-b"].gpus == (("gpu-b", "0"),) and memory["llm/vllm-b"].used_bytes == 0.5 * TOTAL
    assert memory["configured"].gpus == ()
    # The pod of one node is not the pod of another: a pod name dcgm-exporter names on another node is not it.
    moved = replace(a, pod=PodRef("llm", "vllm-a", "vllm", node="gpu-b"))
    assert join_targets(nvml, [moved])["llm/vllm-a"].gpus == ()
    gpus = join_gpus(nvml, [a, b], memory)
    assert sorted(gpus) == [("gpu-a", "0"), ("gpu-b", "0")]
    # No process lists: whose bytes are whose is unknown, everything above the reservation may grow.
    assert gpus[("gpu-a", "0")].engine_used_bytes is None
    assert gpus[("gpu-a", "0")].unreserved_used_bytes == pytest.approx(0.05 * TOTAL)
    assert gpus[("gpu-b", "0")].unreserved_used_bytes == 0.0
