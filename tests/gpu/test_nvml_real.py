"""Real NVML on a real GPU: runs only where NVML finds one (skipped elsewhere, with the reason)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pynvml
import pytest

from oomguard.exporter.sources.nvml import NvmlSource

MIB = 1024 * 1024


def _gpu_or_skip_reason() -> str:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"NVML finds no GPU here ({exc}): the GPU tests need an NVIDIA driver"
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return "NVML runs but reports 0 GPUs"
    finally:
        pynvml.nvmlShutdown()
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi is not on PATH: nothing to compare with"
    return ""


REASON = _gpu_or_skip_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(REASON), reason=REASON or "GPU present")]


def nvidia_smi() -> list[tuple[int, int, int]]:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return [tuple(int(x) for x in line.split(",")) for line in out.strip().splitlines()]  # type: ignore[misc]


def test_memory_matches_nvidia_smi() -> None:
    source = NvmlSource(pynvml)
    try:
        reading = source.read()
    finally:
        source.close()
    assert reading.up, reading.error
    smi = {index: (used, total) for index, used, total in nvidia_smi()}
    assert sorted(smi) == [g.index for g in reading.gpus]
    for gpu in reading.gpus:
        used_mib, total_mib = smi[gpu.index]
        print(
            f"GPU {gpu.index} {gpu.name}: oomguard used={gpu.used_bytes / MIB:.0f} MiB "
            f"total={gpu.total_bytes / MIB:.0f} MiB reserved={(gpu.reserved_bytes or 0) / MIB:.0f} MiB; "
            f"nvidia-smi used={used_mib} total={total_mib}"
        )
        assert gpu.up and gpu.uuid.startswith(("GPU-", "MIG-"))
        assert abs(gpu.total_bytes / MIB - total_mib) <= 1
        # nvidia-smi may count the driver's reservation as used, depending on the driver.
        candidates = [gpu.used_bytes / MIB, (gpu.used_bytes + (gpu.reserved_bytes or 0)) / MIB]
        assert min(abs(c - used_mib) for c in candidates) <= 64, (candidates, used_mib)
        assert gpu.processes is not None


def test_a_process_allocating_memory_is_seen() -> None:
    """Allocate 1 GiB with the CUDA driver API in a child process and find it in the per-process list."""
    torch = pytest.importorskip("torch", reason="torch with CUDA is needed to allocate GPU memory")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    code = (
        "import torch, time; x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda:0'); "
        "print('ok', flush=True); time.sleep(30)"
    )

    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ok"
        source = NvmlSource(pynvml)
        try:
            gpu0 = source.read().gpus[0]
        finally:
            source.close()
        mine = [p for p in gpu0.processes or () if p.pid == child.pid]
        assert mine, f"pid {child.pid} not among {gpu0.processes}"
        assert mine[0].used_bytes is None or mine[0].used_bytes >= 1 << 30
        print(f"child pid {child.pid}: {mine[0].used_bytes} bytes on GPU 0, name {mine[0].name!r}")
    finally:
        child.kill()
