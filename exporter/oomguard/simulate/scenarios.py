"""Built-in scenarios: how GPU memory and the engine's queue move over a simulated life.

Every figure is a pure function of `t`, the simulated seconds since the engine
process was launched, so the simulated GPUs (fake NVML, in the exporter) and the
simulated engine (its own process, serving /metrics) agree without talking.

An engine spans GPUs 0 .. `gpus` - 1, one tensor-parallel rank on each, and its memory is
given per GPU. vLLM reserves its memory at start: its KV cache pool fills
gpu_memory_utilization x total of every GPU it runs on, idle or busy (the `*-steady`
scenarios and `tp-skew`); what still moves is the little beyond it.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from oomguard.common.excerpt import LIMIT, excerpt

GIB = 1024**3
GPU_TOTAL_BYTES = 80 * GIB  # each simulated GPU: an H100 80GB
IDLE_GPU_BYTES = 512 * 1024**2  # what an idle GPU shows besides the engine: contexts of monitoring tools


def _noise(t: float, scale: float) -> float:
    """Deterministic jitter in [-scale, scale]: reproducible runs, still not a flat line."""
    x = math.sin(t * 12.9898 + 78.233) * 43758.5453
    return (x - math.floor(x) - 0.5) * 2 * scale


@dataclass(frozen=True)
class EngineFigures:
    kv_cache_usage: float
    waiting: int
    running: int
    preemptions: int
    prefix_queries: int
    prefix_hits: int


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    gpu_memory_utilization: float
    load_seconds: float = 25.0  # model load: the port refuses meanwhile
    # Simulated seconds after launch at which the load allocates the KV cache pool: from then the engine holds its
    # reservation while it warms up (CUDA graph capture, profiling) without serving. None: at 80 % of the load.
    kv_allocated_at: float | None = None
    # Simulated seconds after launch at which the engine dies of CUDA OOM (None: never)...
    oom_at: float | None = None
    # ...and in later lives, when clients retrying at once bring the load straight back.
    retry_oom_at: float | None = None
    retry_spike_after: float | None = None
    restart_delay: float = 5.0  # the orchestrator's back-off before relaunching
    # A probe or watchdog that kills the engine this long after it starts serving (no OOM, no log).
    kill_after_serving: float | None = None
    # The GPUs the engine spans: 0 .. gpus - 1, one tensor-parallel rank each (vLLM's tensor_parallel_size).
    gpus: int = 1
    serving_used_ratio: float = 0.88  # share of each GPU the engine holds right after load
    workspace_ratio: float = 0.004  # kernels' workspace that comes and goes with the batch (half its swing)
    noise_ratio: float = 0.001
    climb_ratio_per_second: float = 0.0  # growth past load, on every GPU: a leak or unbounded growth
    # Growth on one GPU alone (activations, NCCL buffers, a leak on one rank), from this long after load on.
    skew_gpu: int | None = None
    skew_after: float = 0.0
    skew_ratio_per_second: float = 0.0
    spike_ratio: float = 0.0  # extra use from overcommitted concurrency...
    spike_after: float = 0.0  # ...starting this long after load...
    spike_seconds: float = 1.0  # ...reaching its peak over this long
    retry_spike_seconds: float | None = None
    overloaded: bool = False  # queue and preemptions grow after spike_after
    # The engine offloads its KV cache to CPU memory (vLLM's KV offloading): its /metrics carries the offload
    # families, KV stored as requests fill blocks and loaded back as prefixes are reused.
    kv_offload: bool = False
    # From this life on (0 = the first) the engine cannot allocate its KV cache at start: it loads its weights,
    # logs vLLM's startup memory error and exits, and never serves (None: every life starts).
    startup_fails_from_life: int | None = None
    # Another process on GPU 0 (a notebook, a training job sharing the GPU): from this long after the first
    # launch it grows at this pace up to its cap, and keeps what it holds across the engine's restarts.
    foreign_after: float | None = None
    foreign_ratio_per_second: float = 0.0
    foreign_max_ratio: float = 0.0

    def starts(self, life: int) -> bool:
        """Whether life number `life` gets through its load and serves."""
        return self.startup_fails_from_life is None or life < self.startup_fails_from_life

    def foreign_ratio(self, since_first_launch: float) -> float:
        """Share of GPU 0 the foreign process holds, simulated seconds after the engine's first launch."""
        if self.foreign_after is None or since_first_launch < self.foreign_after:
            return 0.0
        return min(self.foreign_max_ratio, self.foreign_ratio_per_second * (since_first_launch - self.foreign_after))

    def death_at(self, life: int) -> float | None:
        """Simulated seconds after launch at which life number `life` (0 = first) dies of OOM."""
        return self.retry_oom_at if life > 0 and self.retry_oom_at is not None else self.oom_at

    def _spike(self, life: int) -> tuple[float, float]:
        if life > 0 and self.retry_spike_after is not None:
            return self.retry_spike_after, self.retry_spike_seconds or self.spike_seconds
        return self.spike_after, self.spike_seconds

    @property
    def oom_gpu(self) -> int:
        """The GPU CUDA runs out of memory on: the one that grows alone, else the first."""
        return self.skew_gpu if self.skew_gpu is not None else 0

    def memory_at_death(self, life: int, total_bytes: int) -> tuple[int, float, float]:
        """(the GPU that runs out, the bytes the engine holds on it, the bytes left free) as life `life` dies of
        CUDA OOM: the figures of its traceback."""
        gpu = self.oom_gpu
        death = self.death_at(life) or 0.0
        used = self.gpu_used_ratio(death, life, gpu) * total_bytes
        # The first life's clock is the foreign process's (both from the first launch); later ones never serve.
        foreign = self.foreign_ratio(death) * total_bytes if gpu == 0 and life == 0 else 0.0
        return gpu, used, max(0.0, total_bytes - IDLE_GPU_BYTES - used - foreign)

    def gpu_used_ratio(self, t: float, life: int = 0, gpu: int = 0) -> float:
        """Share of GPU `gpu` (0 .. gpus - 1) the engine's processes hold, t simulated seconds after launch."""
        t = max(0.0, t)
        if self.kv_allocated_at is not None and self.starts(life) and t < self.load_seconds:
            # the weights, then the pool that fills the reservation, held through the warm-up that follows
            kv = self.kv_allocated_at
            return 0.2 * t / kv if t < kv else self.serving_used_ratio
        if t < self.load_seconds or not self.starts(life):
            # weights first, then the KV cache pool at the end of the load (which a failing start cannot allocate)
            weights = 0.2 * min(t, self.load_seconds * 0.8) / self.load_seconds
            return weights if t < self.load_seconds * 0.8 or not self.starts(life) else self.serving_used_ratio * 0.97
        serving = t - self.load_seconds
        ratio = self.serving_used_ratio + self.climb_ratio_per_second * serving
        spike_after, spike_seconds = self._spike(life)
        if self.spike_ratio and serving > spike_after:
            ratio += self.spike_ratio * min(1.0, (serving - spike_after) / spike_seconds)
        if gpu == self.skew_gpu and serving > self.skew_after:
            ratio += self.skew_ratio_per_second * (serving - self.skew_after)
        # kernels' workspace comes and goes with the batch; each GPU's jitter is its own
        ratio += self.workspace_ratio * (1 + math.sin(serving / 7.0)) + _noise(t + 1000.0 * gpu, self.noise_ratio)
        return min(ratio, 0.999)

    def engine(self, t: float, life: int = 0) -> EngineFigures:
        serving = max(0.0, t - self.load_seconds)
        # KV cache churn: requests fill blocks, finish, free them (a sawtooth)
        churn = (serving % 40.0) / 40.0
        kv = 0.25 + 0.35 * churn
        waiting, running, preemptions = int(2 * churn), 4 + int(6 * churn), 0
        spike_after, _ = self._spike(life)
        if self.overloaded and serving > spike_after:
            over = serving - spike_after
            kv = min(1.0, 0.6 + over / 30.0)
            running = 16
            waiting = int(min(48, 2 + over / 2))
            preemptions = int(max(0.0, over - 15) * 0.8)
        queries = int(serving * 900)
        return EngineFigures(
            kv_cache_usage=round(kv, 4),
            waiting=waiting,
            running=running,
            preemptions=preemptions,
            prefix_queries=queries,
            prefix_hits=int(queries * 0.55),
        )


def _overcommit(name: str = "incident", load: float = 240.0) -> Scenario:
    spike_after, spike_seconds, retry_seconds = 60.0, 600.0, 120.0
    # Dies when the spike has brought memory to 99 %: 0.86 + 0.14 x share = 0.99.
    share = (0.99 - 0.86) / 0.14
    return Scenario(
        name=name,
        summary="The incident: gpu_memory_utilization 0.9 and too many sequences; under long-context load the "
        "queue, KV cache and preemptions grow and memory climbs past 90 % and 95 % to CUDA OOM after ~12 "
        f"minutes; clients retry at once, so each restart ({load / 60:g} minutes of model load) dies sooner: a "
        "restart storm.",
        gpu_memory_utilization=0.9,
        load_seconds=load,
        serving_used_ratio=0.86,
        spike_ratio=0.14,
        spike_after=spike_after,
        spike_seconds=spike_seconds,
        retry_spike_after=0.0,
        retry_spike_seconds=retry_seconds,
        overloaded=True,
        oom_at=load + spike_after + share * spike_seconds,
        retry_oom_at=load + share * retry_seconds,
        restart_delay=30.0,
    )


# A reserved engine holds its reservation less this, on average (0.001 under it, the workspace's mean back up).
_RESERVED_SLACK = 0.0007


def _reserved(name: str, summary: str, utilization: float, **fields: Any) -> Scenario:
    """vLLM's own way: from the end of the load its processes hold gpu_memory_utilization x total of each of
    its GPUs (the KV cache pool takes what the weights and the profiled activations leave), idle or busy;
    the KV cache churns inside the pool, unseen by NVML. What moves is a sliver of workspace within it."""
    return Scenario(
        name=name,
        summary=summary,
        gpu_memory_utilization=utilization,
        serving_used_ratio=utilization - 0.001,
        workspace_ratio=0.0003,
        noise_ratio=0.0002,
        **fields,
    )


def nvml_used_ratio(engine_ratio: float) -> float:
    """What NVML shows for a GPU whose engine holds `engine_ratio`: plus the idle GPU's own use."""
    return engine_ratio + IDLE_GPU_BYTES / GPU_TOTAL_BYTES


def _pct(ratio: float) -> str:
    return f"{ratio * 100:.1f} %"


def _steady(name: str, utilization: float) -> Scenario:
    shown = nvml_used_ratio(utilization - _RESERVED_SLACK)
    return _reserved(
        name,
        f"vLLM at gpu_memory_utilization {utilization:.2f} on a healthy server: its processes hold {utilization:.2f} "
        f"of the GPU from the end of the load, so NVML shows {_pct(shown)} (with the idle GPU's own use), steady "
        "for hours while the KV cache churns inside the reservation; never out of memory.",
        utilization,
    )


def _long_warmup() -> Scenario:
    # vLLM's long warm-up: the pool is allocated 30 s in, then CUDA graph capture runs 5 minutes with the port
    # closed. Judged on its total, the GPU at 95.6 % would page (GpuMemoryCritical: 95 % for 2m); the reservation on
    # the engine's command line puts it at the headroom's 12 %, as once it serves.
    utilization, weights, warmup = 0.95, 30.0, 300.0
    shown = nvml_used_ratio(utilization - _RESERVED_SLACK)
    return _reserved(
        "long-warmup",
        f"vLLM at gpu_memory_utilization {utilization:.2f} (on its command line) with a long warm-up: its weights "
        f"load for {weights:.0f} s, its KV cache pool takes the reservation, then it captures CUDA graphs for "
        f"{warmup / 60:.0f} minutes with its port closed (no /metrics) while NVML shows {_pct(shown)}; then it "
        "serves, steady, never out of memory.",
        utilization,
        load_seconds=weights + warmup,
        kv_allocated_at=weights,
    )


def _tp_skew() -> Scenario:
    # 0.4 % of the GPU per minute: the headroom at 0.90 is 10 % of the GPU, so the use beyond the reservation
    # fills 4 % of it a minute, and a level alert held a few minutes (the bundle's: 75 % of the headroom, i.e.
    # 97.5 % used, for 2m) still comes minutes before the OOM; at 1 %/min the 2 minutes past 97.5 % reach 99.5 %.
    utilization, load, steady_seconds, rate, dies_at = 0.9, 25.0, 300.0, 0.004 / 60, 0.988
    start = utilization - _RESERVED_SLACK
    climb_seconds = (dies_at - start) / rate
    return _reserved(
        "tp-skew",
        f"A tensor-parallel engine (TP=2) at gpu_memory_utilization {utilization}: GPUs 0 and 1 both at "
        f"{_pct(nvml_used_ratio(start))} for {steady_seconds / 60:.0f} minutes; then GPU 1 alone climbs beyond the "
        f"reservation (activations, NCCL buffers, a leak on one rank) at {rate * 60 * 100:g} % of the GPU per "
        f"minute to {_pct(nvml_used_ratio(dies_at))}, and CUDA runs out of memory on it {climb_seconds / 60:.1f} "
        f"minutes into the climb ({(load + steady_seconds + climb_seconds) / 60:.1f} minutes after launch); GPU 0 "
        f"stays at {_pct(nvml_used_ratio(start))}. The orchestrator relaunches the engine.",
        utilization,
        load_seconds=load,
        gpus=2,
        skew_gpu=1,
        skew_after=steady_seconds,
        skew_ratio_per_second=rate,
        oom_at=load + steady_seconds + climb_seconds,
    )


def _foreign_process() -> Scenario:
    # The engine reserves 0.80 and stays within it; the foreign process fills the 20 % headroom at 1 % of the GPU a
    # minute (5 % of the headroom), 5 minutes after load, until CUDA runs out of memory with the GPU at 99.5 %: the
    # level alerts (half the headroom for 5m, three quarters for 2m) have time to fire first. Then it grows into
    # what the engine freed, to 30 % of the GPU: what is left is less than the 80 % a relaunch asks for.
    utilization, load, steady_seconds, rate, full, cap = 0.8, 25.0, 300.0, 0.01 / 60, 0.995, 0.30
    engine = utilization - _RESERVED_SLACK
    grows = full - nvml_used_ratio(engine)
    return _reserved(
        "foreign-process",
        f"vLLM at gpu_memory_utilization {utilization} on a GPU it shares: it holds its {_pct(utilization)} and "
        f"never more, while another process on the GPU (a notebook, a training job) grows at "
        f"{rate * 60 * 100:g} % of the GPU per minute from {steady_seconds / 60:.0f} minutes after load; with the GPU "
        f"at {_pct(full)} the engine's next allocation fails (CUDA OOM, {grows / rate / 60:.1f} minutes into the "
        "growth). The other process grows into the memory the engine freed, to {_pct(cap)}, so every relaunch fails "
        "at start: the free memory is less than the engine's reservation.",
        utilization,
        load_seconds=load,
        foreign_after=load + steady_seconds,
        foreign_ratio_per_second=rate,
        foreign_max_ratio=cap,
        oom_at=load + steady_seconds + grows / rate,
        startup_fails_from_life=1,
        restart_delay=30.0,
    )


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="hot-steady",
            summary="A hot but steady server: 88 % of GPU memory, KV cache churning, never out of memory.",
            gpu_memory_utilization=0.9,
        ),
        Scenario(
            name="slow-leak",
            summary="Memory climbs 1 % of the GPU per minute and never falls back, past the engine's "
            "budget, until CUDA runs out of memory; then the orchestrator restarts it.",
            gpu_memory_utilization=0.6,
            serving_used_ratio=0.56,
            climb_ratio_per_second=0.01 / 60,
            oom_at=25.0 + 0.43 / (0.01 / 60),
            kv_offload=True,
        ),
        _overcommit(),
        Scenario(
            name="probe-kill",
            summary="Memory is normal (62 %), but a liveness probe or watchdog kills the engine two minutes "
            "after each start: restarts with no OOM in the log.",
            gpu_memory_utilization=0.9,
            serving_used_ratio=0.62,
            load_seconds=40.0,
            kill_after_serving=120.0,
            restart_delay=10.0,
        ),
        Scenario(
            name="long-loading",
            summary="A large model that takes two hours to load: the port refuses all along, which is loading, "
            "not down.",
            gpu_memory_utilization=0.9,
            load_seconds=7200.0,
        ),
        _steady("default-steady", 0.90),
        _steady("tight-steady", 0.95),
        _tp_skew(),
        _foreign_process(),
        Scenario(
            name="startup-memory",
            summary="vLLM at gpu_memory_utilization 0.9 with a max_model_len its KV cache cannot hold: each start "
            "loads the weights for a minute, then cannot allocate the KV cache one request of the longest length "
            "needs, logs it and exits; relaunched 20 s later, it never serves.",
            gpu_memory_utilization=0.9,
            load_seconds=60.0,
            startup_fails_from_life=0,
            restart_delay=20.0,
        ),
        # The same with a smaller model: a restart cycle of 4.4 minutes (6.4 above), so three restarts fit in
        # RestartStorm's 15 minutes with room to spare on a busy host, where each relaunch takes longer.
        _overcommit("incident-quick", load=120.0),
        _long_warmup(),
    )
}
# The simulation's own names for scenarios the drill names otherwise: configurations and scripts that use them still
# run, as the same scenario.
ALIASES = {
    "overcommit": "incident",
    "overcommit-quick": "incident-quick",
    "leak": "slow-leak",
    "loading": "long-loading",
    "startup-oom": "startup-memory",
    "steady": "hot-steady",
}
# A name that says the engine too (the drill's): a scenario run on that engine's simulator, as `simulation.scenario`
# and `simulation.engine` would say it.
ON_ENGINE: dict[str, tuple[str, str]] = {"sglang-incident": ("incident-quick", "sglang")}
# Simulation only: no drill scenario has this name, and why (`oomguard drill` says it, naming what to run instead).
SIMULATION_ONLY = {
    "incident-quick": "the incident with a 2-minute model load is drilled on SGLang, as 'sglang-incident'; on vLLM "
    "the drill runs the incident itself, as 'incident'",
}
NAMES = (*SCENARIOS, *ON_ENGINE)  # the names to list (SCENARIOS holds the aliases too)
SCENARIOS.update({old: SCENARIOS[new] for old, new in ALIASES.items()})


def unknown_scenario(name: str, choices: Sequence[str], known: Iterable[str] = ()) -> str:
    """The one error of `serve --simulate` and `drill --scenario` for a name neither has: the name, the closest
    of `known` (default `choices`), and the choices."""
    close = difflib.get_close_matches(name, list(known) or list(choices), n=1) if len(name) <= LIMIT else []
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown scenario {excerpt(name)!r}; {hint}choose one of: {', '.join(choices)}"


def on_engine(name: str) -> tuple[str, str] | None:
    """(scenario, engine) for a name that says its engine (`sglang-incident`), else None."""
    return ON_ENGINE.get(name)


def check_scenario(name: str) -> None:
    """The simulation's `scenario:` (config_loader.py): a scenario's name, one with its engine, or an old name."""
    if name not in SCENARIOS and name not in ON_ENGINE:
        raise ValueError(unknown_scenario(name, NAMES, [*SCENARIOS, *ON_ENGINE]))
