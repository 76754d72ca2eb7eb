"""What the run reads through NVML itself (pynvml, or the stand-in): which GPU the child may fill, and MIG as found.

Only reads: no call here sets a mode, a clock, a limit or anything else on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class GpuFact:
    index: int
    uuid: str
    name: str
    mig: str  # "enabled", "disabled", "not supported", or why it could not be read
    processes: tuple[int, ...] | None  # compute processes' pids; None when NVML cannot list them


def gpu_facts(lib: Any) -> tuple[str, list[GpuFact]]:
    """(driver version, each GPU); `lib` is pynvml or the stand-in, initialised here and shut down again."""
    lib.nvmlInit()
    try:
        try:
            driver = _text(lib.nvmlSystemGetDriverVersion())
        except lib.NVMLError:
            driver = ""
        facts = []
        for index in range(lib.nvmlDeviceGetCount()):
            handle = lib.nvmlDeviceGetHandleByIndex(index)
            try:
                pids: tuple[int, ...] | None = tuple(
                    int(p.pid) for p in lib.nvmlDeviceGetComputeRunningProcesses(handle)
                )
            except lib.NVMLError:
                pids = None
            facts.append(
                GpuFact(
                    index,
                    _text(lib.nvmlDeviceGetUUID(handle)),
                    _text(lib.nvmlDeviceGetName(handle)),
                    mig_mode(lib, handle)[0],
                    pids,
                )
            )
        return driver, facts
    finally:
        lib.nvmlShutdown()


def mig_mode(lib: Any, handle: Any) -> tuple[str, str]:
    """(current, pending) MIG mode, in words."""
    if not hasattr(lib, "nvmlDeviceGetMigMode"):
        return "not read (this NVML has no nvmlDeviceGetMigMode)", ""
    try:
        current, pending = lib.nvmlDeviceGetMigMode(handle)
    except lib.NVMLError_NotSupported:
        return "not supported", ""
    except lib.NVMLError as exc:
        return f"not read ({exc})", ""
    words = {lib.NVML_DEVICE_MIG_ENABLE: "enabled", lib.NVML_DEVICE_MIG_DISABLE: "disabled"}
    return words.get(current, str(current)), words.get(pending, str(pending))


def mig_instances(lib: Any) -> dict[int, dict[str, Any]]:
    """Per GPU: its MIG mode and, where it is on, each instance NVML lists (UUID, ids, memory)."""
    lib.nvmlInit()
    try:
        out: dict[int, dict[str, Any]] = {}
        for index in range(lib.nvmlDeviceGetCount()):
            handle = lib.nvmlDeviceGetHandleByIndex(index)
            current, pending = mig_mode(lib, handle)
            gpu: dict[str, Any] = {"mode": current, "pending": pending, "instances": []}
            out[index] = gpu
            if current != "enabled":
                continue
            try:
                slots = lib.nvmlDeviceGetMaxMigDeviceCount(handle)
            except lib.NVMLError as exc:
                gpu["error"] = f"nvmlDeviceGetMaxMigDeviceCount: {exc}"
                continue
            for slot in range(slots):
                try:
                    mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                except lib.NVMLError_NotFound:
                    continue  # the indices are sparse
                except lib.NVMLError as exc:
                    gpu["instances"].append({"slot": slot, "error": str(exc)})
                    continue
                instance: dict[str, Any] = {"slot": slot}
                for key, call in (
                    ("uuid", lambda h=mig: _text(lib.nvmlDeviceGetUUID(h))),
                    ("gpu_instance_id", lambda h=mig: int(lib.nvmlDeviceGetGpuInstanceId(h))),
                    ("compute_instance_id", lambda h=mig: int(lib.nvmlDeviceGetComputeInstanceId(h))),
                    ("memory", lambda h=mig: lib.nvmlDeviceGetMemoryInfo(h)),
                ):
                    try:
                        instance[key] = call()
                    except lib.NVMLError as exc:
                        instance[f"{key}_error"] = str(exc)
                memory = instance.pop("memory", None)
                if memory is not None:
                    instance["total_mib"] = memory.total / 2**20
                    instance["used_mib"] = memory.used / 2**20
                gpu["instances"].append(instance)
        return out
    finally:
        lib.nvmlShutdown()
