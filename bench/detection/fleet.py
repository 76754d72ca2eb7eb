"""A fleet's GPUs and engines stepped through time: each engine's lives (loading, serving, asleep, dead), its memory
on each of its GPUs from the shapes (shapes.py), the foreign processes beside it, and the OOMs that follow.

An OOM is not scripted: it happens where a GPU's memory in use reaches its total less a margin (the driver's
allocation granularity, 0 to 8 MiB): the allocation that no longer fits, a leak's step or a transient on top of it.
The engine then dies (a tensor-parallel group with its rank), is relaunched by its orchestrator after a back-off
(Kubernetes' crash loop: 10 s doubling to 5 minutes, reset after 10 minutes up), loads again, and whatever grew in the
dead process starts again from nothing.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from detection.shapes import (
    CONTEXT,
    DAY,
    LARGE_SEGMENT,
    MINUTE,
    CachedDemand,
    ForeignJob,
    Fragmentation,
    Load,
    Staircase,
    Transients,
    WarmUp,
)

Slot = tuple[str, str]  # (node, gpu name)
# An OOM reached by a jump of more than this share of the GPU within this long gave no hour's warning.
SUDDEN_SHARE = 0.05
SUDDEN_SECONDS = 120.0


@dataclass
class Pressure:
    """The postmortem's incident: from `start` to `end`, long-context requests at high concurrency make the
    activations beyond the reservation grow `rate` bytes a second while the engine serves (from its relaunch on:
    they die with the process), so each relaunch runs out again until someone lowers the concurrency (`end`)."""

    start: float
    end: float
    rate: float
    ranks: tuple[int, ...] | None = None  # the ranks it grows on (None: all, evenly)


@dataclass
class Spike:
    """`bytes` allocated at once at `t` on rank `rank` (a request far longer than any before it; a foreign job's
    sudden load), held for `hold` seconds: no trend precedes it."""

    t: float
    bytes: float
    hold: float = 120.0
    rank: int = 0


@dataclass
class Engine:
    target: str
    ranks: list[Slot]
    total: float  # each of its GPUs' total
    weights: float  # per rank
    seed: int
    kind: str = "vllm"
    reservation: float | None = 0.9  # None: a non-reserving engine
    load_seconds: float = 150.0  # its weights streaming in
    warm_seconds: float = 60.0  # the KV pool allocated, CUDA graphs captured: the port still closed
    max_num_seqs: int = 256
    load: Load | None = None
    deploys: list[float] = field(default_factory=list)  # rolling restarts (graceful: no OOM)
    sleeps: list[tuple[float, float]] = field(default_factory=list)  # vLLM's sleep mode (level 1)
    leak: float = 0.0  # bytes a second, on `leak_ranks`
    leak_start: float = 0.0
    leak_ranks: tuple[int, ...] | None = None
    leak_segment: float = 2 * 2**20
    fragmentation: tuple[float, float] | None = None  # (steps an hour, growth an hour of uptime)
    fragmentation_start: float = 0.0
    pressure: list[Pressure] = field(default_factory=list)
    spikes: list[Spike] = field(default_factory=list)
    warm_up: float = 120 * 2**20  # the healthy allocator steps of the first hours (expected bytes)
    per_load: float = 0.0  # a non-reserving engine's activations and KV at load 1
    starts: float = 0.0  # its first launch
    # internal
    phase: str = "down"
    life_start: float = 0.0
    up_at: float = 0.0
    relaunch_at: float = 0.0
    backoff: float = 10.0
    preemptions: float = 0.0
    memory: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self.load = self.load or Load(self._rng.randrange(1 << 30))
        self.memory = [0.0] * len(self.ranks)
        self.relaunch_at = self.starts
        self.figures: dict[str, float | str | None] = {}
        self._shapes_made = False

    def _make_shapes(self) -> None:
        """The shapes of its memory, made at its first launch (the builders set the leak and the rest after the
        engine is made)."""
        rng, n = self._rng, len(self.ranks)
        self._warm = [WarmUp(rng.randrange(1 << 30), expected=self.warm_up) for _ in range(n)]
        self._leak = [
            Staircase(rng.randrange(1 << 30), self.leak if self._on(i, self.leak_ranks) else 0.0, self.leak_segment,
                      self.leak_start)
            for i in range(n)
        ]  # fmt: skip
        frag = self.fragmentation or (0.0, 0.0)
        self._frag = [Fragmentation(rng.randrange(1 << 30), *frag, start=self.fragmentation_start) for _ in range(n)]
        self._demand = [CachedDemand(rng.randrange(1 << 30), self.per_load) for _ in range(n)]
        self._transients = [Transients(rng.randrange(1 << 30), self.total, rng.uniform(4, 20)) for _ in range(n)]
        # What NVML shows beyond the reservation from the start: the CUDA context and the libraries' workspaces
        # outside the engine's budget (90.3 to 90.7 % at 0.90).
        self._overhead = rng.uniform(0.003, 0.007) * self.total
        self._shapes_made = True

    @staticmethod
    def _on(rank: int, ranks: tuple[int, ...] | None) -> bool:
        return ranks is None or rank in ranks

    # -- its life -----------------------------------------------------------------------------------------
    def _launch(self, t: float) -> None:
        if not self._shapes_made:
            self._make_shapes()
        self.phase, self.life_start = "loading", t
        for shape in (*self._warm, *self._leak, *self._frag, *self._demand):
            shape.reset()

    def die(self, t: float, *, crashed: bool) -> None:
        """Its processes exit: their memory is freed at once; the orchestrator relaunches after its back-off."""
        self.phase = "down"
        self.memory = [0.0] * len(self.ranks)
        if crashed:
            if t - self.up_at > 10 * MINUTE:
                self.backoff = 10.0
            self.relaunch_at = t + self.backoff
            self.backoff = min(300.0, self.backoff * 2)
        else:
            self.relaunch_at = t + 20.0  # a rolling restart: the new pod is scheduled at once

    def asleep_at(self, t: float) -> bool:
        return any(a <= t < b for a, b in self.sleeps)

    def step(self, t: float, step: float) -> None:
        """The engine's state and memory on each rank at `t`."""
        assert self.load is not None
        load = self.load.at(t, step)
        if self.phase == "down":
            if t >= self.relaunch_at and t >= self.starts:
                self._launch(t)
            else:
                return
        if self.phase in ("up", "asleep") and any(self.up_at < d <= t and d > t - step for d in self.deploys):
            self.die(t, crashed=False)
            return
        since = t - self.life_start
        if self.phase == "loading":
            if since < self.load_seconds:
                self.memory = [CONTEXT + self.weights * since / self.load_seconds] * len(self.ranks)
                return
            self.memory = [self._pool()] * len(self.ranks)
            if since < self.load_seconds + self.warm_seconds:
                return
            self.phase, self.up_at = "up", t
        self.phase = "asleep" if self.asleep_at(t) else "up"
        since_up = t - self.up_at
        out = []
        for i in range(len(self.ranks)):
            grown = (
                self._warm[i].step(since_up, step) + self._leak[i].step(t, step) + self._frag[i].step(t, since_up, step)
            )
            for p in self.pressure:
                if self._on(i, p.ranks) and p.start <= t < p.end:
                    grown += p.rate * (t - max(self.up_at, p.start))
            for s in self.spikes:
                if s.rank == i and s.t <= t < s.t + s.hold:
                    grown += s.bytes
            if self.phase == "asleep":
                # Level 1 offloads the weights and discards the KV pool (CuMemAllocator's pools); what else the
                # allocator holds stays.
                out.append(CONTEXT + 300 * 2**20 + grown)
            elif self.reservation is not None:
                out.append(self._pool() + self._overhead + grown + self._transients[i].step(t, step))
            else:
                out.append(self._pool() + self._demand[i].step(t, load) + grown)
        self.memory = out
        self._figures(t, step, load)

    def _pool(self) -> float:
        """What it holds once loaded: its reservation's share of the GPU, or (not reserving) its weights and
        CUDA graphs with the context."""
        if self.reservation is not None:
            return self.reservation * self.total
        return CONTEXT + self.weights + 400 * 2**20

    def _figures(self, t: float, step: float, load: float) -> None:
        pressured = any(p.start <= t < p.end for p in self.pressure)
        if self.phase == "asleep":
            running = waiting = kv = 0.0
        else:
            # A healthy service is provisioned for its peak: its queue forms only when a burst lands on the peak
            # (load above 1.15), its KV cache fills near 1.4; the incident's concurrency is far beyond (1.6).
            if pressured:
                load = max(load, 1.6)
            running = min(self.max_num_seqs, max(0.0, load) * 0.7 * self.max_num_seqs)
            waiting = max(0.0, (load - 1.15) * self.max_num_seqs * 0.25)
            kv = min(1.0, max(0.0, 0.05 + 0.65 * load + self._rng.gauss(0, 0.02)))
            if kv > 0.97:
                self.preemptions += self._poisson(2.0 * step / MINUTE)
        self.figures = {
            "kv_cache_usage": round(kv, 4),
            "waiting": round(waiting),
            "running": round(running),
            "preemptions_total": self.preemptions,
            "gpu_memory_utilization": self.reservation,
            "max_num_seqs": self.max_num_seqs,
            "sleep_state": "weights_offloaded" if self.phase == "asleep" else "awake",
        }

    def _poisson(self, lam: float) -> int:
        from detection.shapes import poisson

        return poisson(self._rng, lam)

    @property
    def state(self) -> str:
        """As the exporter names it: loading, up (asleep too: it answers), down."""
        return {"asleep": "up"}.get(self.phase, self.phase)


@dataclass
class Gpu:
    node: str
    name: str
    total: float
    margin: float  # an OOM where used reaches total - margin
    foreign: list[ForeignJob] = field(default_factory=list)


@dataclass
class OomEvent:
    t: float
    node: str
    gpu: str
    target: str
    cause: str  # what filled the GPU: leak, fragmentation, pressure, foreign, spike, startup
    sudden: bool = False  # reached by a jump no monitor could foresee (a spike, a burst on top of a leak)


@dataclass
class Reading:
    t: float
    gpu: Gpu
    used: float
    engines: list[tuple[Engine, float]]  # the engines on it, each with its own bytes there


class Fleet:
    """GPUs and the engines on them, stepped together; `run` yields each step's readings, and `ooms` collects the
    OOMs as they happen."""

    def __init__(self, gpus: list[Gpu], engines: list[Engine], seed: int) -> None:
        self.gpus = {(g.node, g.name): g for g in gpus}
        self.engines = engines
        self.ooms: list[OomEvent] = []
        self._rng = random.Random(seed)
        self._cause: dict[str, str] = {}

    def _cause_of(self, engine: Engine, gpu: Gpu, t: float) -> str:
        if any(s.t <= t < s.t + s.hold for s in engine.spikes):
            return "spike"
        if any(job.start <= t < job.start + 2 * MINUTE for job in gpu.foreign):
            return "spike"  # a foreign job that took its memory at once
        if any(p.start <= t < p.end for p in engine.pressure):
            return "pressure"
        if any(job.start <= t < job.end for job in gpu.foreign):
            return "foreign"
        if engine.leak and t >= engine.leak_start:
            return "leak"
        if engine.fragmentation and t >= engine.fragmentation_start:
            return "fragmentation"
        return "unknown"

    def run(self, start: float, days: float, step: float) -> Iterator[list[Reading]]:
        held: dict[tuple[str, int], float] = {}  # (target, rank) -> its bytes at the step before
        recent: dict[tuple[str, str], list[float]] = {}  # each GPU's used over the last SUDDEN_SECONDS
        keep = max(1, round(SUDDEN_SECONDS / step))
        for i in range(int(days * DAY / step)):
            t = start + i * step
            for engine in self.engines:
                engine.step(t - start, step)
            readings = []
            for key, gpu in self.gpus.items():
                on = [(e, r, e.memory[r]) for e in self.engines for r, slot in enumerate(e.ranks) if slot == key]
                foreign = sum(job.at(t - start, step) for job in gpu.foreign)
                used = sum(b for _, _, b in on) + foreign
                before = recent.setdefault(key, [])
                if used >= gpu.total - gpu.margin:
                    grew = [e for e, r, b in on if b > held.get((e.target, r), 0.0) and e.phase != "down"]
                    alive = [e for e, _, b in on if b > 0 and e.phase != "down"]
                    victims = grew or alive[:1]
                    # Reached by a jump of more than SUDDEN_SHARE of the GPU within SUDDEN_SECONDS: no monitor had
                    # the hour's warning, whatever grew before it (a burst on top of a leak's days).
                    sudden = bool(before) and used - min(before) > SUDDEN_SHARE * gpu.total
                    used = self._oom(t, start, gpu, victims, used, sudden)
                    on = [(e, r, e.memory[r]) for e, r, _ in on]
                before.append(used)
                del before[:-keep]
                readings.append(Reading(t, gpu, used, [(e, b) for e, _, b in on]))
            for engine in self.engines:
                for r, b in enumerate(engine.memory):
                    held[(engine.target, r)] = b
            yield readings

    def _oom(self, t: float, start: float, gpu: Gpu, victims: list[Engine], used: float, sudden: bool) -> float:
        """The allocation that did not fit: the engine that made it dies (a TP group whole), and the reading is the
        last NVML saw before it did. A foreign job that ran the GPU out is stopped by someone within the hour."""
        rel = t - start
        for engine in victims:
            cause = "startup" if engine.phase == "loading" else self._cause_of(engine, gpu, rel)
            self.ooms.append(OomEvent(t, gpu.node, gpu.name, engine.target, cause, sudden or cause == "spike"))
            engine.die(rel, crashed=True)
            if cause == "foreign":
                for job in gpu.foreign:
                    if job.start <= rel < job.end:
                        job.end = min(job.end, rel + self._rng.uniform(20, 60) * MINUTE)
        used = min(gpu.total - gpu.margin * self._rng.uniform(0.2, 0.9) - 2**20, used)
        return math.floor(used / 2**20) * 2**20 if used > LARGE_SEGMENT else used
