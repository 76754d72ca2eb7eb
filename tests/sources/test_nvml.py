"""NVML source on the fake pynvml (real pynvml structures and error classes) and on the real library."""

from __future__ import annotations

import logging

import pynvml
import pytest

from oomguard.exporter.sources import nvml as nvml_module
from oomguard.exporter.sources.nvml import NvmlSource
from oomguard.simulate.fake_nvml import GIB, FakeGpu, FakeNvml, FakeProcess


def two_gpus() -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu(
                0,
                total_bytes=80 * GIB,
                used_bytes=72 * GIB,
                utilization_percent=93,
                processes=[FakeProcess(pid=1, used_bytes=70 * GIB), FakeProcess(pid=999_999_999, used_bytes=None)],
            ),
            FakeGpu(1, total_bytes=80 * GIB, used_bytes=1 * GIB, name="NVIDIA H200"),
        ]
    )


def test_reads_memory_identity_utilization_and_processes() -> None:
    reading = NvmlSource(two_gpus()).read()
    assert reading.up and reading.driver_version == "550.54.15"
    gpu0, gpu1 = reading.gpus
    assert gpu0.total_bytes == 80 * GIB and gpu0.used_bytes == 72 * GIB
    assert gpu0.reserved_bytes == 512 * 1024**2
    assert gpu0.free_bytes == 80 * GIB - 72 * GIB - 512 * 1024**2
    assert gpu0.utilization_ratio == 0.93
    assert gpu0.uuid.startswith("GPU-") and gpu0.pci_bus_id == "00000000:17:00.0"
    assert gpu1.name == "NVIDIA H200"
    procs = {p.pid: p for p in gpu0.processes}
    assert procs[1].used_bytes == 70 * GIB and procs[1].name  # pid 1 exists on every Linux host
    assert procs[999_999_999].used_bytes is None and procs[999_999_999].name == ""
    assert gpu1.processes == ()


def test_static_identity_is_fetched_once() -> None:
    lib = two_gpus()
    source = NvmlSource(lib)
    for _ in range(5):
        source.read()
    assert lib.calls["nvmlDeviceGetUUID"] == 2
    assert lib.calls["nvmlDeviceGetHandleByIndex"] == 2
    assert lib.calls["nvmlDeviceGetMemoryInfo_v2"] == 10


def test_memory_v1_fallback_when_v2_is_missing() -> None:
    lib = two_gpus()
    lib.gpus[0].errors["nvmlDeviceGetMemoryInfo_v2"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    source = NvmlSource(lib)
    gpu0 = source.read().gpus[0]
    assert gpu0.reserved_bytes is None  # v1 has no reserved field
    assert gpu0.used_bytes == 72 * GIB + 512 * 1024**2  # v1 counts the reservation as used
    source.read()
    # GPU 0 tries v2 once and then sticks to v1; GPU 1 keeps v2.
    assert lib.calls["nvmlDeviceGetMemoryInfo_v2"] == 1 + 2
    assert lib.calls["nvmlDeviceGetMemoryInfo"] == 2


def test_unsupported_call_drops_only_that_series_and_is_not_asked_again() -> None:
    lib = two_gpus()
    lib.gpus[0].unsupported.add("nvmlDeviceGetUtilizationRates")
    source = NvmlSource(lib)
    for _ in range(3):
        gpu0, gpu1 = source.read().gpus
    assert gpu0.utilization_ratio is None and gpu0.used_bytes == 72 * GIB
    assert gpu1.utilization_ratio == 0.0
    assert lib.calls["nvmlDeviceGetUtilizationRates"] == 1 + 3


def test_lost_gpu_is_marked_down_and_others_still_read(caplog: pytest.LogCaptureFixture) -> None:
    lib = two_gpus()
    source = NvmlSource(lib)
    source.read()
    lib.gpus[1].lost = True
    with caplog.at_level(logging.ERROR):
        gpu0, gpu1 = source.read().gpus
    assert gpu0.up and gpu0.used_bytes == 72 * GIB
    assert not gpu1.up and gpu1.total_bytes is None
    assert "GPU 1 is lost" in caplog.text
    lib.gpus[1].lost = False  # after a reset the GPU comes back: its handle is looked up afresh
    handles_before = lib.calls["nvmlDeviceGetHandleByIndex"]
    assert source.read().gpus[1].up
    assert lib.calls["nvmlDeviceGetHandleByIndex"] == handles_before + 1


def test_process_query_without_permission_is_not_an_idle_gpu() -> None:
    lib = two_gpus()
    lib.gpus[0].errors["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_NO_PERMISSION
    gpu0 = NvmlSource(lib).read().gpus[0]
    assert gpu0.up and gpu0.processes is None and gpu0.used_bytes == 72 * GIB


def test_other_error_keeps_identity_and_marks_the_reading() -> None:
    lib = two_gpus()
    lib.gpus[0].errors["nvmlDeviceGetMemoryInfo_v2"] = pynvml.NVML_ERROR_TIMEOUT
    gpu0, gpu1 = NvmlSource(lib).read().gpus
    assert gpu0.up and gpu0.error and gpu0.uuid and gpu0.total_bytes is None
    assert gpu1.total_bytes == 80 * GIB


def test_per_process_can_be_turned_off() -> None:
    lib = two_gpus()
    assert NvmlSource(lib, per_process=False).read().gpus[0].processes is None
    assert not [call for call in lib.calls if "RunningProcesses" in call]
    assert NvmlSource(lib).read().gpus[0].processes  # the same name counts the calls when they are made
    assert lib.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 2


def test_missing_library_logs_once_and_retries_later(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    lib = FakeNvml(library_present=False)
    source = NvmlSource(lib, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            reading = source.read()
    assert not reading.up and "no NVIDIA driver" in reading.error
    assert caplog.text.count("NVML could not start") == 1
    assert lib.calls["nvmlInit"] == 1  # not retried on every scrape
    lib.library_present = True
    now[0] = nvml_module.INIT_RETRY_SECONDS + 1
    assert source.read().up
    assert lib.calls["nvmlInit"] == 2


def test_real_pynvml_without_a_driver() -> None:
    """On this machine (no GPU, no driver) the real library raises LibraryNotFound: up=0, no crash."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present here: tests/gpu/ covers the real library")
    reading = NvmlSource(pynvml).read()
    assert not reading.up
    assert "NVML Shared Library Not Found" in reading.error and "no NVIDIA driver" in reading.error


def test_an_older_driver_without_the_v3_process_calls_is_read_through_v2() -> None:
    """Before R510 the library has no nvmlDeviceGetComputeRunningProcesses_v3: pynvml's unversioned call then raises
    NVMLLibraryMismatchError, which is no NVMLError (it escaped every handler). The versioned calls are made instead,
    _v3 then _v2, and memory info v1 where v2 is missing."""
    lib = two_gpus()
    lib.missing = {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetMemoryInfo_v2",
                   "nvmlDeviceGetMPSComputeRunningProcesses_v3"}  # fmt: skip
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        lib.nvmlInit() or lib.nvmlDeviceGetComputeRunningProcesses(lib.nvmlDeviceGetHandleByIndex(0))
    asked = lib.calls["nvmlDeviceGetComputeRunningProcesses_v3"]
    source = NvmlSource(lib)
    for _ in range(2):
        gpu0 = source.read().gpus[0]
        assert not gpu0.error and sorted(p.pid for p in gpu0.processes or ()) == [1, 999_999_999]
        assert gpu0.reserved_bytes is None  # v1: no reservation apart
    assert lib.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == asked + 1  # not asked again
    # Before R450 neither: the processes are unsupported, the memory still read.
    lib.missing.add("nvmlDeviceGetComputeRunningProcesses_v2")
    gpu0 = NvmlSource(lib).read().gpus[0]
    assert gpu0.processes is None and not gpu0.error and gpu0.used_bytes is not None


def test_mps_clients_are_listed_with_their_own_memory() -> None:
    """Under MPS the compute list has the MPS server; a client's own memory is in the MPS list."""
    lib = two_gpus()
    lib.gpus[1].processes = [FakeProcess(pid=50, used_bytes=1 * GIB)]  # nvidia-cuda-mps-server
    lib.gpus[1].mps_clients = [FakeProcess(pid=51, used_bytes=20 * GIB), FakeProcess(pid=50, used_bytes=None)]
    gpu1 = NvmlSource(lib).read().gpus[1]
    assert sorted((p.pid, p.used_bytes) for p in gpu1.processes or ()) == [(50, 1 * GIB), (51, 20 * GIB)]


def test_a_process_list_that_outgrew_its_buffer_is_unknown_not_a_failed_gpu() -> None:
    """pynvml asks twice (the count, then the list in a buffer of twice that and 5); processes started between the
    two calls can still overflow it: NVML_ERROR_INSUFFICIENT_SIZE. The processes are unknown for that read; the
    GPU's memory is read."""
    lib = two_gpus()
    lib.gpus[0].errors["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    gpu0 = NvmlSource(lib).read().gpus[0]
    assert gpu0.processes is None and not gpu0.error and gpu0.used_bytes == 72 * GIB


def test_a_driver_not_loaded_is_said_with_its_cause(caplog: pytest.LogCaptureFixture) -> None:
    lib = two_gpus()
    lib.missing = set()

    def refuse(call: str) -> None:
        if call == "nvmlInit":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    lib.before_call = refuse
    with caplog.at_level(logging.WARNING):
        reading = NvmlSource(lib).read()
    assert not reading.up and "kernel module is not loaded" in reading.error
