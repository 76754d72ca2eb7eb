"""A stand-in for `pynvml` where no GPU exists: same calls, same return types, same errors.

It returns the real ctypes structures of `pynvml` and raises the real `pynvml`
error classes, so `sources/nvml.py` runs unchanged on it. Used by the built-in
simulation and by the tests (which also inject faults: lost GPUs, unsupported
calls, a missing library, hangs).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

GIB = 1024**3


@dataclass
class FakeProcess:
    pid: int
    used_bytes: int | None


@dataclass
class FakeGpu:
    index: int
    total_bytes: int = 80 * GIB
    used_bytes: int = 0
    reserved_bytes: int = 512 * 1024**2
    utilization_percent: int = 0
    name: str = "NVIDIA H100 80GB HBM3"
    processes: list[FakeProcess] = field(default_factory=list)
    lost: bool = False
    # NVML function names that answer NVML_ERROR_NOT_SUPPORTED on this GPU.
    unsupported: set[str] = field(default_factory=set)
    # Function names that answer another error code,
    # e.g. {"nvmlDeviceGetComputeRunningProcesses": pynvml.NVML_ERROR_NO_PERMISSION}.
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def uuid(self) -> str:
        return f"GPU-00000000-0000-4000-8000-{self.index:012d}"

    @property
    def pci_bus_id(self) -> str:
        return f"00000000:{0x17 + self.index:02X}:00.0"


class _Handle:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu


def _raise(code: int) -> None:
    raise pynvml.NVMLError(code)  # NVMLError.__new__ picks the subclass, as in the real library


class FakeNvml:
    """Module-like object: `FakeNvml(gpus).nvmlDeviceGetCount()` etc.

    Constants and error classes are the real ones from `pynvml`.
    """

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        driver_version: str = "550.54.15",
        library_present: bool = True,
        before_call: Callable[[str], None] | None = None,
    ) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu(0)]
        self.driver_version = driver_version
        self.library_present = library_present
        self.before_call = before_call  # tests hook hangs and counters here
        self.calls: dict[str, int] = {}
        self.xid_queue: queue.Queue[tuple[int, int]] = queue.Queue()  # (gpu index, xid) to deliver
        self._initialised = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        # NVMLError_*, NVML_* constants, nvmlMemory_v2 and the like.
        if name.startswith(("NVML", "nvmlMemory", "nvmlEventType")):
            return getattr(pynvml, name)
        raise AttributeError(f"FakeNvml does not implement {name}: add it, mirroring pynvml")

    def _enter(self, call: str, gpu: FakeGpu | None = None) -> None:
        with self._lock:
            self.calls[call] = self.calls.get(call, 0) + 1
        if self.before_call is not None:
            self.before_call(call)
        if call != "nvmlInit" and not self._initialised:
            _raise(pynvml.NVML_ERROR_UNINITIALIZED)
        if gpu is not None:
            if gpu.lost:
                _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
            if call in gpu.unsupported:
                _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if call in gpu.errors:
                _raise(gpu.errors[call])

    # -- library --------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if not self.library_present:
            _raise(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        self._initialised += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self._initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < len(self.gpus):
            self._enter("nvmlDeviceGetHandleByIndex")
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        self._enter("nvmlDeviceGetHandleByIndex", gpu)
        return _Handle(gpu)

    # -- per device -----------------------------------------------------------------------
    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._enter("nvmlDeviceGetName", handle.gpu)
        return handle.gpu.name

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._enter("nvmlDeviceGetUUID", handle.gpu)
        return handle.gpu.uuid

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> Any:
        self._enter("nvmlDeviceGetPciInfo", handle.gpu)
        info = pynvml.nvmlPciInfo_t()
        info.busId = handle.gpu.pci_bus_id.encode()
        return info

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        gpu = handle.gpu
        used = min(gpu.used_bytes, gpu.total_bytes)
        if version:
            self._enter("nvmlDeviceGetMemoryInfo_v2", gpu)
            if version != pynvml.nvmlMemory_v2:
                _raise(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
            free = gpu.total_bytes - gpu.reserved_bytes - used
            return pynvml.c_nvmlMemory_v2_t(version, gpu.total_bytes, gpu.reserved_bytes, max(free, 0), used)
        self._enter("nvmlDeviceGetMemoryInfo", gpu)
        # v1 counts the driver's reservation as used.
        used_v1 = min(used + gpu.reserved_bytes, gpu.total_bytes)
        return pynvml.c_nvmlMemory_t(gpu.total_bytes, gpu.total_bytes - used_v1, used_v1)

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", handle.gpu)
        return pynvml.c_nvmlUtilization_t(handle.gpu.utilization_percent, 0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", handle.gpu)
        out = []
        for proc in handle.gpu.processes:
            not_available = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
            raw = pynvml.c_nvmlProcessInfo_v3_t(
                pid=proc.pid, usedGpuMemory=not_available if proc.used_bytes is None else proc.used_bytes
            )
            obj = pynvml.nvmlStructToFriendlyObject(raw)
            if obj.usedGpuMemory == not_available:
                obj.usedGpuMemory = None  # what pynvml does for "not available"
            out.append(obj)
        return out

    # -- events ---------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> object:
        self._enter("nvmlEventSetCreate")
        return object()

    def nvmlDeviceRegisterEvents(self, handle: _Handle, event_types: int, event_set: object) -> None:
        self._enter("nvmlDeviceRegisterEvents", handle.gpu)

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> Any:
        self._enter("nvmlEventSetWait")
        try:
            index, xid = self.xid_queue.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            _raise(pynvml.NVML_ERROR_TIMEOUT)
        # c_nvmlEventData_t's `device` is a C pointer a fake handle cannot fill: same fields, plain object.
        return SimpleNamespace(
            device=_Handle(self.gpus[index]), eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid,
            gpuInstanceId=0, computeInstanceId=0,
        )  # fmt: skip

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._enter("nvmlEventSetFree")
