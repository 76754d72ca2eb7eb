"""Synthetic oomguard histories shaped like the drill scenarios, written as OpenMetrics for promtool's backfill.

Each scenario is one `instance` (its name) with one target `vllm` on GPU 0 of 80 GiB, sampled every
15 s over one hour: what a Prometheus scraping that exporter would hold.

Without the per-GPU join (`join=False`), a history is what a Prometheus holds of an older exporter, or of a GPU
whose join could not be written: instance `NAME-nojoin`, the same series less the `oomguard_gpu_memory_engine_*`,
`..._other_used_bytes`, `..._unreserved_used_bytes` and `..._headroom_used_ratio` ones (JOIN_SERIES).

Compressed (`time_scale` > 1), a history is what a drill's Prometheus would hold of the same scenario run that
many times faster than life: instance `NAME-xSCALE`, its timestamps divided by the scale from its start, and so
are the times the exporter measures on its own (real) clock: the startup, the last event's timestamp.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

# The per-GPU join of a GPU with its engines, as diagnose names it: left out with join=False.
from oomguard.diagnose.evidence import JOIN_SERIES

GIB = 1024**3
TOTAL = 80 * GIB
STEP = 15.0
SPAN = 3600.0
STATES = ("steady", "sawtooth", "climbing", "spike", "saturated")
LOG_KINDS = ("cuda_oom", "startup_memory", "engine_death")
TIME_SCALE = 30.0  # the drill's clock: the histories are also backfilled this many times faster


def _jitter(t: float, scale: float) -> float:
    x = math.sin(t * 12.9898 + 78.233) * 43758.5453
    return (x - math.floor(x) - 0.5) * 2 * scale


@dataclass
class Moment:
    """What the exporter says at one instant."""

    engine_use: float  # share of the GPU the engine's processes hold
    other_use: float = 0.006  # driver contexts, other processes
    up: bool = True
    loading: bool = False
    kv: float = 0.4
    waiting: float = 0.0
    running: float = 6.0
    trend: str = "steady"


@dataclass
class History:
    name: str
    util: float | None  # the engine's gpu_memory_utilization; None: the engine never answered
    moment: Callable[[float], Moment]
    # Events: kind -> times (seconds from the start); restarts; startups measured.
    events: dict[str, list[float]] = field(default_factory=dict)
    restarts: list[float] = field(default_factory=list)
    startup_seconds: list[tuple[float, float]] = field(default_factory=list)  # (from time, value)
    preemptions: Callable[[float], float] = lambda t: 0.0
    kv_pool_bytes: float | None = None
    bare: bool = False  # only the target's identity: no memory, engine or event series
    engine: str = "vllm"
    # oomguard_engine_setting: setting -> (value, origin), as the exporter reads them from a local engine's command line
    settings: dict[str, tuple[float, str]] = field(default_factory=dict)
    # NVML lists the engine's pids (a local engine): its own processes' memory is known, and the join attributes.
    own_processes: bool = True


def _lives(t: float, durations: list[float], delay: float) -> tuple[int, float, bool]:
    """(life index, seconds into it, alive) for lives of these durations separated by `delay`."""
    start = 0.0
    for i, d in enumerate(durations):
        if t < start + d:
            return i, t - start, True
        if t < start + d + delay:
            return i, t - start - d, False
        start += d + delay
    return len(durations), t - start, True


def _deaths(durations: list[float], delay: float) -> tuple[list[float], list[float]]:
    """(death times, relaunch times) within the span."""
    deaths, launches, start = [], [], 0.0
    for d in durations:
        if start + d >= SPAN:
            break
        deaths.append(start + d)
        start += d + delay
        if start < SPAN:
            launches.append(start)
    return deaths, launches


def _loading(s: float, load: float, serving: float) -> Moment:
    use = 0.2 * s / load if s < load * 0.8 else serving * 0.97
    return Moment(use, up=False, loading=True, kv=0.0, running=0.0)


def _relaunched(
    durations: list[float], delay: float, load: float, serving_use: float, serve: Callable[[int, float, float], Moment]
) -> Callable[[float], Moment]:
    """The moments of an engine that lives `durations` separated by `delay` down: each life loads for `load` s up to
    `serving_use` of the GPU, then serves: `serve(life index, t, seconds serving)`."""

    def moment(t: float) -> Moment:
        life, s, alive = _lives(t, durations, delay)
        if not alive:
            return Moment(0.0, up=False, kv=0.0, running=0.0)
        if s < load:
            return _loading(s, load, serving_use)
        return serve(life, t, s - load)

    return moment


def _churn(s: float) -> tuple[float, float, float]:
    c = (s % 40.0) / 40.0
    return 0.25 + 0.35 * c, float(int(2 * c)), float(4 + int(6 * c))


# ---- the scenarios -----------------------------------------------------------------------------


def incident() -> History:
    """The postmortem: load 4 min, KV and queue saturate, memory 0.86 -> 0.99, CUDA OOM, retries at once."""
    load, delay = 240.0, 30.0
    first = load + 60 + 560
    durations = [first] + [load + 112] * 20

    def serve(life: int, t: float, serving: float) -> Moment:
        spike_after, spike_len = (60.0, 600.0) if life == 0 else (0.0, 120.0)
        over = max(0.0, serving - spike_after)
        use = 0.86 + 0.14 * min(1.0, over / spike_len) + _jitter(t, 0.001)
        kv = min(1.0, 0.6 + over / 30.0) if over else 0.5
        trend = "saturated" if use >= 0.97 else "spike" if use >= 0.9 else "steady"
        return Moment(min(use, 0.995), kv=kv, waiting=min(48.0, 2 + over / 2) if over else 1.0,
                      running=16.0 if over else 8.0, trend=trend)  # fmt: skip

    deaths, launches = _deaths(durations, delay)
    return History(
        "incident", 0.9, _relaunched(durations, delay, load, 0.86, serve), events={"cuda_oom": deaths},
        restarts=launches, startup_seconds=[(load, load)], kv_pool_bytes=40 * GIB,
        preemptions=lambda t: _preempt(t, durations, delay, load, [60.0] + [0.0] * 20),
    )  # fmt: skip


def _preempt(t: float, durations: list[float], delay: float, load: float, spike_after: list[float]) -> float:
    """Cumulative preemptions: 0.8 per second of overload past 15 s, summed over lives (the counter survives)."""
    total, start = 0.0, 0.0
    for i, d in enumerate(durations):
        s = min(t - start, d)
        if s <= 0:
            break
        over = s - load - spike_after[i] - 15
        total += max(0.0, over) * 0.8
        start += d + delay
    return float(int(total))


def slow_leak() -> History:
    """1 % of the GPU per minute from 56 %, never falling back, past the 0.6 budget to CUDA OOM at ~43 min."""
    load, delay = 25.0, 5.0
    durations = [load + 0.43 / (0.01 / 60), SPAN]

    def serve(_: int, t: float, serving: float) -> Moment:
        use = 0.56 + 0.01 / 60 * serving + _jitter(t, 0.001)
        kv, waiting, running = _churn(serving)
        trend = "saturated" if use >= 0.97 else "climbing" if serving > 600 else "steady"
        return Moment(min(use, 0.995), kv=kv, waiting=waiting, running=running, trend=trend)

    deaths, launches = _deaths(durations, delay)
    return History("slow-leak", 0.6, _relaunched(durations, delay, load, 0.56, serve), events={"cuda_oom": deaths},
                   restarts=launches, startup_seconds=[(load, load)])  # fmt: skip


def foreign_process() -> History:
    """The engine holds its 0.90 reservation; another process on its GPU grows 0.6 % -> 9.6 %, then CUDA OOM."""
    oom = 3000.0

    def moment(t: float) -> Moment:
        other = 0.006 + 0.09 * min(1.0, t / oom)
        kv, waiting, running = _churn(t)
        total = 0.9 + other
        trend = "saturated" if total >= 0.97 else "climbing" if t > 900 else "steady"
        return Moment(0.9 + _jitter(t, 0.0005), other_use=other, kv=kv, waiting=waiting, running=running,
                      trend=trend)  # fmt: skip

    return History("foreign-process", 0.9, moment, events={"cuda_oom": [oom]}, startup_seconds=[(0.0, 45.0)])


def probe_kill(name: str = "probe-kill", load: float = 75.0, kill_after: float = 30.0) -> History:
    """Memory normal (62 %); the engine is killed `kill_after` s after it comes up: restarts, no OOM."""
    delay = 10.0
    durations = [load + kill_after] * 100

    def serve(_: int, t: float, serving: float) -> Moment:
        kv, waiting, running = _churn(serving)
        return Moment(0.62 + _jitter(t, 0.001), kv=kv, waiting=waiting, running=running, trend="sawtooth")

    _, launches = _deaths(durations, delay)
    return History(name, 0.9, _relaunched(durations, delay, load, 0.62, serve), restarts=launches,
                   startup_seconds=[(load, load)])  # fmt: skip


def startup_memory() -> History:
    """Another process holds 20 %; the engine asks 0.9, fails to allocate its KV cache at start, again and again."""
    attempt, delay = 50.0, 10.0
    durations = [attempt] * 100

    def moment(t: float) -> Moment:
        _, s, alive = _lives(t, durations, delay)
        engine = 0.2 * s / attempt if alive else 0.0
        return Moment(engine, other_use=0.2, up=False, loading=alive, kv=0.0, running=0.0, trend="sawtooth")

    deaths, launches = _deaths(durations, delay)
    return History("startup-memory", None, moment, events={"startup_memory": deaths}, restarts=launches)


def healthy() -> History:
    """vLLM at 0.90, 90.6 % of the GPU, steady; KV cache churning; nothing happens."""

    def moment(t: float) -> Moment:
        kv, waiting, running = _churn(t)
        return Moment(0.9 + 0.002 * math.sin(t / 7.0), kv=kv, waiting=waiting, running=running, trend="sawtooth")

    return History("healthy", 0.9, moment, startup_seconds=[(0.0, 30.0)])


def tight_steady() -> History:
    """The same at 0.95: 95.6 % of the GPU all hour, which is the reservation, not the top."""

    def moment(t: float) -> Moment:
        kv, waiting, running = _churn(t)
        return Moment(0.95 + 0.002 * math.sin(t / 7.0), kv=kv, waiting=waiting, running=running, trend="sawtooth")

    return History("tight-steady", 0.95, moment, startup_seconds=[(0.0, 30.0)])


def _admitting(t: float, held: float = 16.0, few: bool = False) -> Moment:
    """A steady server whose KV cache holds about `held` requests of the size it serves: 8-14 requests fill
    50-92 % of it (`few`: 1-3 requests, 6-19 %, too few to size the cache from); memory at its reservation."""
    c = (t % 60.0) / 60.0
    running = float(1 + int(3 * c)) if few else float(8 + int(7 * c))
    kv = running / held * (0.95 + 0.1 * ((t * 7.0) % 13.0) / 13.0)
    return Moment(0.9 + 0.002 * math.sin(t / 7.0), kv=kv, waiting=float(int(2 * c)), running=running,
                  trend="sawtooth")  # fmt: skip


def over_admitted() -> History:
    """vLLM at 0.90 started with --max-num-seqs 256, its KV cache holding ~16 requests of the size it serves; a
    few preemptions in the hour. No OOM yet: the two-knob check's finding alone (capacity.py)."""
    return History("over-admitted", 0.9, _admitting, startup_seconds=[(0.0, 30.0)],
                   preemptions=lambda t: float(int(t / 600)),
                   settings={"max_num_seqs": (256.0, "flag"), "gpu_memory_utilization": (0.9, "flag")})  # fmt: skip


def within_cap() -> History:
    """The same server with --max-num-seqs 18: about what its KV cache holds (within the margin)."""
    return History("within-cap", 0.9, _admitting, startup_seconds=[(0.0, 30.0)],
                   settings={"max_num_seqs": (18.0, "flag"), "gpu_memory_utilization": (0.9, "flag")})  # fmt: skip


def few_running() -> History:
    """--max-num-seqs 256 at 0.90, but 1-3 requests at a time: too few to say what the cache holds."""
    return History("few-running", 0.9, lambda t: _admitting(t, few=True), startup_seconds=[(0.0, 30.0)],
                   settings={"max_num_seqs": (256.0, "flag"), "gpu_memory_utilization": (0.9, "default")})  # fmt: skip


def sglang_over() -> History:
    """SGLang at mem_fraction_static 0.80 with max_running_requests 64: room to grow the cache up to 0.85."""

    def moment(t: float) -> Moment:
        m = _admitting(t)
        return Moment(0.8 + 0.002 * math.sin(t / 7.0), kv=m.kv, waiting=m.waiting, running=m.running,
                      trend="sawtooth")  # fmt: skip

    return History("sglang-over", 0.8, moment, startup_seconds=[(0.0, 30.0)], engine="sglang",
                   settings={"max_running_requests": (64.0, "flag"), "mem_fraction_static": (0.8, "flag")})  # fmt: skip


def bare() -> History:
    return History("bare", 0.9, lambda t: Moment(0.5), bare=True)


def all_histories() -> list[History]:
    liveness = probe_kill("probe-kill-liveness", load=40.0, kill_after=120.0)
    return [incident(), slow_leak(), foreign_process(), probe_kill(), liveness, startup_memory(), healthy(),
            tight_steady(), bare(), over_admitted(), within_cap(), few_running(), sglang_over()]  # fmt: skip


# ---- rendering ---------------------------------------------------------------------------------


def instance(name: str, time_scale: float = 1.0, join: bool = True) -> str:
    """The instance label of a history, compressed or not, with its per-GPU join or without."""
    return (name if time_scale == 1 else f"{name}-x{time_scale:g}") + ("" if join else "-nojoin")


def samples(
    h: History, start: float, time_scale: float = 1.0, join: bool = True
) -> dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]]:
    """Every series of one history: (name, labels) -> [(unix time, value)], on a clock `time_scale` times faster;
    without the per-GPU join series (JOIN_SERIES) where `join` is False."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {}
    base = {"instance": instance(h.name, time_scale, join), "job": "oomguard"}

    def real(t: float) -> float:
        return start + t / time_scale

    def add(name: str, t: float, value: float, **labels: str) -> None:
        if not join and name in JOIN_SERIES:
            return
        key = (name, tuple(sorted((base | labels).items())))
        out.setdefault(key, []).append((real(t), value))

    n = int(SPAN / STEP)
    for i in range(n + 1):
        t = i * STEP
        add("oomguard_target_info", t, 1.0, target="vllm", engine=h.engine, url="http://127.0.0.1:8000")
        if h.bare:
            add("oomguard_target_state", t, 1.0, target="vllm", state="up")
            continue
        m = h.moment(t)
        used = m.engine_use + m.other_use
        for setting, (value, origin) in h.settings.items():
            add("oomguard_engine_setting", t, value, target="vllm", engine=h.engine, setting=setting, origin=origin)
        add("oomguard_gpu_memory_total_bytes", t, TOTAL, gpu="0")
        add("oomguard_gpu_memory_used_bytes", t, used * TOTAL, gpu="0")
        add("oomguard_gpu_memory_used_ratio", t, used, gpu="0")
        add("oomguard_target_gpu_info", t, 1.0, target="vllm", gpu="0")
        for state in STATES:
            add("oomguard_gpu_memory_trend_state", t, float(state == m.trend), gpu="0", state=state)
            add("oomguard_target_memory_trend_state", t, float(state == m.trend), target="vllm", memory="gpu",
                state=state)  # fmt: skip
        for state in ("up", "loading", "down"):
            now = "up" if m.up else "loading" if m.loading else "down"
            add("oomguard_target_state", t, float(state == now), target="vllm", state=state)
        # NVML lists the engine's processes while they live (join.py: no pid matched, no figure).
        own = m.engine_use if h.own_processes and m.engine_use > 0 else None
        if own is not None:
            add("oomguard_target_process_gpu_memory_bytes", t, own * TOTAL, target="vllm")
        if m.up and h.util is not None:
            # The reservation counts only an awake engine that says it: while it answers (join.py's join_gpu).
            reserved = h.util
            add("oomguard_gpu_memory_engine_reserved_bytes", t, reserved * TOTAL, gpu="0")
            if own is not None:
                over = max(0.0, own - reserved)
                add("oomguard_gpu_memory_engine_used_bytes", t, own * TOTAL, gpu="0")
                add("oomguard_gpu_memory_engine_over_reservation_bytes", t, over * TOTAL, gpu="0")
                add("oomguard_gpu_memory_other_used_bytes", t, (used - own) * TOTAL, gpu="0")
                unreserved = over + used - own
            else:
                unreserved = max(0.0, used - reserved)
            add("oomguard_gpu_memory_unreserved_used_bytes", t, unreserved * TOTAL, gpu="0")
            add("oomguard_gpu_memory_headroom_used_ratio", t, unreserved / (1 - reserved), gpu="0")
            add("oomguard_target_memory_budget_bytes", t, reserved * TOTAL, target="vllm")
            # join.py's join: the target's own processes minus the budget where known, else the whole GPU's use.
            add("oomguard_target_memory_over_budget_bytes", t, ((used if own is None else own) - reserved) * TOTAL,
                target="vllm")  # fmt: skip
            add("oomguard_engine_gpu_memory_utilization_ratio", t, h.util, target="vllm")
            if h.kv_pool_bytes:
                add("oomguard_engine_kv_cache_memory_bytes", t, h.kv_pool_bytes, target="vllm")
            model = {"target": "vllm", "model_name": "llama"}
            add("oomguard_engine_kv_cache_usage_ratio", t, m.kv, **model)
            add("oomguard_engine_requests_waiting", t, m.waiting, **model)
            add("oomguard_engine_requests_running", t, m.running, **model)
            add("oomguard_engine_preemptions_total", t, h.preemptions(t), **model)
        for kind in LOG_KINDS:
            times = [x for x in h.events.get(kind, []) if x <= t]
            add("oomguard_target_events_total", t, float(len(times)), target="vllm", kind=kind)
            if times:
                add("oomguard_target_last_event_timestamp_seconds", t, real(times[-1]), target="vllm", kind=kind)
        add("oomguard_target_restarts_total", t, float(sum(1 for x in h.restarts if x <= t)), target="vllm")
        measured = [v for since, v in h.startup_seconds if since <= t]
        if measured:
            add("oomguard_target_startup_seconds", t, measured[-1] / time_scale, target="vllm")
    return out


def openmetrics(
    histories: list[History], start: float, compressed: tuple[float, float] | None = None, nojoin: bool = False
) -> str:
    """The histories from `start`; with `compressed` (start, time_scale), each also compressed, from that start;
    with `nojoin`, each also without its per-GPU join (instances NAME-nojoin), from `start`."""
    lines = []
    merged: dict = {}
    for h in histories:
        merged.update(samples(h, start))
        if nojoin:
            merged.update(samples(h, start, join=False))
        if compressed is not None:
            merged.update(samples(h, *compressed))
    for name in sorted({k[0] for k in merged}):
        for key in sorted(k for k in merged if k[0] == name):
            labels = ",".join(f'{k}="{v}"' for k, v in key[1])
            lines += [f"{name}{{{labels}}} {v!r} {t:.3f}" for t, v in merged[key]]
    return "\n".join(lines) + "\n# EOF\n"
