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

    def __post_init__(self) -> None:
        # NVML's field is unsigned: a negative figure would reach the exporter wrapped to about 2**64 bytes.
        if self.used_bytes is not None and self.used_bytes < 0:
            raise ValueError(f"process {self.pid}: used_bytes {self.used_bytes} < 0, which NVML never reports")


@dataclass
class FakeMigDevice:
    """A MIG device (a compute instance) on a FakeGpu in MIG mode: `slot` is its index among the parent's MIG device
    handles (sparse, as NVML's are); its memory is its GPU instance's, shared by the compute instances of one GI."""

    gpu_instance: int
    slot: int
    compute_instance: int = 0
    profile: str = "3g.40gb"
    total_bytes: int = 40 * GIB
    used_bytes: int = 0
    reserved_bytes: int = 0
    processes: list[FakeProcess] = field(default_factory=list)


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
    # MIG: `mig_capable` (Ampere and later datacenter GPUs); `mig_devices` None while MIG mode is off, else its MIG
    # devices. In MIG mode the parent's memory and processes are an aggregate that NVML gives only to a privileged
    # caller (`privileged`), and its utilization is not supported, as NVML's documentation says of each call.
    mps_clients: list[FakeProcess] = field(default_factory=list)  # where MPS runs: its clients, listed apart
    mig_capable: bool = True
    mig_devices: list[FakeMigDevice] | None = None
    max_mig_devices: int = 7
    privileged: bool = False

    @property
    def uuid(self) -> str:
        return f"GPU-00000000-0000-4000-8000-{self.index:012d}"

    @property
    def pci_bus_id(self) -> str:
        return f"00000000:{0x17 + self.index:02X}:00.0"


class _Handle:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu


class _MigHandle:
    """A MIG device handle: usable, with its own answers, where NVML takes a device handle."""

    def __init__(self, gpu: FakeGpu, mig: FakeMigDevice) -> None:
        self.gpu = gpu  # its parent: a lost parent loses its MIG devices too
        self.mig = mig

    @property
    def uuid(self) -> str:
        return f"MIG-{self.gpu.index:08d}-0000-4000-8000-{self.mig.gpu_instance:06d}{self.mig.compute_instance:06d}"


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
        missing: set[str] | None = None,
    ) -> None:
        """`missing`: functions the driver's library lacks (an older driver: "nvmlDeviceGetMemoryInfo_v2" before
        R510, "nvmlDeviceGetComputeRunningProcesses_v3" too): NVML_ERROR_FUNCTION_NOT_FOUND, as pynvml raises for
        a symbol it cannot find."""
        self.gpus = gpus if gpus is not None else [FakeGpu(0)]
        self.driver_version = driver_version
        self.library_present = library_present
        self.before_call = before_call  # tests hook hangs and counters here
        self.missing = missing or set()
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
        if call in self.missing:
            _raise(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
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
    def nvmlDeviceGetName(self, handle: _Handle | _MigHandle) -> str:
        self._enter("nvmlDeviceGetName", handle.gpu)
        if isinstance(handle, _MigHandle):
            return f"{handle.gpu.name} MIG {handle.mig.profile}"  # as NVML names a MIG device
        return handle.gpu.name

    def nvmlDeviceGetUUID(self, handle: _Handle | _MigHandle) -> str:
        self._enter("nvmlDeviceGetUUID", handle.gpu)
        return handle.uuid if isinstance(handle, _MigHandle) else handle.gpu.uuid

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> Any:
        self._enter("nvmlDeviceGetPciInfo", handle.gpu)
        info = pynvml.nvmlPciInfo_t()
        info.busId = handle.gpu.pci_bus_id.encode()
        return info

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle | _MigHandle, version: int | None = None) -> Any:
        gpu = handle.gpu
        self._enter("nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo", gpu)
        if version and version != pynvml.nvmlMemory_v2:
            _raise(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if isinstance(handle, _MigHandle):  # the instance's own memory
            memory = handle.mig
            total, reserved, used = (
                memory.total_bytes,
                memory.reserved_bytes,
                min(memory.used_bytes, memory.total_bytes),
            )
        elif gpu.mig_devices is not None:
            # "In MIG mode, if device handle is provided, the API returns aggregate information, only if the caller
            # has appropriate privileges. Per-instance information can be queried by using specific MIG device
            # handles." (nvmlDeviceGetMemoryInfo)
            if not gpu.privileged:
                _raise(pynvml.NVML_ERROR_NO_PERMISSION)
            total, reserved = gpu.total_bytes, gpu.reserved_bytes
            used = min(sum(m.used_bytes for m in self._instances(gpu)), total)
        else:
            total, reserved, used = gpu.total_bytes, gpu.reserved_bytes, min(gpu.used_bytes, gpu.total_bytes)
        if version:
            return pynvml.c_nvmlMemory_v2_t(version, total, reserved, max(total - reserved - used, 0), used)
        # v1 counts the driver's reservation as used.
        used_v1 = min(used + reserved, total)
        return pynvml.c_nvmlMemory_t(total, total - used_v1, used_v1)

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle | _MigHandle) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", handle.gpu)
        if isinstance(handle, _MigHandle) or handle.gpu.mig_devices is not None:
            # "On MIG-enabled GPUs, querying device utilization rates is not currently supported."
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.c_nvmlUtilization_t(handle.gpu.utilization_percent, 0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle | _MigHandle) -> list[Any]:
        """pynvml's unversioned call: the _v3 one, a missing symbol turned into NVMLLibraryMismatchError."""
        try:
            return self.nvmlDeviceGetComputeRunningProcesses_v3(handle)
        except pynvml.NVMLError_FunctionNotFound:
            raise pynvml.NVMLLibraryMismatchError(
                "Unversioned function called and the pyNVML version does not match the NVML lib version."
            ) from None

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: _Handle | _MigHandle) -> list[Any]:
        return self._compute_processes("nvmlDeviceGetComputeRunningProcesses_v2", handle)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: _Handle | _MigHandle) -> list[Any]:
        return self._compute_processes("nvmlDeviceGetComputeRunningProcesses_v3", handle)

    def nvmlDeviceGetMPSComputeRunningProcesses_v3(self, handle: _Handle | _MigHandle) -> list[Any]:
        """The MPS clients: their own memory, where MPS runs (`mps_clients`); the compute list has the server."""
        self._enter("nvmlDeviceGetMPSComputeRunningProcesses_v3", handle.gpu)
        return [self._process_info(p, None) for p in handle.gpu.mps_clients]

    def _compute_processes(self, call: str, handle: _Handle | _MigHandle) -> list[Any]:
        gpu = handle.gpu
        self._enter(call, gpu)
        # The same answers as the unversioned name: a test's fault on it applies to every version.
        if "nvmlDeviceGetComputeRunningProcesses" in gpu.unsupported:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if "nvmlDeviceGetComputeRunningProcesses" in gpu.errors:
            _raise(gpu.errors["nvmlDeviceGetComputeRunningProcesses"])
        if isinstance(handle, _MigHandle):
            placed = [(p, handle.mig) for p in handle.mig.processes]
        elif gpu.mig_devices is not None:
            if not gpu.privileged:  # the same note as the memory's: an aggregate for the privileged only
                _raise(pynvml.NVML_ERROR_NO_PERMISSION)
            placed = [(p, m) for m in gpu.mig_devices for p in m.processes]
        else:
            placed = [(p, None) for p in gpu.processes]
        return [self._process_info(proc, mig) for proc, mig in placed]

    @staticmethod
    def _process_info(proc: FakeProcess, mig: FakeMigDevice | None) -> Any:
        not_available = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
        raw = pynvml.c_nvmlProcessInfo_v3_t(
            pid=proc.pid, usedGpuMemory=not_available if proc.used_bytes is None else proc.used_bytes,
            gpuInstanceId=mig.gpu_instance if mig else 0xFFFFFFFF,
            computeInstanceId=mig.compute_instance if mig else 0xFFFFFFFF,
        )  # fmt: skip
        obj = pynvml.nvmlStructToFriendlyObject(raw)
        if obj.usedGpuMemory == not_available:
            obj.usedGpuMemory = None  # what pynvml does for "not available"
        return obj

    # -- MIG ------------------------------------------------------------------------------
    @staticmethod
    def _instances(gpu: FakeGpu) -> list[FakeMigDevice]:
        """One per GPU instance (its compute instances share its memory)."""
        return list({m.gpu_instance: m for m in gpu.mig_devices or ()}.values())

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", handle.gpu)
        if not handle.gpu.mig_capable:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if handle.gpu.mig_devices is not None else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", handle.gpu)
        if not handle.gpu.mig_capable:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        # "Returns zero if MIG is not supported or enabled."
        return handle.gpu.max_mig_devices if handle.gpu.mig_devices is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _MigHandle:
        gpu = handle.gpu
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", gpu)
        if not gpu.mig_capable:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if gpu.mig_devices is None or not 0 <= index < gpu.max_mig_devices:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for mig in gpu.mig_devices or ():
            if mig.slot == index:
                return _MigHandle(gpu, mig)
        _raise(pynvml.NVML_ERROR_NOT_FOUND)  # the indices are sparse: no MIG device in this slot
        raise AssertionError("unreachable")

    def nvmlDeviceIsMigDeviceHandle(self, handle: _Handle | _MigHandle) -> int:
        self._enter("nvmlDeviceIsMigDeviceHandle", handle.gpu)
        return int(isinstance(handle, _MigHandle))

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle | _MigHandle) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId", handle.gpu)
        if not isinstance(handle, _MigHandle):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # not a MIG device handle
        return handle.mig.gpu_instance  # type: ignore[union-attr]

    def nvmlDeviceGetComputeInstanceId(self, handle: _Handle | _MigHandle) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId", handle.gpu)
        if not isinstance(handle, _MigHandle):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle.mig.compute_instance  # type: ignore[union-attr]

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: _MigHandle) -> _Handle:
        self._enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle.gpu)
        if not isinstance(handle, _MigHandle):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(handle.gpu)

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
