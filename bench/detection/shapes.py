"""How GPU memory moves, sample to sample, as NVML's `used` shows it: the pieces the histories are made of.

Each shape is a small deterministic process (its own `random.Random`), stepped at the history's interval. Where
each behaviour comes from is said at each class and in docs/performance.md, "Detection":

- A reserving engine (vLLM's `gpu_memory_utilization`, SGLang's `mem_fraction_static`, TGI, TensorRT-LLM's KV
  cache fraction) allocates its KV pool at start and NVML shows that share as used, idle or busy (the shared
  reference `engines.md`, "What NVML shows for a reserving engine"; vLLM's docs on `gpu_memory_utilization`).
  PyTorch's caching allocator then keeps what it reserved: NVML's `used` is the allocator's reserved memory plus
  the CUDA context, and it grows only when a request needs a block the cache cannot give, in segments (2 MiB for
  small allocations, 20 MiB for medium ones, the rounded size for large ones: PyTorch's CUDA memory management
  notes). So it is flat, with steps up, and falls only when the process exits (or sleeps).
- A non-reserving engine (a plain PyTorch or transformers server, a llama.cpp build without a fixed context)
  allocates activations and KV as the batch grows; the allocator keeps the high-water mark until its cache is
  emptied, so `used` follows the load with a lag and in segments.
- A foreign process (a notebook, a batch job, a profiler) holds its own allocations on the GPU, beside the
  engine's, and frees them all when it exits.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

MiB = 2**20
GiB = 2**30
DAY = 86400.0
HOUR = 3600.0
MINUTE = 60.0

# GPU totals as NVML reports them (nvidia-smi's "Total", MiB).
H100 = 81_559 * MiB  # H100 80GB HBM3
A100_80 = 81_920 * MiB  # A100-SXM4-80GB
A100_40 = 40_960 * MiB  # A100-SXM4-40GB
L4 = 23_034 * MiB
MIG_1G_10GB = 9_728 * MiB  # an A100 80GB's 1g.10gb instance
MIG_2G_20GB = 19_968 * MiB
MIG_3G_40GB = 40_192 * MiB
# The CUDA context and the libraries' workspaces a process holds as soon as it touches the GPU (cuBLAS, NCCL):
# NVML counts them in the process' `used`, the engine's reservation does not.
CONTEXT = 530 * MiB
SMALL_SEGMENT = 2 * MiB  # the caching allocator's segment for allocations under 1 MiB
LARGE_SEGMENT = 20 * MiB  # ... for allocations of 1 to 10 MiB


def poisson(rng: random.Random, lam: float) -> int:
    """A Poisson draw (Knuth's method below 30, the normal approximation above)."""
    if lam <= 0:
        return 0
    if lam > 30:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


@dataclass
class Load:
    """The offered load of a service, 0 to about 1.3: a daily cycle (the peak at `peak_hour` UTC, `amplitude`
    around `mean`), quieter weekends, bursts (arrivals of many long prompts: a Poisson process of `bursts_per_day`,
    each 2 to 15 minutes, +0.2 to +0.5) and minute-to-minute noise."""

    seed: int
    mean: float = 0.5
    amplitude: float = 0.3
    peak_hour: float = 15.0
    bursts_per_day: float = 6.0
    weekend: float = 0.7
    noise: float = 0.04

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._burst_until = -1.0
        self._burst_height = 0.0
        self._wander = 0.0

    def at(self, t: float, step: float) -> float:
        day_phase = 2 * math.pi * ((t / HOUR - self.peak_hour) % 24) / 24
        level = self.mean + self.amplitude * math.cos(day_phase)
        if int(t // DAY) % 7 in (3, 4):  # the histories start on a Wednesday: days 3 and 4 are the weekend
            level *= self.weekend
        if t >= self._burst_until and self._rng.random() < self.bursts_per_day * step / DAY:
            self._burst_until = t + self._rng.uniform(2, 15) * MINUTE
            self._burst_height = self._rng.uniform(0.2, 0.5)
        if t < self._burst_until:
            level += self._burst_height
        self._wander = 0.9 * self._wander + self._rng.gauss(0, self.noise)
        return max(0.0, level + self._wander)


class Staircase:
    """Memory that only grows, in allocator segments: a leak of `rate` bytes a second (allocations of `segment`
    bytes arriving as a Poisson process, so the steps come irregularly), from `start` on. `reset()` at a restart:
    a new process leaks from nothing."""

    def __init__(self, seed: int, rate: float, segment: float = SMALL_SEGMENT, start: float = 0.0) -> None:
        self._rng = random.Random(seed)
        self.rate, self.segment, self.start = rate, segment, start
        self.bytes = 0.0

    def step(self, t: float, step: float) -> float:
        if t >= self.start and self.rate > 0:
            self.bytes += poisson(self._rng, self.rate * step / self.segment) * self.segment
        return self.bytes

    def reset(self) -> None:
        self.bytes = 0.0


class WarmUp:
    """A healthy reserving engine's first hours: new request shapes need blocks the allocator's cache cannot give,
    so it reserves a few more segments, at a rate that decays as the shapes have all been seen (`tau`), then a
    rare step later on (`late_per_day`). Each step 2 MiB to 60 MiB (a few larger ones: a lazily created NCCL or
    cuBLAS workspace, up to 250 MiB). About `expected` bytes in the first hours in all."""

    def __init__(self, seed: int, expected: float = 120 * MiB, tau: float = 40 * MINUTE, late_per_day: float = 0.5):
        self._rng = random.Random(seed)
        self.expected, self.tau, self.late_per_day = expected, tau, late_per_day
        self.bytes = 0.0

    def step(self, since_up: float, step: float) -> float:
        mean_size = 25 * MiB
        rate = self.expected / mean_size / self.tau * math.exp(-since_up / self.tau) + self.late_per_day / DAY
        for _ in range(poisson(self._rng, rate * step)):
            if self._rng.random() < 0.08:
                self.bytes += self._rng.choice((64, 128, 250)) * MiB
            else:
                self.bytes += self._rng.choice((2, 2, 4, 20, 20, 40, 60)) * MiB
        return self.bytes

    def reset(self) -> None:
        self.bytes = 0.0


class Fragmentation:
    """Fragmentation that worsens with uptime: blocks freed in pieces the next larger request cannot reuse, so the
    allocator reserves new segments of that request's size (20 MiB to 1 GiB). Steps come faster as the cache
    fragments (`rate_per_hour` growing by `growth` an hour of uptime)."""

    def __init__(self, seed: int, rate_per_hour: float = 0.5, growth: float = 0.15, start: float = 0.0):
        self._rng = random.Random(seed)
        self.rate, self.growth, self.start = rate_per_hour, growth, start
        self.bytes = 0.0

    def step(self, t: float, since_up: float, step: float) -> float:
        if t < self.start:
            return self.bytes
        rate = self.rate * (1 + self.growth * since_up / HOUR) / HOUR
        for _ in range(poisson(self._rng, rate * step)):
            self.bytes += min(GiB, max(LARGE_SEGMENT, round(self._rng.lognormvariate(math.log(120 * MiB), 0.9))))
        return self.bytes

    def reset(self) -> None:
        self.bytes = 0.0


class CachedDemand:
    """A non-reserving engine's memory beyond its weights: the activations and KV its batch needs (`per_load`
    bytes at load 1), which the caching allocator keeps (in 20 MiB segments) until `release` has passed since the
    demand last reached it (the server empties the cache when the batch shrinks, as text-generation servers do
    between waves), so `used` follows the load up at once and down with a lag."""

    def __init__(self, seed: int, per_load: float, release: float = 10 * MINUTE) -> None:
        self._rng = random.Random(seed)
        self.per_load, self.release = per_load, release
        self._held = 0.0
        self._held_since = 0.0

    def step(self, t: float, load: float) -> float:
        demand = self.per_load * load * (1 + self._rng.gauss(0, 0.05))
        demand = math.ceil(max(0.0, demand) / LARGE_SEGMENT) * LARGE_SEGMENT
        if demand >= self._held or t - self._held_since >= self.release:
            self._held, self._held_since = demand, t
        return self._held

    def reset(self) -> None:
        self._held = 0.0


class Transients:
    """Allocations beyond a reserving engine's pool that come and go: workspaces a library makes per stream and
    frees, a large-vocabulary batch's sampler buffers, returned to the driver at once where the allocator unmaps
    freed pages (PyTorch's `expandable_segments`) or empties its cache. `per_hour` of them, sized with the GPU (and
    the model on it: a median of 0.02 % of the total, 16 MiB on 80 GB, at most 0.2 %), held for one to a few
    readings: NVML's `used` wobbles a little above its floor."""

    def __init__(
        self, seed: int, total: float, per_hour: float = 12.0, hold: tuple[float, float] = (20.0, 150.0)
    ) -> None:
        self._rng = random.Random(seed)
        self.per_hour, self.hold = per_hour, hold
        self.median, self.cap = 0.0002 * total, 0.002 * total
        self._held: list[tuple[float, float]] = []  # (until, bytes)

    def step(self, t: float, step: float) -> float:
        self._held = [(until, b) for until, b in self._held if until > t]
        for _ in range(poisson(self._rng, self.per_hour * step / HOUR)):
            size = min(self.cap, max(SMALL_SEGMENT, self._rng.lognormvariate(math.log(self.median), 0.9)))
            self._held.append((t + self._rng.uniform(*self.hold), math.ceil(size / SMALL_SEGMENT) * SMALL_SEGMENT))
        return sum(b for _, b in self._held)


@dataclass
class ForeignJob:
    """Another process on the GPU: it starts at `start` holding `base` bytes (a model loaded in a notebook, a
    batch job's tensors), grows by `growth` bytes an hour in 20 MiB segments (a notebook's cells, a job's cache),
    and exits at `end` (all freed)."""

    start: float
    end: float
    base: float
    growth: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        self._grown = Staircase(self.seed, self.growth / HOUR, LARGE_SEGMENT, self.start)

    def at(self, t: float, step: float) -> float:
        if not self.start <= t < self.end:
            return 0.0
        return CONTEXT + self.base + self._grown.step(t, step)
