"""Plain data the sources produce and the metric renderer reads: one snapshot per collection."""

from __future__ import annotations

from dataclasses import dataclass, field

from oomguard.engines import EngineReading


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    name: str
    used_bytes: float | None  # None: NVML could not say (e.g. no permission, some vGPUs)


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int
    up: bool
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""
    total_bytes: float | None = None
    used_bytes: float | None = None
    free_bytes: float | None = None
    reserved_bytes: float | None = None
    utilization_ratio: float | None = None
    # None when the per-process query failed: an empty tuple means "no processes".
    processes: tuple[GpuProcess, ...] | None = None
    error: str = ""


@dataclass(frozen=True, slots=True)
class NvmlReading:
    up: bool
    driver_version: str = ""
    gpus: tuple[GpuReading, ...] = ()
    error: str = ""


@dataclass(frozen=True, slots=True)
class ProcessTree:
    """The engine's processes on this host: the listener and its children."""

    root_pid: int
    pids: frozenset[int]
    resident_bytes: float
    start_time_seconds: float
    cmdline: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TargetReading:
    name: str
    engine: str
    url: str
    gpus: tuple[int, ...]
    up: bool
    state: str  # one of TARGET_STATES
    scrape_duration_seconds: float
    health_status: int | None = None  # HTTP status of /health; None when no answer
    health_latency_seconds: float | None = None
    engine_reading: EngineReading | None = None
    error_kind: str = ""
    error: str = ""
    process: ProcessTree | None = None
    errors_total: dict[str, int] = field(default_factory=dict)
    restarts_total: int = 0
    last_restart_at: float | None = None
    startup_seconds: float | None = None  # the last start we watched, launch to first /health 200


TARGET_STATES = ("up", "loading", "down")
ERROR_KINDS = ("timeout", "refused", "http_status", "too_large", "parse", "other")
