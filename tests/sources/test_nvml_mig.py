"""MIG through NVML: the fake refuses on a parent in MIG mode what NVML's documentation says NVML refuses, and the
NVML source reads a GPU in MIG mode as its GPU instances, each a GPU of its own that its engine is judged on."""

from __future__ import annotations

import pynvml
import pytest
from support import promtool_check_metrics

from oomguard.exporter.exposition import render
from oomguard.exporter.join import join_gpus, join_targets
from oomguard.exporter.model import EngineReading, ProcessTree, Snapshot, SourceResult, TargetReading
from oomguard.exporter.sources.nvml import NvmlSource
from oomguard.simulate.fake_nvml import GIB, FakeGpu, FakeMigDevice, FakeNvml, FakeProcess

ENGINE = 4242  # a vLLM on the second 3g.40gb slice of GPU 0


def mig_node(*, privileged: bool = False) -> FakeNvml:
    """An H100 in MIG mode with two 3g.40gb instances (GI 1 in slot 0, GI 2 in slot 3: the slots are sparse) and an
    H100 without MIG. The engine holds 0.9 of its slice (gpu_memory_utilization 0.9)."""
    slices = [
        FakeMigDevice(gpu_instance=1, slot=0, used_bytes=2 * GIB, processes=[FakeProcess(7, 2 * GIB)]),
        FakeMigDevice(gpu_instance=2, slot=3, used_bytes=int(37.5 * GIB),
                      processes=[FakeProcess(ENGINE, int(37.5 * GIB))]),
    ]  # fmt: skip
    return FakeNvml([
        FakeGpu(0, used_bytes=0, mig_devices=slices, privileged=privileged),
        FakeGpu(1, used_bytes=10 * GIB, processes=[FakeProcess(8, 10 * GIB)]),
    ])  # fmt: skip


def test_the_fake_refuses_on_a_parent_in_mig_mode_what_nvml_refuses() -> None:
    lib = mig_node()
    lib.nvmlInit()
    parent, plain = lib.nvmlDeviceGetHandleByIndex(0), lib.nvmlDeviceGetHandleByIndex(1)
    assert lib.nvmlDeviceGetMigMode(parent) == [pynvml.NVML_DEVICE_MIG_ENABLE] * 2
    assert lib.nvmlDeviceGetMigMode(plain) == [pynvml.NVML_DEVICE_MIG_DISABLE] * 2
    assert lib.nvmlDeviceGetMaxMigDeviceCount(plain) == 0  # "zero if MIG is not supported or enabled"
    # The parent's memory and processes: an aggregate for a privileged caller only; its utilization: not supported.
    with pytest.raises(pynvml.NVMLError_NoPermission):
        lib.nvmlDeviceGetMemoryInfo(parent, version=pynvml.nvmlMemory_v2)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        lib.nvmlDeviceGetComputeRunningProcesses(parent)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        lib.nvmlDeviceGetUtilizationRates(parent)
    # MIG device handles: sparse slots, each with its own memory and processes; no utilization either.
    with pytest.raises(pynvml.NVMLError_NotFound):
        lib.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        lib.nvmlDeviceGetMigDeviceHandleByIndex(parent, 7)
    second = lib.nvmlDeviceGetMigDeviceHandleByIndex(parent, 3)
    assert lib.nvmlDeviceGetGpuInstanceId(second) == 2 and lib.nvmlDeviceGetComputeInstanceId(second) == 0
    assert lib.nvmlDeviceGetUUID(second).startswith("MIG-")
    assert lib.nvmlDeviceGetName(second) == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    memory = lib.nvmlDeviceGetMemoryInfo(second, version=pynvml.nvmlMemory_v2)
    assert (memory.total, memory.used) == (40 * GIB, int(37.5 * GIB))
    (proc,) = lib.nvmlDeviceGetComputeRunningProcesses(second)
    assert (proc.pid, proc.gpuInstanceId, proc.computeInstanceId) == (ENGINE, 2, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        lib.nvmlDeviceGetUtilizationRates(second)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        lib.nvmlDeviceGetGpuInstanceId(parent)  # not a MIG device handle
    # A privileged caller gets the parent's aggregate.
    lib = mig_node(privileged=True)
    lib.nvmlInit()
    parent = lib.nvmlDeviceGetHandleByIndex(0)
    assert lib.nvmlDeviceGetMemoryInfo(parent, version=pynvml.nvmlMemory_v2).used == int(39.5 * GIB)
    assert sorted(p.pid for p in lib.nvmlDeviceGetComputeRunningProcesses(parent)) == [7, ENGINE]


def test_a_gpu_in_mig_mode_is_read_as_its_gpu_instances() -> None:
    source = NvmlSource(mig_node())
    reading = source.read()
    assert [g.label for g in reading.gpus] == ["0/1", "0/2", "1"]
    first, second, plain = reading.gpus
    assert second.total_bytes == 40 * GIB and second.used_bytes == 37.5 * GIB
    assert [p.pid for p in second.processes or ()] == [ENGINE] and [p.pid for p in first.processes or ()] == [7]
    assert second.mig is not None and (second.mig.gpu_instance, second.mig.compute_instance) == (2, 0)
    assert second.mig.profile == "3g.40gb" and second.mig.parent_uuid == plain.uuid.replace("001", "000")
    assert second.uuid.startswith("MIG-") and second.utilization_ratio is None and not second.error
    assert plain.mig is None and plain.used_bytes == 10 * GIB
    # The layout is not looked up again at every read: up to seven handle look-ups a GPU, most of them NOT_FOUND.
    calls = source.lib.calls["nvmlDeviceGetMigDeviceHandleByIndex"]
    source.read()
    assert source.lib.calls["nvmlDeviceGetMigDeviceHandleByIndex"] == calls


def test_an_engine_on_a_slice_is_judged_on_the_slice() -> None:
    """vLLM at gpu_memory_utilization 0.9 on a 3g.40gb slice, holding 37.5 of its 40 GiB: judged against the slice
    (0.94 used, its reservation 36 GiB, 1.5 GiB beyond it), never against the whole GPU (0.47)."""
    nvml = NvmlSource(mig_node()).read()
    target = TargetReading(
        "vllm", "vllm", "http://127.0.0.1:8000", (), True, "up", 0.01, 200, 0.001,
        EngineReading((), memory_utilization_ratio=0.9), process=ProcessTree(ENGINE, frozenset({ENGINE}), 0.0, 0.0),
    )  # fmt: skip
    memory = join_targets(nvml, (target,))
    judged = memory["vllm"]
    assert judged.gpus == (("", "0/2"),)
    assert judged.used_bytes == 37.5 * GIB and judged.total_bytes == 40 * GIB
    gpus = join_gpus(nvml, (target,), memory)
    assert gpus[("", "0/2")].reserved_bytes == pytest.approx(36 * GIB)
    assert gpus[("", "0/2")].over_reservation_bytes == pytest.approx(1.5 * GIB)
    assert set(gpus) == {("", "0/2")}  # the other slice has no engine, and no reservation joined


def test_the_instances_are_exported_with_their_identity(promtool: str) -> None:
    nvml = NvmlSource(mig_node()).read()
    body = render(Snapshot(gpus=nvml, targets=(), sources={"nvml": SourceResult(True, 0.001)}, collected_at=0.0))
    text = body.decode()
    assert 'oomguard_gpu_memory_total_bytes{gpu="0/2",node=""} 4.294967296e+10' in text
    info = [line for line in text.splitlines() if line.startswith("oomguard_gpu_mig_info{")]
    assert len(info) == 2 and 'gpu="0/2"' in info[1] and 'parent_gpu="0"' in info[1] and 'profile="3g.40gb"' in info[1]
    assert 'gpu_instance="2"' in info[1] and 'compute_instance="0"' in info[1]
    assert 'oomguard_gpu_memory_total_bytes{gpu="0",' not in text  # the parent is its instances
    promtool_check_metrics(promtool, body)


async def test_diagnose_judges_a_target_on_its_instances(aiohttp_client, zoo) -> None:  # type: ignore[no-untyped-def]
    """A vLLM configured on GPU 0 (`gpus: [0]`) of a GPU in MIG mode: its GPUs are the two instances, and `oomguard
    diagnose --exporter` reads each instance's figures under its own label."""
    import asyncio

    from oomguard.diagnose.core import diagnose_data
    from oomguard.diagnose.query import fetch_exporter
    from tests.test_web import app_for

    client = await aiohttp_client(app_for(zoo, ["good"], lib=mig_node(), gpus=(0,)))
    assert (await client.get("/metrics")).status == 200
    url = str(client.make_url("/metrics"))
    (found,) = diagnose_data(await asyncio.to_thread(fetch_exporter, url))
    assert found.target == "good" and found.gpus == ["0/1", "0/2"]
    assert found.facts is not None
    assert found.facts.per_gpu["0/2"][-1][1] == pytest.approx(0.9375)  # 37.5 of the slice's 40 GiB
