"""The join of a target with its GPUs: which GPUs, how full, its own share, its budget.

Computed once per snapshot (and per trend tick) here, and nowhere else: the exposition
and the trend sampler read the same figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from oomguard.model import GpuReading, NvmlReading, ProcessTree, TargetMemory, TargetReading


def target_gpus(configured: tuple[int, ...], process: ProcessTree | None, gpus: Mapping[int, GpuReading]) -> list[int]:
    """The target's GPUs among `gpus`: those configured, else those NVML lists its processes on."""
    if configured:
        return [i for i in configured if i in gpus]
    if process is None:
        return []
    return sorted(i for i, g in gpus.items() if any(p.pid in process.pids for p in g.processes or ()))


def join(
    configured: tuple[int, ...],
    process: ProcessTree | None,
    gpus: Mapping[int, GpuReading],
    memory_utilization_ratio: float | None = None,
) -> TargetMemory:
    """`gpus`: the GPUs that are up, by index."""
    mine = tuple(target_gpus(configured, process, gpus))
    measured = [gpus[i] for i in mine if gpus[i].measured]
    if not measured:
        return TargetMemory(mine, None, None, None, None, None)
    total = sum(g.total_bytes or 0.0 for g in measured)
    used = sum(g.used_bytes or 0.0 for g in measured)
    own: float | None = None
    if process is not None and all(g.processes is not None for g in measured):
        mine_procs = [p for g in measured for p in g.processes or () if p.pid in process.pids]
        # No match at all: the exporter sees other pids than NVML (a container without the
        # host PID namespace), so "0 bytes" would be a lie; fall back to the whole GPUs.
        if mine_procs:
            own = sum(p.used_bytes or 0.0 for p in mine_procs)
    budget = over = None
    if memory_utilization_ratio is not None:
        budget = memory_utilization_ratio * total
        over = (own if own is not None else used) - budget
    return TargetMemory(mine, used, total, own, budget, over)


def up_gpus(gpus: tuple[GpuReading, ...]) -> dict[int, GpuReading]:
    return {g.index: g for g in gpus if g.up}


def join_targets(nvml: NvmlReading | None, targets: Iterable[TargetReading]) -> dict[str, TargetMemory]:
    """Every target of a collection joined with the GPUs NVML read (none when it did not)."""
    gpus = up_gpus(nvml.gpus) if nvml is not None else {}
    return {
        t.name: join(t.gpus, t.process, gpus, t.engine_reading.memory_utilization_ratio if t.engine_reading else None)
        for t in targets
    }
