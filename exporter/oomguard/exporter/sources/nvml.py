"""GPU memory per GPU and per process, through NVML (`pynvml` from nvidia-ml-py).

Blocking: `NvmlSource.read` runs in a worker thread, never on the event loop.
Errors stay where they happen: a call NVML does not support drops that one
series (and is not asked again), a lost GPU is marked down while the others are
read, and a missing driver leaves `up=False` with one log line.

MIG: a GPU in MIG mode is read as its GPU instances, each a GPU of its own (`gpu`
label "<index>/<GI>"): its memory and processes through its MIG device handle, as
NVML defines them (the parent's figures are an aggregate only a privileged caller
gets, its utilization is not supported). Its compute instances share its memory:
one reading per GPU instance, their processes together. The MIG devices are found
again every MIG_RESCAN_SECONDS (a layout changes only with no process on the GPU),
and at once when one of them stops answering.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import psutil

from oomguard.exporter.model import GpuProcess, GpuReading, GpuReadings, MigInstance, gpu_label

log = logging.getLogger(__name__)

# How long to wait before calling nvmlInit again after it failed (driver missing,
# not loaded yet): retrying on every scrape costs a dlopen each time.
INIT_RETRY_SECONDS = 60.0
# How often a GPU's MIG mode and MIG devices are looked up again: up to 7 handle look-ups a GPU, most of them
# NOT_FOUND (the slots are sparse), are not repeated at every scrape.
MIG_RESCAN_SECONDS = 60.0


@dataclass
class _Gpu:
    """What never changes for a GPU: fetched once, kept until the GPU is lost."""

    handle: Any
    uuid: str
    name: str
    pci_bus_id: str


@dataclass
class _Mig:
    """A GPU instance of a GPU in MIG mode: its MIG devices (one per compute instance) and what never changes."""

    handles: list[Any]
    uuid: str
    name: str
    instance: MigInstance


@dataclass
class _MigLayout:
    enabled: bool
    instances: list[_Mig]
    read_at: float


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlSource:
    def __init__(
        self,
        lib: ModuleType | Any,
        *,
        per_process: bool = True,
        node: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`node`: the Kubernetes node this host is (the `node` label of its GPUs), "" outside Kubernetes."""
        self._lib = lib
        self._node = node
        self._per_process = per_process
        self._clock = clock
        self._lock = threading.Lock()  # reads may overlap when one times out
        self._initialised = False
        self._next_init_attempt = 0.0
        self._init_error = ""
        self._driver_version = ""
        self._gpus: dict[int, _Gpu] = {}
        self._unsupported: set[tuple[int | str, str]] = set()
        self._memory_v1_only: set[int | str] = set()
        self._process_names: dict[int, str] = {}
        self._mig: dict[int, _MigLayout] = {}
        self._processes_v2_only = False  # a driver without the _v3 process calls (before R510)

    @property
    def lib(self) -> ModuleType | Any:
        return self._lib

    # -- lifecycle -------------------------------------------------------------------------
    def _ensure_init(self) -> bool:
        if self._initialised:
            return True
        now = self._clock()
        if now < self._next_init_attempt:
            return False
        try:
            self._lib.nvmlInit()
        except self._lib.NVMLError as exc:
            self._next_init_attempt = now + INIT_RETRY_SECONDS
            message = f"NVML could not start ({exc})"
            if isinstance(exc, self._lib.NVMLError_LibraryNotFound):
                message += (
                    ": no NVIDIA driver on this host. GPU metrics are off and "
                    "oomguard_nvml_up is 0; engine metrics are still served. Install the "
                    "driver (or mount libnvidia-ml into the container), or pass "
                    "--no-collector.nvml to silence this."
                )
            elif isinstance(exc, self._lib.NVMLError_DriverNotLoaded):
                message += (
                    ": the NVIDIA kernel module is not loaded (nvidia-smi says the same). GPU metrics are off and "
                    "oomguard_nvml_up is 0 until it is; tried again every minute."
                )
            elif isinstance(exc, self._lib.NVMLError_NoPermission):
                message += ": no permission to open the GPU devices (/dev/nvidia*): run with access to them"
            if message != self._init_error:
                log.warning(message)
            self._init_error = message
            return False
        self._initialised = True
        self._init_error = ""
        try:
            self._driver_version = _text(self._lib.nvmlSystemGetDriverVersion())
        except self._lib.NVMLError:
            self._driver_version = ""
        log.info("NVML started, driver %s", self._driver_version or "unknown")
        return True

    def close(self) -> None:
        with self._lock:
            if self._initialised:
                try:
                    self._lib.nvmlShutdown()
                except self._lib.NVMLError as exc:
                    log.debug("nvmlShutdown: %s", exc)
                self._initialised = False

    # -- reading ---------------------------------------------------------------------------
    def read(self) -> GpuReadings:
        with self._lock:
            if not self._ensure_init():
                return GpuReadings(up=False, error=self._init_error)
            try:
                count = self._lib.nvmlDeviceGetCount()
            except self._lib.NVMLError as exc:
                return GpuReadings(up=False, driver_version=self._driver_version, error=f"nvmlDeviceGetCount: {exc}")
            gpus = tuple(g for index in range(count) for g in self._read_device(index))
            seen = {p.pid for g in gpus for p in g.processes or ()}
            for pid in set(self._process_names) - seen:
                del self._process_names[pid]
            return GpuReadings(up=True, driver_version=self._driver_version, gpus=gpus)

    def _static(self, index: int) -> _Gpu:
        gpu = self._gpus.get(index)
        if gpu is None:
            lib = self._lib
            handle = lib.nvmlDeviceGetHandleByIndex(index)
            gpu = _Gpu(
                handle=handle,
                uuid=_text(lib.nvmlDeviceGetUUID(handle)),
                name=_text(lib.nvmlDeviceGetName(handle)),
                pci_bus_id=_text(self._optional(index, "pci", lambda: lib.nvmlDeviceGetPciInfo(handle).busId) or ""),
            )
            self._gpus[index] = gpu
        return gpu

    def _optional(self, index: int | str, call: str, fn: Callable[[], Any]) -> Any:
        """Run one NVML call; None when unsupported (remembered, so it is not asked again). `index`: the GPU's, or a
        MIG instance's label."""
        if (index, call) in self._unsupported:
            return None
        try:
            return fn()
        except (self._lib.NVMLError_NotSupported, self._lib.NVMLError_FunctionNotFound):
            self._unsupported.add((index, call))
            return None

    # -- MIG -------------------------------------------------------------------------------
    def _read_device(self, index: int) -> list[GpuReading]:
        """The GPU, or in MIG mode its GPU instances."""
        lib = self._lib
        try:
            layout = self._mig_layout(index)
        except lib.NVMLError_GpuIsLost:
            layout = None  # said by _read_gpu, which finds it lost too
        except lib.NVMLError as exc:
            log.warning("GPU %d: its MIG devices could not be listed: %s", index, exc)
            layout = None
        if layout is None or not layout.enabled:
            return [self._read_gpu(index)]
        if not layout.instances:
            # MIG mode with no instance: nothing can run on it, and its parent's figures are not the caller's to read.
            return []
        readings = [self._read_instance(index, mig) for mig in layout.instances]
        if any(r.error for r in readings):
            self._mig.pop(index, None)  # an instance destroyed or replaced: list them again next time
        return readings

    def _mig_layout(self, index: int) -> _MigLayout | None:
        lib = self._lib
        now = self._clock()
        layout = self._mig.get(index)
        if layout is not None and now - layout.read_at < MIG_RESCAN_SECONDS:
            return layout
        gpu = self._static(index)
        mode = self._optional(index, "mig_mode", lambda: lib.nvmlDeviceGetMigMode(gpu.handle))
        if mode is None or mode[0] != lib.NVML_DEVICE_MIG_ENABLE:
            layout = _MigLayout(False, [], now)
        else:
            layout = _MigLayout(True, self._mig_instances(index, gpu), now)
            if self._mig.get(index) is None or [m.uuid for m in self._mig[index].instances] != [
                m.uuid for m in layout.instances
            ]:
                names = (f"{gpu_label(index, m.instance.gpu_instance)} {m.instance.profile}" for m in layout.instances)
                log.info("GPU %d is in MIG mode: read as %d GPU instances (%s)", index, len(layout.instances),
                         ", ".join(names))  # fmt: skip
        self._mig[index] = layout
        return layout

    def _mig_instances(self, index: int, gpu: _Gpu) -> list[_Mig]:
        lib = self._lib
        by_gi: dict[int, _Mig] = {}
        for slot in range(lib.nvmlDeviceGetMaxMigDeviceCount(gpu.handle)):
            try:
                handle = lib.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
            except lib.NVMLError_NotFound:
                continue  # the slots are sparse
            gi = int(lib.nvmlDeviceGetGpuInstanceId(handle))
            ci = int(lib.nvmlDeviceGetComputeInstanceId(handle))
            if gi in by_gi:  # another compute instance of the same GPU instance: its memory, its processes
                by_gi[gi].handles.append(handle)
                by_gi[gi].instance = MigInstance(gpu.uuid, gi, None, by_gi[gi].instance.profile)
                continue
            name = _text(lib.nvmlDeviceGetName(handle))
            by_gi[gi] = _Mig(
                handles=[handle],
                uuid=_text(lib.nvmlDeviceGetUUID(handle)),
                name=name,
                instance=MigInstance(gpu.uuid, gi, ci, name.rpartition(" MIG ")[2] if " MIG " in name else ""),
            )
        return [by_gi[gi] for gi in sorted(by_gi)]

    def _read_instance(self, index: int, mig: _Mig) -> GpuReading:
        lib = self._lib
        label = gpu_label(index, mig.instance.gpu_instance)
        parent = self._gpus.get(index)
        base = GpuReading(
            index=index, up=True, uuid=mig.uuid, name=mig.name, pci_bus_id=parent.pci_bus_id if parent else "",
            node=self._node, mig=mig.instance,
        )  # fmt: skip
        try:
            memory = self._memory(label, mig.handles[0])
            processes: tuple[GpuProcess, ...] | None = None
            if self._per_process:
                found = [self._processes(label, h) for h in mig.handles]
                processes = None if any(f is None for f in found) else tuple(
                    {p.pid: p for f in found for p in f or ()}.values()
                )  # fmt: skip
        except lib.NVMLError_GpuIsLost as exc:
            self._gpus.pop(index, None)
            self._mig.pop(index, None)
            log.error("GPU %d is lost (%s): marked down; check `nvidia-smi` and dmesg for XID 79", index, exc)
            return GpuReading(index=index, up=False, uuid=mig.uuid, name=mig.name, error=str(exc), node=self._node,
                              mig=mig.instance)  # fmt: skip
        except lib.NVMLError as exc:
            log.warning("GPU %s (MIG %s): NVML call failed: %s", label, mig.instance.profile, exc)
            return replace(base, error=str(exc))
        return replace(
            base,
            total_bytes=float(memory.total) if memory else None,
            used_bytes=float(memory.used) if memory else None,
            free_bytes=float(memory.free) if memory else None,
            reserved_bytes=float(memory.reserved) if memory is not None and hasattr(memory, "reserved") else None,
            processes=processes,
        )

    def _read_gpu(self, index: int) -> GpuReading:
        lib = self._lib
        try:
            gpu = self._static(index)
            memory = self._memory(index, gpu.handle)
            utilization = self._optional(index, "utilization", lambda: lib.nvmlDeviceGetUtilizationRates(gpu.handle))
            processes = self._processes(index, gpu.handle) if self._per_process else None
        except lib.NVMLError_GpuIsLost as exc:
            # The handle of a GPU that fell off the bus is useless: look it up afresh next time.
            self._gpus.pop(index, None)
            log.error("GPU %d is lost (%s): marked down; check `nvidia-smi` and dmesg for XID 79", index, exc)
            return GpuReading(index=index, up=False, error=str(exc), node=self._node)
        except lib.NVMLError as exc:
            log.warning("GPU %d: NVML call failed: %s", index, exc)
            cached = self._gpus.get(index)
            return GpuReading(
                index=index,
                up=True,
                uuid=cached.uuid if cached else "",
                name=cached.name if cached else "",
                pci_bus_id=cached.pci_bus_id if cached else "",
                error=str(exc),
                node=self._node,
            )
        total = float(memory.total) if memory else None
        used = float(memory.used) if memory else None
        return GpuReading(
            index=index,
            up=True,
            uuid=gpu.uuid,
            name=gpu.name,
            pci_bus_id=gpu.pci_bus_id,
            total_bytes=total,
            used_bytes=used,
            free_bytes=float(memory.free) if memory else None,
            reserved_bytes=float(memory.reserved) if memory is not None and hasattr(memory, "reserved") else None,
            utilization_ratio=utilization.gpu / 100.0 if utilization is not None else None,
            processes=processes,
            node=self._node,
        )

    def _memory(self, index: int | str, handle: Any) -> Any:
        lib = self._lib
        if index not in self._memory_v1_only:
            try:
                return lib.nvmlDeviceGetMemoryInfo(handle, version=lib.nvmlMemory_v2)
            except (lib.NVMLError_NotSupported, lib.NVMLError_FunctionNotFound, lib.NVMLError_ArgumentVersionMismatch):
                # Older drivers lack the v2 call: v1 has no `reserved`.
                self._memory_v1_only.add(index)
        return self._optional(index, "memory", lambda: lib.nvmlDeviceGetMemoryInfo(handle))

    def _processes(self, index: int | str, handle: Any) -> tuple[GpuProcess, ...] | None:
        """The compute processes, and MPS clients where MPS runs (their memory is listed there, not in the compute
        list, which has the MPS server); each pid once. None when NVML cannot say (no permission, unsupported, a
        driver without the call, or a list that kept growing between pynvml's two calls)."""
        lib = self._lib
        try:
            entries = self._optional(index, "processes", lambda: self._compute_processes(handle))
            if entries is None:
                return None
            clients = self._optional(index, "mps", lambda: lib.nvmlDeviceGetMPSComputeRunningProcesses_v3(handle))
        except (lib.NVMLError_NoPermission, lib.NVMLError_InsufficientSize):
            return None
        by_pid = {int(e.pid): e for e in entries}
        for e in clients or ():
            by_pid.setdefault(int(e.pid), e)
        return tuple(
            GpuProcess(pid=pid, name=self._process_name(pid), used_bytes=_process_memory(e.usedGpuMemory))
            for pid, e in by_pid.items()
        )

    def _compute_processes(self, handle: Any) -> list[Any]:
        """The versioned calls, newest first: pynvml's unversioned one turns a driver without `_v3` (before R510)
        into NVMLLibraryMismatchError, which is no NVMLError. A driver without `_v2` either (before R450) raises
        FunctionNotFound, taken as unsupported."""
        lib = self._lib
        if not self._processes_v2_only:
            try:
                return lib.nvmlDeviceGetComputeRunningProcesses_v3(handle)
            except lib.NVMLError_FunctionNotFound:
                self._processes_v2_only = True
        return lib.nvmlDeviceGetComputeRunningProcesses_v2(handle)

    def _process_name(self, pid: int) -> str:
        name = self._process_names.get(pid)
        if name is None:
            try:
                name = psutil.Process(pid).name()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                # In a container without the host PID namespace the pid is not ours to see.
                name = ""
            self._process_names[pid] = name
        return name


def _process_memory(value: Any) -> float | None:
    # NVML reports NVML_VALUE_NOT_AVAILABLE (all ones) and pynvml maps it to None.
    if value is None or value >= (1 << 64) - 1:
        return None
    return float(value)
