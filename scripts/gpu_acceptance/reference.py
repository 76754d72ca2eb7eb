"""What the exporter's figures are compared with: `nvidia-smi` on a GPU, the stand-in's own truth without one.

Both give per GPU its index, UUID, total, used and reserved memory in MiB, as
`nvidia-smi --query-gpu=index,uuid,memory.total,memory.used,memory.reserved --format=csv,noheader,nounits`
does. The stand-in's GPUs and the allocating child's progress are files of the run's work folder: the stand-in
NVML (fake_exporter.py), the stand-in allocator (allocate.py) and this module read the same ones.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
GIB = 1024 * MIB
SMI_TIMEOUT = 30.0


@dataclass(frozen=True)
class RefGpu:
    index: int
    uuid: str
    total_mib: float
    used_mib: float
    reserved_mib: float | None


class SmiError(RuntimeError):
    pass


def _smi(fields: str) -> list[list[str]]:
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SmiError(f"nvidia-smi: {exc}") from exc
    if done.returncode != 0:
        raise SmiError(
            f"nvidia-smi --query-gpu={fields}: exit {done.returncode}: {(done.stdout + done.stderr).strip()}"
        )
    return [[cell.strip() for cell in line.split(",")] for line in done.stdout.strip().splitlines() if line.strip()]


def _mib(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


class NvidiaSmi:
    """nvidia-smi's memory figures; `memory.reserved` where the driver's nvidia-smi knows it (older ones refuse
    the field: asked without it from then on)."""

    def __init__(self) -> None:
        self.with_reserved = True

    def read(self) -> list[RefGpu]:
        if self.with_reserved:
            try:
                rows = _smi("index,uuid,memory.total,memory.used,memory.reserved")
            except SmiError:
                self.with_reserved = False
        if not self.with_reserved:
            rows = [[*row, ""] for row in _smi("index,uuid,memory.total,memory.used")]
        out = []
        for index, uuid, total, used, reserved in rows:
            total_mib, used_mib = _mib(total), _mib(used)
            if total_mib is None or used_mib is None:
                raise SmiError(f"nvidia-smi gave no memory figures for GPU {index}: {total!r}, {used!r}")
            out.append(RefGpu(int(index), uuid, total_mib, used_mib, _mib(reserved)))
        return out


def host_facts() -> dict[str, Any]:
    """Driver, names and persistence mode (NVML's cost depends on it): for the report, never a check."""
    facts: dict[str, Any] = {}
    try:
        rows = _smi("index,name,driver_version,persistence_mode,pci.bus_id")
        facts["gpus"] = [
            {"index": int(i), "name": n, "driver_version": d, "persistence_mode": p, "pci_bus_id": b}
            for i, n, d, p, b in rows
        ]
    except (SmiError, ValueError) as exc:
        facts["error"] = str(exc)
    return facts


# -- the stand-in ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeGpuSpec:
    total_bytes: int
    used_bytes: int  # what the GPU holds besides the allocating child
    reserved_bytes: int


@dataclass(frozen=True)
class FakeSpec:
    """The stand-in GPUs and where the allocating child says what it holds (allocate.py's state file)."""

    gpus: tuple[FakeGpuSpec, ...]
    child_state: str  # path of the child's state file
    child_gpu: int = 0  # the GPU the child allocates on

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> FakeSpec:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return cls(tuple(FakeGpuSpec(**g) for g in raw["gpus"]), raw["child_state"], raw["child_gpu"])


def fake_uuid(index: int) -> str:
    """The stand-in NVML's UUID of GPU `index` (simulate/fake_nvml.py's FakeGpu.uuid)."""
    return f"GPU-00000000-0000-4000-8000-{index:012d}"


def read_state(path: str | Path) -> dict[str, Any]:
    """The allocating child's state file; {} before it writes one (or while it is replaced)."""
    try:
        return dict(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


def write_state(path: str | Path, state: dict[str, Any]) -> None:
    """Replaced whole (rename), so a reader never sees half of it."""
    tmp = Path(f"{path}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state), encoding="utf-8")
    tmp.replace(path)


def child_holds(state: dict[str, Any]) -> int:
    """Bytes the child holds on its GPU by its own word: its allocations and its context, while it lives."""
    if state.get("phase") not in ("allocating", "oom"):
        return 0
    pid = state.get("pid")
    if not isinstance(pid, int) or not _alive(pid):
        return 0
    return int(state.get("allocated_bytes", 0)) + int(state.get("context_bytes", 0))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class FakeTruth:
    """The stand-in's GPUs as nvidia-smi would show them: the same figures the stand-in NVML returns."""

    def __init__(self, spec: FakeSpec) -> None:
        self.spec = spec

    def read(self) -> list[RefGpu]:
        held = child_holds(read_state(self.spec.child_state))
        out = []
        for index, gpu in enumerate(self.spec.gpus):
            used = gpu.used_bytes + (held if index == self.spec.child_gpu else 0)
            used = min(used, gpu.total_bytes)  # as the stand-in NVML caps it
            out.append(RefGpu(index, fake_uuid(index), gpu.total_bytes / MIB, used / MIB, gpu.reserved_bytes / MIB))
        return out
