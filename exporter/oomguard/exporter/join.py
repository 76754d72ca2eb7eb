"""The joins: each target with its GPUs, and each GPU with the engines that reserve it.

Computed once per snapshot (and per trend tick) here, and nowhere else: the exposition
and the trend sampler read the same figures.

An engine such as vLLM reserves its memory at start: its processes hold
gpu_memory_utilization x total of every GPU it runs on, idle or busy. What can still
grow on such a GPU, and run it out of memory, is the use beyond the reservations: the
engines' own beyond theirs (activations, late CUDA graphs, NCCL buffers, a leak) and
every other process. `GpuMemory.headroom_used_ratio` judges that against the headroom
the reservations leave; docs/runbooks.md works the numbers.

The reservation is the engine's own (its /metrics, or SGLang's /server_info) once it reports
one; until then (an engine loading or warming up refuses /metrics for minutes, with its KV
cache already allocated) it is the one it was told: its setting from its command line or its
pod's container args (`TargetReading.settings`, RESERVATION_SETTINGS). `reservation` is that
one rule, for both joins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from oomguard.exporter.model import (
    GpuKey,
    GpuMemory,
    GpuReading,
    GpuReadings,
    PodRef,
    ProcessTree,
    TargetMemory,
    TargetReading,
    gpu_order,
)

# The settings that are a share of each GPU's total taken at start, as the engine reports it (vLLM, SGLang).
RESERVATION_SETTINGS = ("gpu_memory_utilization", "mem_fraction_static")
# The states in which a target's processes hold what they were told: loading (the pool is allocated before the
# engine serves) and up. A down engine's memory is gone with it, or its state unknown: no reservation assumed.
_TOLD_STATES = ("loading", "up")


def reservation(t: TargetReading, *, awake: bool = True) -> float | None:
    """The target's reservation ratio: the engine's own once it reports one, else its setting as started while it
    loads or is up. `awake`: None for an engine asleep (its memory released), as the engine's own value is."""
    reading = t.engine_reading
    if reading is not None and reading.memory_utilization_ratio is not None:
        return reading.reservation_ratio if awake else reading.memory_utilization_ratio
    if awake and reading is not None and reading.asleep:
        return None
    if t.state not in _TOLD_STATES:
        return None
    told = [s.value for name in RESERVATION_SETTINGS if (s := t.settings.get(name)) is not None]
    # Only a share of the total: a value outside (0, 1] is no reservation (the engine would refuse it too).
    return told[0] if told and 0 < told[0] <= 1 else None


@dataclass(frozen=True, slots=True)
class GpuClaim:
    """What tells a target's GPUs among those read: its configured indices on its node, else the GPUs whose
    processes (NVML's lists, on its node) are its, else those dcgm-exporter labels with its pod."""

    configured: tuple[int, ...] = ()
    process: ProcessTree | None = None
    node: str = ""  # the node it runs on: its pod's, else the exporter's own
    pod: tuple[str, str] | None = None  # (namespace, name) of a discovered pod
    # An engine spanning pods: its workers' (node, (namespace, name)), whose GPUs are the target's too.
    members: tuple[tuple[str, tuple[str, str]], ...] = ()

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes its GPUs are on: its own, then its workers'."""
        return tuple(dict.fromkeys((self.node, *(node for node, _ in self.members))))


def claim(configured: tuple[int, ...], process: ProcessTree | None, pod: PodRef | None, local_node: str) -> GpuClaim:
    """A target's claim: a pod on the node its object names, any other target on the exporter's node."""
    if pod is None:
        return GpuClaim(configured, process, local_node)
    members = tuple((m.node or local_node, (m.namespace, m.name)) for m in pod.members)
    return GpuClaim(configured, process, pod.node or local_node, (pod.namespace, pod.name), members)


def claim_gpus(claim: GpuClaim, nodes: Mapping[str, Mapping[GpuKey, GpuReading]]) -> Mapping[GpuKey, GpuReading]:
    """The GPUs of the nodes a claim is on (`by_node`'s), which `target_gpus` chooses from."""
    if not claim.members:
        return nodes.get(claim.node, {})
    return {k: g for node in claim.nodes for k, g in nodes.get(node, {}).items()}


def target_gpus(claim: GpuClaim, gpus: Mapping[GpuKey, GpuReading]) -> list[GpuKey]:
    """The target's GPUs among `gpus`: those configured, else those NVML lists its processes on, else those
    dcgm-exporter names its pod on."""
    if claim.configured:
        # A configured index is its GPU, or on a GPU in MIG mode every instance of it (`gpus: [0]` still means GPU 0).
        wanted = {str(i) for i in claim.configured}
        on_node = [k for k in gpus if k[0] == claim.node and k[1].partition("/")[0] in wanted]
        return sorted(on_node, key=gpu_order)
    process, pod = claim.process, claim.pod
    nodes = claim.nodes
    mine = {k: g for k, g in gpus.items() if k[0] in nodes}  # pids and pods are of their nodes (see by_node)
    found = []
    if process is not None:
        # The node mode's: the pids are this host's, the leader's and the workers' on it alike.
        found = [k for k, g in mine.items() if any(p.pid in process.pids for p in g.processes or ())]
    if not found and pod is not None:
        pods = {(claim.node, pod), *claim.members}
        found = [k for k, g in mine.items() if any((k[0], p) in pods for p in g.pods)]
    return sorted(found, key=gpu_order)


def _own_by_gpu(process: ProcessTree | None, measured: list[GpuReading]) -> dict[GpuKey, float] | None:
    """The target's own processes' use on each of its GPUs; None when NVML's list cannot tell."""
    if process is None or any(g.processes is None for g in measured):
        return None
    own = {g.key: 0.0 for g in measured}
    matched = False
    for g in measured:
        for p in g.processes or ():
            if p.pid in process.pids:
                own[g.key] += p.used_bytes or 0.0
                matched = True
    # No match at all: the exporter sees other pids than NVML (a container without the
    # host PID namespace), so "0 bytes" would be a lie.
    return own if matched else None


def join(
    claim: GpuClaim, gpus: Mapping[GpuKey, GpuReading], memory_utilization_ratio: float | None = None
) -> TargetMemory:
    """`gpus`: the GPUs that are up, by key. The target is judged by its worst GPU."""
    mine = tuple(target_gpus(claim, gpus))
    measured = [gpus[k] for k in mine if gpus[k].measured]
    if not measured:
        return TargetMemory(mine, None, None, None, None, None)
    worst = max(measured, key=lambda g: (g.used_bytes or 0.0) / (g.total_bytes or 1.0))
    own_by_gpu = _own_by_gpu(claim.process, measured)
    own = sum(own_by_gpu.values()) if own_by_gpu is not None else None
    budget = over = None
    if memory_utilization_ratio is not None:
        budget = memory_utilization_ratio * (worst.total_bytes or 0.0)
        over = max(
            (own_by_gpu[g.key] if own_by_gpu is not None else g.used_bytes or 0.0)
            - memory_utilization_ratio * (g.total_bytes or 0.0)
            for g in measured
        )
    return TargetMemory(mine, worst.used_bytes, worst.total_bytes, own, budget, over, own_by_gpu)


def join_gpu(gpu: GpuReading, engines: list[tuple[float, dict[GpuKey, float] | None]]) -> GpuMemory | None:
    """One GPU with the engines that reserve it: (reservation ratio, own use by GPU or None) each."""
    if not engines or not gpu.measured:
        return None
    total, used = gpu.total_bytes or 0.0, gpu.used_bytes or 0.0
    reserved = sum(ratio * total for ratio, _ in engines)
    engine_used = over = other = None
    if all(own is not None for _, own in engines):
        owns = [(ratio, own[gpu.key]) for ratio, own in engines if own is not None]
        engine_used = sum(mine for _, mine in owns)
        over = sum(max(0.0, mine - ratio * total) for ratio, mine in owns)
        other = max(0.0, used - engine_used)
        unreserved = over + other
    else:
        # Whose bytes are whose is unknown: everything above the reservations may grow.
        unreserved = max(0.0, used - reserved)
    headroom = total - reserved
    # Reservations that take the whole GPU: anything else in use is already too much.
    ratio = unreserved / headroom if headroom > 0 else float(unreserved > 0)
    return GpuMemory(gpu.key, total, used, reserved, engine_used, over, other, unreserved, ratio)


def up_gpus(gpus: tuple[GpuReading, ...]) -> dict[GpuKey, GpuReading]:
    return {g.key: g for g in gpus if g.up}


def by_node(gpus: Mapping[GpuKey, GpuReading]) -> dict[str, dict[GpuKey, GpuReading]]:
    """The GPUs of each node: a target's are all on its node, so each target is joined with its node's only (the
    cluster mode's 500 targets with 8 GPUs each, not with 800)."""
    out: dict[str, dict[GpuKey, GpuReading]] = {}
    for key, gpu in gpus.items():
        out.setdefault(key[0], {})[key] = gpu
    return out


def join_targets(
    readings: GpuReadings | None, targets: Iterable[TargetReading], local_node: str = ""
) -> dict[str, TargetMemory]:
    """Every target of a collection joined with the GPUs the GPU source read (none when it did not). `local_node`: the
    exporter's own node, where a target that is no pod runs."""
    nodes = by_node(up_gpus(readings.gpus)) if readings is not None else {}
    out = {}
    for t in targets:
        c = claim(t.gpus, t.process, t.pod, local_node)
        out[t.name] = join(c, claim_gpus(c, nodes), reservation(t, awake=False))
    return out


def join_gpus(
    readings: GpuReadings | None, targets: Iterable[TargetReading], memory: Mapping[str, TargetMemory]
) -> dict[GpuKey, GpuMemory]:
    """Every GPU on which an awake engine with a known reservation (`reservation`) runs, with its engines."""
    if readings is None:
        return {}
    engines_on: dict[GpuKey, list[tuple[float, dict[GpuKey, float] | None]]] = {}
    for t in targets:
        ratio = reservation(t)
        joined = memory.get(t.name)
        if ratio is None or joined is None:
            continue
        for key in joined.gpus:
            engines_on.setdefault(key, []).append((ratio, joined.own_by_gpu))
    out = {}
    for gpu in readings.gpus:
        if gpu.up and (joined_gpu := join_gpu(gpu, engines_on.get(gpu.key, []))) is not None:
            out[gpu.key] = joined_gpu
    return out
