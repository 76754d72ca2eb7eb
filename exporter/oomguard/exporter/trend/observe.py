"""One tick of the trend sampler: read the GPUs and the engines' processes, join, observe."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from oomguard.exporter.join import GpuClaim, by_node, claim, claim_gpus, target_gpus, up_gpus
from oomguard.exporter.model import GpuKey, GpuReadings, Observation, ProcessTree, TargetView, TrendKey
from oomguard.exporter.sources.gpu_source import GpuSource
from oomguard.exporter.sources.process_lookup import ProcessLookup
from oomguard.exporter.trend.sampler import Joins, TrendTracker, observations

# A tick this soon after a scrape reuses the scrape's lookup of the engines' processes.
PROCESS_LOOKUP_MAX_AGE = 1.0


class TrendObserver:
    """A sleeping engine (vLLM's sleep mode) has released its memory: its own series are not
    sampled while it sleeps, and on waking its series and its GPUs' start afresh, so that the
    drop and the jump back are not taken for a restart and a spike.

    A loading engine fills its GPUs as it loads: a climb by design, hours long for a large model. Its
    series are not sampled while it loads, nor are its GPUs' where no engine that is up shares them;
    once it is up they start afresh, from the memory it holds when serving."""

    def __init__(
        self,
        gpu_source: GpuSource | None,
        processes: ProcessLookup,
        targets: Callable[[], Sequence[TargetView]],
        tracker: TrendTracker,
        pod_processes: Callable[[GpuReadings | None], Awaitable[dict[str, ProcessTree]]] | None = None,
        local_node: str = "",
    ) -> None:
        """`targets`: the targets as they stand (sources/target_set.py `views`); `pod_processes`: discovered pods'
        processes by target name (sources/kubernetes/), where there are any; `local_node`: the exporter's node."""
        self.gpu_source = gpu_source
        self.local_node = local_node
        self.pod_processes = pod_processes
        self.processes = processes
        self.targets = targets
        self.tracker = tracker
        self._asleep: set[str] = set()
        self._loading: set[str] = set()
        self.joins = Joins()  # kept from one tick to the next: a join whose figures read the same is not computed again

    async def observe(self) -> dict[TrendKey, Observation]:
        """GPUs, and each target's GPUs and local processes."""
        gpus: GpuReadings | None = None
        if self.gpu_source is not None:
            try:
                gpus = await self.gpu_source.read()
            except TimeoutError:
                gpus = None  # the GPU series miss this tick; the sampler goes on
        trees = await self.processes.get(max_age=PROCESS_LOOKUP_MAX_AGE)
        pods = await self.pod_processes(gpus) if self.pod_processes is not None else {}
        views = self.targets()
        node = self.local_node
        targets: list[tuple[str, GpuClaim]] = [
            (v.name, claim(v.gpus, trees.get(v.port) if v.port is not None else pods.get(v.name), v.pod, node))
            for v in views
        ]
        # The reservations that hold now: an engine's that is awake and loading or up (join.reservation's rule).
        held = {v.name: v.reservation for v in views if v.reservation is not None and not v.asleep}
        asleep = {v.name for v in views if v.asleep}
        loading = {v.name for v in views if v.state == "loading"}
        active, quiet_gpus = self._awake(gpus, targets, asleep, loading)
        reserving = [(name, c, held[name]) for name, c in targets if name in held]
        return await asyncio.to_thread(observations, gpus, active, quiet_gpus, reserving, self.joins)

    def _awake(
        self, gpus: GpuReadings | None, targets: list[tuple[str, GpuClaim]], asleep: set[str], loading: set[str]
    ) -> tuple[list[tuple[str, GpuClaim]], set[GpuKey]]:
        """The targets sampled (neither asleep nor loading) and the GPUs left alone (a loading engine's that no
        engine up shares); the series of an engine that woke or finished loading forgotten."""
        woke, self._asleep = self._asleep - asleep, asleep
        loaded, self._loading = self._loading - loading, loading
        # Only where an engine wakes or loads are its GPUs needed here (each target's are found in the thread).
        nodes = by_node(up_gpus(gpus.gpus)) if gpus and (woke or loaded or loading) else {}

        def gpus_of(names: set[str]) -> set[GpuKey]:
            return {key for name, c in targets if name in names for key in target_gpus(c, claim_gpus(c, nodes))}

        if woke or loaded:
            fresh = woke | loaded
            keys = {TrendKey("target", name, memory) for name in fresh for memory in ("gpu", "host")}
            keys |= {TrendKey.of_gpu(key) for key in gpus_of(fresh)}
            self.tracker.forget(keys)
        skipped = asleep | loading
        active = [t for t in targets if t[0] not in skipped] if skipped else targets
        return active, gpus_of(loading) - gpus_of({t[0] for t in active}) if loading else set()
