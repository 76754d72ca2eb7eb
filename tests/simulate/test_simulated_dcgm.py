"""The simulated dcgm-exporter (simulate/dcgm_exporter.py): its body is one dcgm-exporter's as the parser reads real
ones, and `serve --simulate --simulate.gpu-source dcgm` reads the simulation's GPUs through it, as the cluster mode
reads a node's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support import samples

from oomguard.exporter.exposition import render
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.sources.dcgm_body import parse
from oomguard.simulate.checks import load_config
from oomguard.simulate.dcgm_exporter import body
from oomguard.simulate.fake_nvml import GIB, FakeGpu
from oomguard.simulate.host import SimulatedHost

MIB = 1024**2


def test_its_body_reads_as_dcgm_exporters_with_the_engines_pod() -> None:
    gpus = [FakeGpu(0, used_bytes=70 * GIB + 3), FakeGpu(1, used_bytes=GIB), FakeGpu(2, lost=True)]
    gpus[0].utilization_percent = 85
    parsed = parse(body(gpus, node="sim-node", pod=("sim", "sim-vllm", "vllm"), pod_gpus=(0,)))
    assert [g.index for g in parsed.gpus] == [0, 1]  # a lost GPU is not written
    first, second = parsed.gpus
    assert first.used_bytes == 70 * GIB  # whole MiB, as dcgm-exporter writes them
    assert first.reserved_bytes == gpus[0].reserved_bytes
    assert first.total_bytes is not None and 80 * GIB - first.total_bytes <= MIB  # used + free + reserved, each floored
    assert first.utilization_ratio == 0.85
    assert first.hostname == "sim-node" and first.uuid == gpus[0].uuid
    assert first.pods == (("sim", "sim-vllm", "vllm"),) and second.pods == ()


@pytest.mark.parametrize("version", ["3.x", "4.10"])
async def test_the_simulation_read_through_it(tmp_path: Path, version: str) -> None:
    config = load_config(None, {
        "simulation": {"scenario": "steady", "time_scale": 30, "gpu_source": "dcgm", "dcgm_version": version},
        "events": {"kernel_log": False}, "trend": {"enabled": False},
    })  # fmt: skip
    runtime = Runtime(config, simulated=SimulatedHost(config))
    await runtime.start()
    try:
        assert runtime.collection is not None
        for _ in range(100):
            got = samples(render(await runtime.collection.snapshot()).decode())
            if got.get(("oomguard_target_up", (("target", "sim-vllm"),))) == 1.0:
                break
            await asyncio.sleep(0.1)
        assert got[("oomguard_source_success", (("source", "dcgm"),))] == 1.0
        assert ("oomguard_source_success", (("source", "nvml"),)) not in got  # NVML is not read
        assert got[("oomguard_gpu_memory_used_bytes", (("gpu", "0"),))] > 0
        assert got[("oomguard_gpu_process_query_success", (("gpu", "0"),))] == 0.0
        assert got[("oomguard_target_gpu_info", (("gpu", "0"), ("target", "sim-vllm")))] == 1.0
        assert not [key for key in got if key[0] == "oomguard_target_process_gpu_memory_bytes"]
    finally:
        await runtime.stop()


def test_it_speaks_dcgm_exporter_4_10_read_to_the_byte_with_no_configuration() -> None:
    """version "4.10": DCGM 4.7's byte families (CAPACITY_BYTES the total), GPU_UTIL_RATIO, `hostname`, the driver
    label DCGM_FI_SYSTEM_DRIVER_VERSION, pod labels on a GPU in a pod only, families by name and values as Go's %g
    (tests/fixtures/dcgm/README.md, body h). Read with the default fields: every figure exact, none rounded to a MiB."""
    gpus = [FakeGpu(0, used_bytes=70 * GIB + 3), FakeGpu(1, used_bytes=GIB)]
    gpus[0].utilization_percent = 85
    text = body(gpus, node="sim-node", pod=("sim", "sim-vllm", "vllm"), pod_gpus=(0,), version="4.10")
    assert "DCGM_FI_DEV_FB_USED{" not in text and 'hostname="sim-node"' in text and "Hostname=" not in text
    assert "DCGM_FI_SYSTEM_DRIVER_VERSION=" in text and 'pod=""' not in text
    first, second = parse(text).gpus
    assert (first.used_bytes, first.reserved_bytes, first.total_bytes) == (
        70 * GIB + 3, gpus[0].reserved_bytes, gpus[0].total_bytes
    )  # fmt: skip
    assert first.free_bytes == gpus[0].total_bytes - gpus[0].reserved_bytes - (70 * GIB + 3)
    assert first.utilization_ratio == 0.85 and first.hostname == "sim-node"
    assert first.pods == (("sim", "sim-vllm", "vllm"),) and second.pods == ()
