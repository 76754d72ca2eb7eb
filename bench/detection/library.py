"""The detection library: realistic GPU memory histories, each with its OOMs and what a good monitor does with it.

Three kinds (`Spec.kind`):
- `healthy`: no OOM; a good monitor pages no one and tickets nothing (or nearly: a ticket on a healthy GPU is
  counted against the bundle).
- `incident`: OOMs a monitor can see coming (a climb, a leak, a foreign process growing, the postmortem's
  over-provisioned concurrency): each paged at least 5 minutes before its first OOM; the slow ones (under 1 GiB an
  hour) ticketed at least an hour before.
- `unforeseeable`: an OOM from nothing (one allocation far beyond any before it): nothing to see, so nothing to
  page before it (a page then is noise that happened to come first).

Deterministic: each history is generated from the library's seed and its own index; `library(seed)` gives the same
histories, line for line, on any machine. Sizes, rates and times are drawn within each spec's ranges, so another
seed gives other histories of the same classes (the held-out check of docs/performance.md, "Detection").
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from detection.fleet import Engine, Fleet, Gpu, OomEvent, Pressure, Spike
from detection.shapes import (
    A100_40,
    A100_80,
    DAY,
    H100,
    HOUR,
    L4,
    MIG_1G_10GB,
    MIG_2G_20GB,
    MINUTE,
    ForeignJob,
    GiB,
    Load,
    MiB,
)

T0 = 1_714_521_600  # 2024-05-01 00:00:00 UTC, a Wednesday
SLOW = GiB / HOUR  # under this pace, a leak must be ticketed an hour ahead


@dataclass
class Spec:
    name: str
    kind: str  # healthy, incident, unforeseeable
    summary: str
    days: float
    style: str  # write.STYLES
    build: Callable[[random.Random], tuple[list[Gpu], list[Engine]]]
    slow: bool = False  # its foreseeable OOMs come from a climb slower than 1 GiB/h: a ticket an hour ahead
    sleeps: bool = False  # the history says each engine's sleep state


@dataclass
class Built:
    spec: Spec
    fleet: Fleet
    seed: int
    ooms: list[OomEvent] = field(default_factory=list)


# -- builders -------------------------------------------------------------------------------------------------
def gpus(rng: random.Random, node: str, names: list[str], total: float) -> list[Gpu]:
    """An OOM where used reaches the total less the driver's allocation granularity (0 to 8 MiB): what runs a GPU
    out is the allocation that no longer fits in what is free, a leak's step or a transient on top of it
    (shapes.Transients)."""
    return [Gpu(node, name, total, margin=rng.uniform(0, 8) * MiB) for name in names]


def engine(rng: random.Random, target: str, slots: list[Gpu], weights: float, **kw: object) -> Engine:
    return Engine(target, [(g.node, g.name) for g in slots], slots[0].total, weights, rng.randrange(1 << 30), **kw)  # type: ignore[arg-type]


def load(rng: random.Random, **kw: float) -> Load:
    return Load(rng.randrange(1 << 30), peak_hour=rng.uniform(13, 17), **kw)


def one_each(rng: random.Random, node: str, count: int, total: float, weights: float, **kw: object):
    """`count` GPUs of a node, an engine on each."""
    slots = gpus(rng, node, [str(i) for i in range(count)], total)
    return slots, [engine(rng, f"{node}/vllm-{g.name}", [g], weights, load=load(rng), **kw) for g in slots]


def rolling(rng: random.Random, day: float, count: int) -> list[list[float]]:
    """A rolling deploy at `day` (in days): one engine after the other, 10 minutes apart."""
    at = day * DAY + rng.uniform(9, 11) * HOUR
    return [[at + i * 10 * MINUTE] for i in range(count)]


def with_deploys(engines: list[Engine], times: list[list[float]]) -> list[Engine]:
    for e, t in zip(engines, times, strict=True):
        e.deploys = t
    return engines


def nightly(days: float, rng: random.Random) -> list[tuple[float, float]]:
    """Asleep from about 22:00 to 06:00 every night (vLLM's sleep mode, level 1)."""
    return [(d * DAY + rng.uniform(21.5, 22.5) * HOUR, (d + 1) * DAY + rng.uniform(5.5, 6.5) * HOUR)
            for d in range(int(days))]  # fmt: skip


# -- healthy ----------------------------------------------------------------------------------------------
def h_diurnal_week(rng: random.Random):
    slots, engines = one_each(rng, "gpu-node-1", 8, H100, 16 * GiB)
    return slots, with_deploys(engines, rolling(rng, 3, 8))


def h_bursty_095(rng: random.Random):
    slots, engines = one_each(rng, "gpu-node-2", 4, H100, 16 * GiB, reservation=0.95)
    for e in engines:
        e.load = load(rng, bursts_per_day=14)
    return slots, engines


def h_tp4_groups(rng: random.Random):
    slots = gpus(rng, "gpu-node-3", [str(i) for i in range(8)], H100)
    a = engine(rng, "llm/llama-70b-a", slots[:4], 36 * GiB, load=load(rng), load_seconds=420)
    b = engine(rng, "llm/llama-70b-b", slots[4:], 36 * GiB, load=load(rng), load_seconds=420)
    a.deploys, b.deploys = [1.4 * DAY], [1.4 * DAY + 20 * MINUTE]
    return slots, [a, b]


def h_sglang(rng: random.Random):
    slots, engines = one_each(rng, "gpu-node-4", 2, H100, 16 * GiB, reservation=0.85, kind="sglang")
    return slots, engines


def h_sleep(rng: random.Random):
    slots, engines = one_each(rng, "gpu-node-5", 2, A100_80, 16 * GiB)
    for e in engines:
        e.sleeps = nightly(3, rng)
    return slots, engines


def h_deploys_often(rng: random.Random):
    slots, engines = one_each(rng, "gpu-node-6", 4, H100, 16 * GiB)
    for i, e in enumerate(engines):
        e.deploys = [k * 6 * HOUR + i * 7 * MINUTE + rng.uniform(0, 600) for k in range(1, 8)]
    return slots, engines


def h_non_reserving(rng: random.Random, total: float = A100_40, weights: float = 14 * GiB, per_load: float = 12 * GiB,
                    node: str = "gpu-node-7", count: int = 2, **load_kw: float):  # fmt: skip
    slots = gpus(rng, node, [str(i) for i in range(count)], total)
    engines = [
        engine(rng, f"{node}/server-{g.name}", [g], weights, kind="triton", reservation=None, per_load=per_load,
               load=load(rng, **load_kw), warm_up=60 * MiB)
        for g in slots
    ]  # fmt: skip
    return slots, engines


def h_non_reserving_hot(rng: random.Random):
    return h_non_reserving(rng, L4, 8 * GiB, 8 * GiB, "gpu-node-8", 2, bursts_per_day=10)


def h_non_reserving_steady(rng: random.Random):
    return h_non_reserving(rng, A100_80, 60 * GiB, 10 * GiB, "gpu-node-9", 1, amplitude=0.08, bursts_per_day=2)


def h_non_reserving_week(rng: random.Random):
    return h_non_reserving(rng, A100_80, 30 * GiB, 20 * GiB, "gpu-node-10", 1)


def h_mig_slices(rng: random.Random):
    slots = gpus(rng, "gpu-node-11", [f"0/{i}" for i in range(7, 14)], MIG_1G_10GB)
    return slots, [engine(rng, f"small/qwen-{g.name.replace('/', '-')}", [g], 3 * GiB, load=load(rng),
                          warm_up=40 * MiB) for g in slots]  # fmt: skip


def h_mig_non_reserving(rng: random.Random):
    slots = gpus(rng, "gpu-node-12", ["1/3", "1/4", "1/5"], MIG_2G_20GB)
    engines = [
        engine(rng, f"small/embed-{g.name.replace('/', '-')}", [g], 6 * GiB, kind="triton", reservation=None,
               per_load=7 * GiB, load=load(rng), warm_up=30 * MiB)
        for g in slots
    ]  # fmt: skip
    return slots, engines


def h_shared_two_engines(rng: random.Random):
    slots = gpus(rng, "gpu-node-13", ["0", "1"], H100)
    engines = []
    for g in slots:
        for part in ("a", "b"):
            engines.append(engine(rng, f"shared/vllm-{g.name}{part}", [g], 7 * GiB, reservation=0.45, load=load(rng)))
    return slots, engines


def h_shared_notebook(rng: random.Random):
    slots, engines = one_each(rng, "gpu-node-14", 2, H100, 16 * GiB, reservation=0.8)
    for g in slots:
        for d in range(3):
            start = d * DAY + rng.uniform(9, 11) * HOUR
            g.foreign.append(ForeignJob(start, start + rng.uniform(4, 8) * HOUR, rng.uniform(4, 9) * GiB,
                                        rng.uniform(50, 250) * MiB, rng.randrange(1 << 30)))  # fmt: skip
    return slots, engines


def h_allocator_steps(rng: random.Random):
    slots, engines = one_each(rng, "gpu-node-15", 4, H100, 16 * GiB, warm_up=300 * MiB)
    for i, e in enumerate(engines):
        e.deploys = [DAY + rng.uniform(8, 12) * HOUR + i * 600]
    return slots, engines


def h_tp8_long_load(rng: random.Random):
    slots = gpus(rng, "gpu-node-16", [str(i) for i in range(8)], H100)
    e = engine(rng, "llm/deepseek", slots, 62 * GiB, load=load(rng), load_seconds=40 * MINUTE, warm_seconds=300)
    e.deploys = [0.5 * DAY]
    return slots, [e]


def h_l4_small(rng: random.Random):
    return one_each(rng, "gpu-node-17", 4, L4, 5 * GiB, warm_up=50 * MiB)


def h_transient_spikes(rng: random.Random):
    slots, engines = one_each(rng, "gpu-node-18", 2, H100, 16 * GiB)
    for e in engines:
        e.spikes = [Spike(rng.uniform(0, 2 * DAY), rng.uniform(1.5, 4) * GiB, rng.uniform(30, 150)) for _ in range(6)]
    return slots, engines


def h_dcgm_week(rng: random.Random):
    return one_each(rng, "gpu-node-19", 4, H100, 16 * GiB, reservation=0.92)


def h_idle_then_engine(rng: random.Random):
    slots, engines = one_each(rng, "gpu-node-20", 4, H100, 16 * GiB)
    for i, e in enumerate(engines):
        e.starts = DAY + rng.uniform(9, 10) * HOUR + i * 120
    return slots, engines


def h_diurnal_small(rng: random.Random):
    return one_each(rng, "gpu-node-21", 4, A100_80, 14 * GiB)


def h_sglang_tp2(rng: random.Random):
    slots = gpus(rng, "gpu-node-22", ["0", "1", "2", "3"], H100)
    engines = [engine(rng, f"llm/sglang-{i}", slots[2 * i : 2 * i + 2], 20 * GiB, kind="sglang", reservation=0.88,
                      load=load(rng)) for i in range(2)]  # fmt: skip
    return slots, engines


def h_sleep_and_deploys(rng: random.Random):
    slots, engines = one_each(rng, "gpu-node-23", 2, H100, 16 * GiB)
    for e in engines:
        e.sleeps = nightly(2, rng)
        e.deploys = [DAY + rng.uniform(10, 14) * HOUR]
    return slots, engines


# -- incidents ----------------------------------------------------------------------------------------------
def headroom(reservation: float, total: float) -> float:
    return (1 - reservation) * total


def i_overprovisioning(rng: random.Random, count: int = 1, minutes: tuple[float, float] = (10, 20), tp: int = 1,
                       kind: str = "vllm", reservation: float = 0.9, node: str = "gpu-node-30"):  # fmt: skip
    """The postmortem: from mid-afternoon, long prompts at high concurrency grow the activations beyond the
    reservation until CUDA runs out; each relaunch dies again until the concurrency is lowered 70 to 100 minutes
    on."""
    slots = gpus(rng, node, [str(i) for i in range(count * tp)], H100)
    engines = []
    for i in range(count):
        group = slots[i * tp : (i + 1) * tp]
        e = engine(rng, f"llm/{kind}-{i}", group, 16 * GiB, kind=kind, reservation=reservation, load=load(rng),
                   load_seconds=rng.uniform(90, 240))  # fmt: skip
        if i == 0:
            start = rng.uniform(13, 16) * HOUR
            span = rng.uniform(*minutes) * MINUTE
            e.pressure = [Pressure(start, start + rng.uniform(70, 100) * MINUTE,
                                   headroom(reservation, H100) * rng.uniform(0.85, 1.0) / span)]  # fmt: skip
        engines.append(e)
    return slots, engines


def i_leak(rng: random.Random, rate: float, *, total: float = H100, reservation: float = 0.9, count: int = 1,
           node: str = "gpu-node-40", start_hours: tuple[float, float] = (1, 6), segment: float = 2 * MiB,
           weights: float = 16 * GiB):  # fmt: skip
    """The engine's own memory beyond its reservation grows `rate` bytes a second (a request's state never freed) in
    every life of the bad version: the first GPU's engine leaks, the others are healthy."""
    slots, engines = one_each(rng, node, count, total, weights, reservation=reservation)
    e = engines[0]
    e.leak, e.leak_start, e.leak_segment = rate * rng.uniform(0.9, 1.1), rng.uniform(*start_hours) * HOUR, segment
    return slots, engines


def i_fragmentation(rng: random.Random):
    slots, engines = one_each(rng, "gpu-node-50", 2, H100, 16 * GiB)
    engines[0].fragmentation = (rng.uniform(0.8, 1.4), rng.uniform(0.1, 0.2))
    engines[0].fragmentation_start = rng.uniform(1, 4) * HOUR
    return slots, engines


def i_foreign(rng: random.Random, growth: float, base: float, node: str = "gpu-node-51"):
    slots, engines = one_each(rng, node, 2, H100, 16 * GiB, reservation=0.8)
    start = rng.uniform(8, 12) * HOUR
    slots[0].foreign.append(ForeignJob(start, 30 * DAY, base, growth, rng.randrange(1 << 30)))
    return slots, engines


def i_tp_skew(rng: random.Random):
    slots = gpus(rng, "gpu-node-52", ["0", "1", "2", "3"], H100)
    e = engine(rng, "llm/llama-70b", slots, 36 * GiB, load=load(rng), load_seconds=400)
    e.leak, e.leak_start, e.leak_ranks = 400 * MiB / HOUR * rng.uniform(0.9, 1.1), rng.uniform(2, 6) * HOUR, (2,)
    return slots, [e]


def i_non_reserving_leak(rng: random.Random):
    slots, engines = h_non_reserving(rng, A100_40, 14 * GiB, 12 * GiB, "gpu-node-53", 1)
    engines[0].leak, engines[0].leak_start = 250 * MiB / HOUR * rng.uniform(0.9, 1.1), rng.uniform(1, 5) * HOUR
    engines[0].leak_segment = 20 * MiB
    return slots, engines


def i_leak_in_churn(rng: random.Random):
    slots, engines = h_non_reserving(rng, A100_80, 30 * GiB, 24 * GiB, "gpu-node-54", 1, bursts_per_day=12)
    engines[0].leak, engines[0].leak_start = 1.5 * GiB / HOUR * rng.uniform(0.9, 1.1), rng.uniform(4, 8) * HOUR
    engines[0].leak_segment = 20 * MiB
    return slots, engines


def i_shared_one_leaks(rng: random.Random):
    slots, engines = h_shared_two_engines(rng)
    engines[0].leak, engines[0].leak_start = 300 * MiB / HOUR * rng.uniform(0.9, 1.1), rng.uniform(1, 4) * HOUR
    return slots, engines


def i_bad_version(rng: random.Random):
    """A deploy brings a version that leaks 800 MiB/h on every GPU of the node; rolled back after the OOMs."""
    slots, engines = one_each(rng, "gpu-node-55", 8, H100, 16 * GiB)
    at = rng.uniform(9, 11) * HOUR
    for i, e in enumerate(engines):
        e.deploys = [at + i * 5 * MINUTE]
        e.leak, e.leak_start = 800 * MiB / HOUR * rng.uniform(0.8, 1.2), at + i * 5 * MINUTE
    return slots, engines


# -- unforeseeable ---------------------------------------------------------------------------------------------
def u_spike(rng: random.Random, node: str = "gpu-node-60", tp: int = 1, total: float = H100, weights: float = 16 * GiB):
    slots = gpus(rng, node, [str(i) for i in range(tp)], total)
    e = engine(rng, "llm/vllm", slots, weights, load=load(rng))
    e.spikes = [Spike(rng.uniform(10, 20) * HOUR, headroom(0.9, total) * 1.3, 60.0, rank=tp - 1)]
    return slots, [e]


def u_foreign_grab(rng: random.Random):
    slots, engines = one_each(rng, "gpu-node-61", 1, H100, 16 * GiB, reservation=0.8)
    start = rng.uniform(10, 18) * HOUR
    slots[0].foreign.append(ForeignJob(start, start + HOUR, 20 * GiB, 0.0, rng.randrange(1 << 30)))
    return slots, engines


def u_non_reserving_burst(rng: random.Random):
    slots, engines = h_non_reserving(rng, A100_40, 14 * GiB, 10 * GiB, "gpu-node-62", 1)
    engines[0].spikes = [Spike(rng.uniform(10, 20) * HOUR, 24 * GiB, 45.0)]
    return slots, engines


def u_mig(rng: random.Random):
    return u_spike(rng, "gpu-node-63", 1, MIG_1G_10GB, 3 * GiB)


# -- the library ------------------------------------------------------------------------------------------------
def _spec(name: str, kind: str, summary: str, days: float, style: str, build, **kw: bool) -> Spec:  # type: ignore[no-untyped-def]
    return Spec(name, kind, summary, days, style, build, **kw)


SPECS: list[Spec] = [
    # healthy
    _spec(
        "vllm-diurnal-week",
        "healthy",
        "8 vLLM at 0.90 under a daily cycle and bursts for a week, a rolling deploy",
        7,
        "node",
        h_diurnal_week,
    ),
    _spec("vllm-bursty-0.95", "healthy", "4 vLLM at 0.95, many bursts", 3, "node", h_bursty_095),
    _spec("vllm-tp4-groups", "healthy", "two TP=4 groups (7-minute load), a deploy", 3, "node", h_tp4_groups),
    _spec("sglang-0.85", "healthy", "SGLang at mem_fraction_static 0.85", 2, "node", h_sglang),
    _spec(
        "vllm-sleep-nightly",
        "healthy",
        "vLLM asleep every night (its sleep state told)",
        3,
        "node",
        h_sleep,
        sleeps=True,
    ),
    _spec("vllm-sleep-nightly-dcgm", "healthy", "the same, read from dcgm-exporter: no state", 3, "dcgm", h_sleep),
    _spec(
        "vllm-deploys-every-6h",
        "healthy",
        "a deploy every 6 hours, read from dcgm-exporter (loading not told)",
        2,
        "dcgm",
        h_deploys_often,
    ),
    _spec(
        "non-reserving-diurnal",
        "healthy",
        "a server that allocates as the load comes (A100 40 GB)",
        4,
        "node",
        h_non_reserving,
    ),
    _spec("non-reserving-hot-l4", "healthy", "the same on L4s, hot (peaks near 88 %)", 2, "node", h_non_reserving_hot),
    _spec(
        "non-reserving-steady",
        "healthy",
        "a non-reserving server at a steady 80-88 %",
        2,
        "bare",
        h_non_reserving_steady,
    ),
    _spec(
        "non-reserving-week",
        "healthy",
        "a non-reserving server for a week, weekend included",
        7,
        "dcgm",
        h_non_reserving_week,
    ),
    _spec("mig-1g-slices", "healthy", "seven 1g.10gb MIG slices, a small vLLM on each", 2, "node", h_mig_slices),
    _spec(
        "mig-2g-non-reserving", "healthy", "three 2g.20gb slices, non-reserving servers", 2, "node", h_mig_non_reserving
    ),
    _spec("shared-two-engines", "healthy", "two vLLMs at 0.45 on each GPU", 3, "node", h_shared_two_engines),
    _spec("shared-notebook", "healthy", "vLLM at 0.80 beside a notebook by day", 3, "node", h_shared_notebook),
    _spec(
        "allocator-steps",
        "healthy",
        "vLLM whose allocator reserves ~300 MiB more in its first hours",
        2,
        "node",
        h_allocator_steps,
    ),
    _spec("tp8-long-load", "healthy", "TP=8 with a 40-minute load, redeployed", 1, "dcgm", h_tp8_long_load),
    _spec("l4-small-models", "healthy", "small models on L4s", 2, "dcgm", h_l4_small),
    _spec(
        "transient-spikes",
        "healthy",
        "allocations of 1.5-4 GiB for a minute or two (long prompts) that fit",
        2,
        "node",
        h_transient_spikes,
    ),
    _spec("vllm-0.92-week-dcgm", "healthy", "4 vLLM at 0.92 for a week from dcgm-exporter", 7, "dcgm", h_dcgm_week),
    _spec("idle-then-engines", "healthy", "idle GPUs, then engines started on them", 2, "dcgm", h_idle_then_engine),
    _spec("vllm-diurnal-a100", "healthy", "4 vLLM at 0.90 on A100s", 3, "bare", h_diurnal_small),
    _spec("sglang-tp2", "healthy", "two SGLang TP=2 engines at 0.88", 2, "dcgm", h_sglang_tp2),
    _spec(
        "sleep-and-deploys", "healthy", "asleep at night, a deploy by day", 2, "node", h_sleep_and_deploys, sleeps=True
    ),
    # incidents
    _spec(
        "incident",
        "incident",
        "the postmortem: concurrency fills the headroom in 10-20 min, relaunches die",
        1,
        "node",
        i_overprovisioning,
    ),
    _spec(
        "incident-slower",
        "incident",
        "the same, 30-50 min to fill, 4 GPUs",
        1,
        "node",
        lambda r: i_overprovisioning(r, 4, (30, 50), node="gpu-node-31"),
    ),
    _spec(
        "incident-tp2-dcgm",
        "incident",
        "the incident on a TP=2 engine, from dcgm-exporter",
        1,
        "dcgm",
        lambda r: i_overprovisioning(r, 1, (12, 25), tp=2, node="gpu-node-32"),
    ),
    _spec(
        "incident-sglang",
        "incident",
        "the incident on SGLang at 0.88",
        1,
        "node",
        lambda r: i_overprovisioning(r, 2, (15, 30), kind="sglang", reservation=0.88, node="gpu-node-33"),
    ),
    _spec(
        "leak-2gib-h",
        "incident",
        "a leak of 2 GiB/h, every life",
        1,
        "node",
        lambda r: i_leak(r, 2 * GiB / HOUR, segment=20 * MiB, node="gpu-node-41"),
    ),
    _spec(
        "leak-1gib-h",
        "incident",
        "a leak of 1 GiB/h",
        2,
        "dcgm",
        lambda r: i_leak(r, GiB / HOUR, count=2, segment=20 * MiB, node="gpu-node-42"),
    ),
    _spec(
        "leak-500mib-h",
        "incident",
        "a leak of 500 MiB/h",
        2,
        "node",
        lambda r: i_leak(r, 500 * MiB / HOUR, count=2, node="gpu-node-43"),
        slow=True,
    ),
    _spec(
        "leak-200mib-h",
        "incident",
        "a leak of 200 MiB/h",
        3,
        "node",
        lambda r: i_leak(r, 200 * MiB / HOUR, count=2, node="gpu-node-44"),
        slow=True,
    ),
    _spec(
        "leak-100mib-h",
        "incident",
        "a leak of 100 MiB/h over days",
        4,
        "dcgm",
        lambda r: i_leak(r, 100 * MiB / HOUR, count=2, node="gpu-node-45"),
        slow=True,
    ),
    _spec(
        "leak-50mib-h-week",
        "incident",
        "a leak of 50 MiB/h over a week",
        7,
        "node",
        lambda r: i_leak(r, 50 * MiB / HOUR, node="gpu-node-46", start_hours=(1, 3)),
        slow=True,
    ),
    _spec(
        "leak-30mib-h-0.95",
        "incident",
        "a leak of 30 MiB/h into the 4 GiB a 0.95 reservation leaves",
        6,
        "node",
        lambda r: i_leak(r, 30 * MiB / HOUR, reservation=0.95, node="gpu-node-47", start_hours=(1, 3)),
        slow=True,
    ),
    _spec(
        "leak-mig-1g",
        "incident",
        "a 1g.10gb slice leaking 20 MiB/h",
        3,
        "node",
        lambda r: i_leak(
            r, 20 * MiB / HOUR, total=MIG_1G_10GB, weights=3 * GiB, node="gpu-node-48", start_hours=(1, 3)
        ),
        slow=True,
    ),
    _spec(
        "leak-300mib-h-bare",
        "incident",
        "a leak of 300 MiB/h, GPU memory and reservation only",
        2,
        "bare",
        lambda r: i_leak(r, 300 * MiB / HOUR, count=3, node="gpu-node-49", segment=20 * MiB),
        slow=True,
    ),
    _spec("fragmentation", "incident", "fragmentation that worsens with uptime", 3, "node", i_fragmentation, slow=True),
    _spec(
        "foreign-fast",
        "incident",
        "another process grows 3 GiB/h beside vLLM at 0.80",
        1,
        "node",
        lambda r: i_foreign(r, 3 * GiB, 5 * GiB),
    ),
    _spec(
        "foreign-slow",
        "incident",
        "another process grows 300 MiB/h beside vLLM at 0.80",
        3,
        "dcgm",
        lambda r: i_foreign(r, 300 * MiB, 2 * GiB, "gpu-node-56"),
        slow=True,
    ),
    _spec("tp-skew", "incident", "one rank of a TP=4 engine leaks 400 MiB/h", 2, "node", i_tp_skew, slow=True),
    _spec(
        "non-reserving-leak",
        "incident",
        "a non-reserving server leaking 250 MiB/h under its daily cycle",
        3,
        "node",
        i_non_reserving_leak,
        slow=True,
    ),
    _spec(
        "leak-in-churn",
        "incident",
        "a non-reserving server leaking 1.5 GiB/h under bursty load",
        1.5,
        "node",
        i_leak_in_churn,
    ),
    _spec(
        "shared-one-leaks",
        "incident",
        "two vLLMs at 0.45 on a GPU, one leaks 300 MiB/h",
        2,
        "node",
        i_shared_one_leaks,
        slow=True,
    ),
    _spec("bad-version", "incident", "a deploy brings a 800 MiB/h leak to 8 GPUs", 1, "node", i_bad_version, slow=True),
    _spec(
        "leak-700mib-h-l4",
        "incident",
        "a small model on an L4 leaking 700 MiB/h",
        1,
        "dcgm",
        lambda r: i_leak(r, 700 * MiB / HOUR, total=L4, weights=5 * GiB, count=2, node="gpu-node-57", segment=20 * MiB),
        slow=True,
    ),
    # unforeseeable
    _spec("spike", "unforeseeable", "one allocation beyond the headroom at once", 1, "node", u_spike),
    _spec("spike-tp2", "unforeseeable", "one rank of a TP=2 engine", 1, "dcgm", lambda r: u_spike(r, "gpu-node-64", 2)),
    _spec("foreign-grab", "unforeseeable", "another process takes 20 GiB at once", 1, "node", u_foreign_grab),
    _spec("non-reserving-burst", "unforeseeable", "a burst far beyond any before", 1, "node", u_non_reserving_burst),
    _spec("spike-mig", "unforeseeable", "a MIG slice's engine allocates beyond its slice", 1, "node", u_mig),
]


def build(spec: Spec, seed: int) -> Built:
    index = SPECS.index(spec)
    rng = random.Random(seed * 1_000_003 + index)
    slots, engines = spec.build(rng)
    return Built(spec, Fleet(slots, engines, rng.randrange(1 << 30)), seed)
