"""The GPU acceptance run (scripts/gpu-acceptance.sh) where there is no GPU: it runs end to end on the stand-in NVML,
says so in its figures and its summary, skips what needs a GPU with the reason, and exits 0 when what ran passed.

The real run (a GPU, nvidia-smi, libcuda) is the script itself, run by hand on a GPU machine: docs/testing.md."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-acceptance.sh"


def run_script(*args: str, out: Path | None, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OOMGUARD_ACCEPTANCE_PYTHON": sys.executable}
    env.pop("OUT", None)
    argv = ["bash", str(SCRIPT), *args, *(["--out", str(out)] if out else [])]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_the_run_passes_on_the_stand_in_nvml(tmp_path: Path) -> None:
    # A short climb keeps the run near 30 s; the trend's windows follow --climb-seconds (run.py, trend_config).
    done = run_script("--mode", "simulated", "--climb-seconds", "16", out=tmp_path, timeout=90)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    results = json.loads((tmp_path / "gpu-acceptance.json").read_text())
    assert results["mode"] == "simulated" and results["passed"] and results["exit_code"] == 0
    checks: dict[str, dict[str, Any]] = {c["name"]: c for c in results["checks"]}
    for name in (
        "memory_vs_reference",
        "allocation_per_process",
        "allocation_trend",
        "allocation_oom_counted_once",
        "allocation_left_as_found",
        "nvml_cost",
    ):
        assert checks[name]["status"] == "pass", checks[name]
        assert checks[name]["source"] == "simulated", checks[name]
    # What needs a GPU is skipped, with the reason.
    skipped = {s["check"]: s["why"] for s in results["skipped"]}
    assert "nvidia_smi" in skipped and "cuda_driver_api" in skipped
    assert all("no GPU here" in why for name, why in skipped.items() if name != "mig")

    trend = checks["allocation_trend"]["figures"]
    assert trend["lead_before_oom_seconds"] > 0 and trend["seconds_to_full_at_first_call"] > 0
    oom = checks["allocation_oom_counted_once"]["figures"]
    assert oom["cuda_oom_after"] - oom["cuda_oom_before"] == 1
    assert oom["engine_death_after"] == oom["engine_death_before"]
    cost = checks["nvml_cost"]["figures"]
    assert cost["scrapes"] == 50 and cost["gpus"] == 2 and cost["nvml_failures"] == 0
    rounds = checks["memory_vs_reference"]["figures"]["rounds"]
    assert {r["phase"] for r in rounds} == {"idle", "allocating", "after"}

    # The engine log holds the OOM as vLLM writes it, ending in PyTorch's exception.
    log = (tmp_path / "engine.log").read_text()
    assert "EngineCore encountered a fatal error." in log
    assert (
        log.rstrip()
        .splitlines()[-1]
        .split(") ", 1)[1]
        .startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.")
    )
    summary = (tmp_path / "gpu-acceptance.md").read_text()
    assert "SIMULATED" in summary and "passed" in summary


def test_a_gpu_run_asked_for_where_there_is_none_says_why(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("nvidia-smi is here: --mode gpu would run the real thing (minutes); run the script by hand")
    done = run_script("--mode", "gpu", out=tmp_path, timeout=30)
    assert done.returncode == 2, done.stdout + done.stderr
    results = json.loads((tmp_path / "gpu-acceptance.json").read_text())
    assert "--mode gpu, but nvidia-smi is not on PATH" in results["setup_error"]
    assert not results["passed"]


def test_the_figures_need_a_place(tmp_path: Path) -> None:
    done = run_script("--mode", "simulated", out=None, timeout=30)
    assert done.returncode == 2
    assert "$OUT or --out DIR" in done.stderr


# The CUDA driver API as allocate.py calls it, in a stub `libcuda.so.1`: two 4 GiB devices, cuMemAlloc_v2 refusing
# with CUDA_ERROR_OUT_OF_MEMORY (2) past the total. It runs the ctypes path (argument types, the UUID's format, the
# OOM, the frees) where no GPU is; what a real driver does is the acceptance run's to see.
STUB_LIBCUDA = r"""
#include <stdint.h>
#include <stdio.h>
#include <stddef.h>
typedef int CUresult;
static const size_t total = 4ULL << 30;
static size_t used = 0;
static int inited = 0, allocations = 0, frees = 0;
CUresult cuInit(unsigned int flags) { inited = 1; return 0; }
CUresult cuDeviceGetCount(int *n) { if (!inited) return 3; *n = 2; return 0; }
CUresult cuDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
CUresult cuDeviceGetUuid(unsigned char *uuid, int device) {
    for (int i = 0; i < 16; i++) uuid[i] = (unsigned char)(device * 16 + i);
    return 0;
}
CUresult cuDevicePrimaryCtxRetain(void **context, int device) { *context = (void *)0x1000; return 0; }
CUresult cuCtxSetCurrent(void *context) { return context ? 0 : 201; }
CUresult cuMemGetInfo_v2(size_t *free, size_t *all) { *free = total - used; *all = total; return 0; }
CUresult cuMemAlloc_v2(uint64_t *pointer, size_t size) {
    if (used + size > total) return 2;
    used += size; allocations++; *pointer = 0x100000 + used;
    return 0;
}
CUresult cuMemFree_v2(uint64_t pointer) { frees++; used -= 512ULL << 20; return 0; }
CUresult cuGetErrorName(CUresult result, const char **name) {
    *name = result == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_UNKNOWN";
    return 0;
}
CUresult cuDevicePrimaryCtxRelease_v2(int device) {
    fprintf(stderr, "stub: %d allocations, %d frees, %zu bytes held\n", allocations, frees, used);
    return 0;
}
"""


@pytest.fixture(scope="module")
def stub_libcuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build the stub libcuda")
    folder = tmp_path_factory.mktemp("stub-libcuda")
    (folder / "stub.c").write_text(STUB_LIBCUDA)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(folder / "libcuda.so.1"), str(folder / "stub.c")], check=True)
    return folder


def allocate(stub: Path, tmp_path: Path, uuid: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(stub), "PYTHONPATH": f"{ROOT / 'exporter'}{os.pathsep}{ROOT}"}
    argv = [sys.executable, "-m", "scripts.gpu_acceptance.allocate", "--uuid", uuid, "--gpu-index", "1",
            "--log", str(tmp_path / "engine.log"), "--state", str(tmp_path / "state.json"), "--step-mib", "512",
            "--climb-seconds", "0.5", "--hold-seconds", "0"]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env, cwd=ROOT)


def test_the_allocator_through_the_cuda_driver_api_of_a_stub(stub_libcuda: Path, tmp_path: Path) -> None:
    done = allocate(stub_libcuda, tmp_path, "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f")  # the stub's device 1
    assert done.returncode == 0, done.stderr
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["phase"] == "freed" and state["steps"] == 8 and state["peak_bytes"] == 4 << 30
    assert "stub: 8 allocations, 8 frees, 0 bytes held" in done.stderr
    last = (tmp_path / "engine.log").read_text().rstrip().splitlines()[-1]
    assert last.startswith(f"(EngineCore pid={state['pid']}) torch.OutOfMemoryError: CUDA out of memory. ")
    assert "Tried to allocate 0.50 GiB. GPU 1 has a total capacity of 4.00 GiB of which 0.00 MiB is free." in last


def test_the_allocator_refuses_a_gpu_cuda_does_not_see(stub_libcuda: Path, tmp_path: Path) -> None:
    done = allocate(stub_libcuda, tmp_path, "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff")
    assert done.returncode == 4
    assert "no CUDA device has UUID GPU-ffffffff-ffff-ffff-ffff-ffffffffffff" in done.stderr
    assert json.loads((tmp_path / "state.json").read_text())["phase"] == "error"


FAKE_SMI = """#!/bin/sh
case "$1" in
  *memory.reserved*) [ -n "$OLD_DRIVER" ] && { echo 'Field "memory.reserved" is not a valid field to query.'; exit 2; }
                     echo "0, GPU-aaaaaaaa-0000-0000-0000-000000000000, 81559, 4, 530"
                     echo "1, GPU-bbbbbbbb-0000-0000-0000-000000000000, 81559, 600, [N/A]" ;;
  *) echo "0, GPU-aaaaaaaa-0000-0000-0000-000000000000, 81559, 534"
     echo "1, GPU-bbbbbbbb-0000-0000-0000-000000000000, 81559, 600" ;;
esac
"""


def test_nvidia_smi_is_read_with_its_reservation_or_without(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scripts.gpu_acceptance.reference import NvidiaSmi, RefGpu

    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    # A recent driver: memory.reserved answered ("[N/A]" where it has none).
    assert NvidiaSmi().read() == [
        RefGpu(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", 81559.0, 4.0, 530.0),
        RefGpu(1, "GPU-bbbbbbbb-0000-0000-0000-000000000000", 81559.0, 600.0, None),
    ]
    # An older driver refuses the field: asked without it from then on.
    monkeypatch.setenv("OLD_DRIVER", "1")
    reader = NvidiaSmi()
    assert reader.read() == [
        RefGpu(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", 81559.0, 534.0, None),
        RefGpu(1, "GPU-bbbbbbbb-0000-0000-0000-000000000000", 81559.0, 600.0, None),
    ]
    assert reader.with_reserved is False
