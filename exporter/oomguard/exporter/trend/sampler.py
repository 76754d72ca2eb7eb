"""Samples memory at a fixed interval, whatever Prometheus' scrape interval, and keeps the trends.

Per GPU: used / total. Per target: the memory of its GPUs (all processes), and the
host RSS of its processes (for CPU deployments) against the host's memory. The
analysis runs here, in the background, after each sample; a scrape only reads the
latest results.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping

import psutil

from oomguard.exporter.join import GpuClaim, by_node, claim_gpus, join, join_gpu, up_gpus
from oomguard.exporter.model import (
    GpuKey,
    GpuMemory,
    GpuReading,
    GpuReadings,
    Observation,
    TargetMemory,
    TrendKey,
    TrendReading,
)
from oomguard.exporter.trend.analysis import Series, TrendSettings

log = logging.getLogger(__name__)


Observe = Callable[[], Awaitable[dict[TrendKey, Observation]]]


class TrendTracker:
    """Series by key; `record` feeds them, `latest` is what the metrics read."""

    def __init__(self, settings: TrendSettings) -> None:
        self.settings = settings
        self._series: dict[TrendKey, Series] = {}
        self._capacity: dict[TrendKey, float] = {}
        self._basis: dict[TrendKey, str] = {}  # what each series' level is a share of (model.TREND_BASES)
        self.latest: dict[TrendKey, TrendReading] = {}
        self.samples_total = 0
        self.errors_total = 0
        self._phase: dict[TrendKey, int] = {}  # the tick (modulo analysis_every) at which each series is analysed
        self._next_phase = 0
        self._from_serving: set[TrendKey] = set()  # forgotten, not observed since

    def forget(self, keys: set[TrendKey]) -> None:
        """Start these series afresh, from their engine serving: what came before (its sleep, its load) says
        nothing of what comes now, and what rises from now on is not a load (Series.from_serving)."""
        self._from_serving |= keys
        for key in keys:
            self._series.pop(key, None)
            self._capacity.pop(key, None)
            self._basis.pop(key, None)
            self.latest.pop(key, None)
            self._phase.pop(key, None)

    def recent(self, key: TrendKey, seconds: float, points: int = 60) -> list[float]:
        """The series' used / capacity over its last `seconds`, at most `points` of them ([] for none)."""
        series = self._series.get(key)
        return series.recent(seconds, points) if series is not None else []

    def record(self, t: float, observations: dict[TrendKey, Observation]) -> None:
        for key, obs in observations.items():
            if obs.capacity_bytes <= 0:
                continue
            series = self._series.get(key)
            held = self._capacity.get(key)
            if series is not None and (
                self._basis.get(key) != obs.basis or (held and abs(obs.capacity_bytes - held) > 0.1 * held)
            ):
                # Judged on another basis or capacity from now on (its engine's reservation now known, changed or
                # gone): a new series, from its engine serving where a reservation holds.
                series = None
                if obs.basis == "headroom":
                    self._from_serving.add(key)
            if series is None:
                from_serving = key in self._from_serving
                self._from_serving.discard(key)
                scale = obs.total_bytes / obs.capacity_bytes if obs.total_bytes > obs.capacity_bytes else 1.0
                series = self._series[key] = Series(self.settings, from_serving=from_serving, noise_scale=scale)
                # Series are analysed in turn: spread them evenly over the ticks of one analysis interval.
                self._phase[key] = self._next_phase
                self._next_phase = (self._next_phase + 1) % self.settings.analysis_every
            series.add(t, obs.used_bytes / obs.capacity_bytes)
            self._capacity[key] = obs.capacity_bytes
            self._basis[key] = obs.basis
        # A series not observed for a whole long window is gone (GPU removed, target renamed).
        for key in [
            k for k, s in self._series.items() if len(s) and s.last_time < t - self.settings.long_window_seconds
        ]:
            del self._series[key]
            del self._capacity[key]
            self._basis.pop(key, None)
            self._phase.pop(key, None)
        every, tick = self.settings.analysis_every, self.samples_total
        latest = {}
        for key, series in self._series.items():
            previous = self.latest.get(key)
            # Not this series' turn: its last analysis stands (a new series is analysed at once).
            if previous is not None and every > 1 and tick % every != self._phase.get(key, 0):
                latest[key] = TrendReading(previous.trend, self._capacity[key], self._basis[key])
                continue
            trend = series.trend()
            if trend is not None:
                latest[key] = TrendReading(trend, self._capacity[key], self._basis[key])
        self.latest = latest
        self.samples_total += 1


class Sampler:
    """The background loop: observe, record, sleep; clock and sleep are injectable for replays."""

    def __init__(
        self,
        tracker: TrendTracker,
        observe: Observe,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        offload: bool = True,
    ) -> None:
        self.tracker = tracker
        self.observe = observe
        self.clock = clock
        self.sleep = sleep
        self.offload = offload  # replays at virtual time keep the analysis on the loop: same code, no thread hop

    async def run(self, iterations: int | None = None) -> None:
        interval = self.tracker.settings.interval_seconds
        done = 0
        next_at = self.clock()
        while iterations is None or done < iterations:
            try:
                observations = await self.observe()
                if self.offload:
                    # The analysis of every series takes milliseconds: not on the event loop.
                    await asyncio.to_thread(self.tracker.record, self.clock(), observations)
                else:
                    self.tracker.record(self.clock(), observations)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bad sample must not end the sampling
                self.tracker.errors_total += 1
                log.exception("trend sample failed")
            done += 1
            # Fixed rate, not fixed delay: a slow sample does not stretch the interval.
            next_at += interval
            await self.sleep(max(0.0, next_at - self.clock()))


Engine = tuple[float, dict[GpuKey, float] | None]  # an engine reserving a GPU: its ratio, its own use by GPU or None


class Joins:
    """The last tick's joins (join.py), each kept while what it was computed from reads the same.

    A join is a function of its target's claim and its nodes' GPUs (their readings' values), a GPU's with its engines
    of the reservations on it: where those are equal to the last tick's, so is the join, and it is not computed again.
    dcgm-exporter's values change once each collect interval (30 s by default), so most ticks read most nodes' GPUs
    as the last did (issue 50, item 5: at 1,000 pods the joins were a fifth of the idle exporter's CPU)."""

    __slots__ = ("_gpus", "_targets", "computed")

    def __init__(self) -> None:
        self._targets: dict[str, tuple[GpuClaim, Mapping[GpuKey, GpuReading], TargetMemory]] = {}
        self._gpus: dict[GpuKey, tuple[GpuReading, list[Engine], GpuMemory | None]] = {}
        self.computed = 0  # joins computed, not found (the tests count them)

    def target(
        self, name: str, claim: GpuClaim, gpus: Mapping[GpuKey, GpuReading], into: dict[str, tuple]
    ) -> TargetMemory:
        last = into.get(name) or self._targets.get(name)
        if last is not None and last[0] == claim and last[1] == gpus:
            memory = last[2]
        else:
            memory = join(claim, gpus)
            self.computed += 1
        into[name] = (claim, gpus, memory)
        return memory

    def gpu(self, gpu: GpuReading, engines: list[Engine], into: dict[GpuKey, tuple]) -> GpuMemory | None:
        last = self._gpus.get(gpu.key)
        if last is not None and last[0] == gpu and last[1] == engines:
            joined = last[2]
        else:
            joined = join_gpu(gpu, engines)
            self.computed += 1
        into[gpu.key] = (gpu, engines, joined)
        return joined

    def keep(self, targets: dict[str, tuple], gpus: dict[GpuKey, tuple]) -> None:
        """This tick's joins, for the next (the targets and GPUs gone are forgotten)."""
        self._targets, self._gpus = targets, gpus


def observations(
    nvml: GpuReadings | None,
    targets: list[tuple[str, GpuClaim]],
    skip_gpus: Collection[GpuKey] = (),
    reserving: list[tuple[str, GpuClaim, float]] = (),  # type: ignore[assignment]
    joins: Joins | None = None,
) -> dict[TrendKey, Observation]:
    """What one tick sees: GPUs (but `skip_gpus`), and per target its GPUs' memory (join.py) and its processes'
    RSS. `reserving`: the targets whose reservation holds now, each with it: on their GPUs what is judged is the use
    beyond the reservations (used - reserved, below 0 where the engines hold less) against the headroom they leave
    (join.join_gpu, basis "headroom"); elsewhere used against total. Where an engine holds less than its
    reservation this differs from the alerts' level (headroom_used_ratio counts its untaken share as taken): the
    trend follows what is free, so the postmortem's climb from 0.86 through a 0.90 reservation is seen whole.
    `joins`: the last tick's, kept from one tick to the next (the same figures, fewer computed)."""
    out: dict[TrendKey, Observation] = {}
    gpus = up_gpus(nvml.gpus) if nvml else {}
    nodes = by_node(gpus)
    joins = joins or Joins()
    joined_targets: dict[str, tuple] = {}
    joined_gpus: dict[GpuKey, tuple] = {}
    engines_on: dict[GpuKey, list[tuple[float, dict[GpuKey, float] | None]]] = {}
    for name, claim, ratio in reserving:
        memory = joins.target(name, claim, claim_gpus(claim, nodes), joined_targets)
        for key in memory.gpus:
            engines_on.setdefault(key, []).append((ratio, memory.own_by_gpu))
    beyond: dict[GpuKey, Observation] = {}
    for key, engines in engines_on.items():
        gpu = gpus.get(key)
        joined = joins.gpu(gpu, engines, joined_gpus) if gpu is not None else None
        if joined is not None and joined.total_bytes - joined.reserved_bytes > 0:
            # Signed: an engine that holds less than its reservation (its pool smaller than the share it was told)
            # reads below 0, so a climb through the reservation is seen whole, not from where it crosses it.
            beyond[key] = Observation(
                joined.used_bytes - joined.reserved_bytes,
                joined.total_bytes - joined.reserved_bytes,
                "headroom",
                joined.total_bytes,
            )
    for key, gpu in gpus.items():
        if gpu.measured and key not in skip_gpus:
            out[TrendKey.of_gpu(key)] = beyond.get(key) or Observation(gpu.used_bytes or 0.0, gpu.total_bytes or 0.0)
    host_total = float(psutil.virtual_memory().total)
    for name, claim in targets:
        memory = joins.target(name, claim, claim_gpus(claim, nodes), joined_targets)
        process = claim.process
        mine = [beyond[key] for key in memory.gpus if key in beyond]
        if mine and len(mine) == len(memory.gpus):
            # Its worst GPU by the share of its headroom in use (tensor parallel runs out on one device).
            out[TrendKey("target", name, "gpu")] = max(mine, key=lambda o: o.used_bytes / o.capacity_bytes)
        elif memory.used_bytes is not None and memory.total_bytes:
            out[TrendKey("target", name, "gpu")] = Observation(memory.used_bytes, memory.total_bytes)
        if process is not None:
            out[TrendKey("target", name, "host")] = Observation(process.resident_bytes, host_total)
    joins.keep(joined_targets, joined_gpus)
    return out
