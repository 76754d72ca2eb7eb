"""Drill scenarios: the incident and its look-alikes, each with the alerts it must and must not raise.

Durations are simulated time; the drill runs them `time_scale` times faster, and the
bundle's durations and the trend windows are divided by the same factor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from oomguard.simulate.scenarios import ALIASES, SIMULATION_ONLY, unknown_scenario

PAGER, TICKET = "pager", "ticket"
# Fires in Prometheus but reaches no receiver: an info alert (not routed), or one its critical twin inhibits.
NOT_DELIVERED = None
# Fires; reaches the ticket queue unless a critical twin fires at the time and inhibits it (a race by design).
TICKET_OR_INHIBITED = "ticket?"
MEMORY_ALERTS = (
    "GpuMemoryHigh", "GpuMemoryCritical", "GpuMemoryClimbing", "TargetMemoryClimbing",
    "GpuMemoryClimbingPredicted", "GpuMemoryExhaustedSoon", "TargetMemoryOverBudget",
)  # fmt: skip
# The engine's life: none of them may reach anyone on a healthy server.
ENGINE_ALERTS = (
    "OomEvent", "RestartStorm", "RestartsWithoutOom", "StartupSlowerThanProbe", "TargetDown", "TargetLoadingTooLong",
    "QueueBacklog", "KvCacheSaturated",
)  # fmt: skip


# The orchestrator's probe delay in these drills: 3 minutes (the incident's engine needs 4 to load).
# Generous, because a real process also spends a second or two importing, which a 30x drill
# multiplies into simulated minutes.
PROBE = {"alerts": {"startup_slower_than_probe": {"probe_initial_delay_seconds": 180}}}
# A healthy deployment's probe waits well beyond its startup, and the scenarios that are not about the probe say so:
# the drill's fixed costs grow with the time scale. Prometheus scrapes first some 5 s after the engine is launched,
# and the startup is measured to the first scrape that finds it up: 25 s of model load read as 150 to 180 simulated
# seconds at 30x, 300 at 60x (the steady scenarios run an hour, and their test runs them at 60x).
# The engine's own memory never moves and never exceeds its budget: OverBudget (its own processes against its
# budget) stays quiet, and so does TargetMemoryClimbing (the engine's host memory). The GPU's alerts see the other
# process's memory beyond the reservation; the diagnosis is what tells the other process apart.
FOREIGN_QUIET = (
    "TargetMemoryOverBudget",
    "TargetMemoryClimbing",
    "QueueBacklog",
    "KvCacheSaturated",
    "RestartsWithoutOom",
)
HEALTHY_PROBE = {"alerts": {"startup_slower_than_probe": {"probe_initial_delay_seconds": 600}}}
# The incident, on either engine: a page before the OOM, the OOM and the restart loop; the slow start, the
# queue and the full KV cache ticketed.
INCIDENT = {
    "GpuMemoryExhaustedSoon": PAGER,
    "OomEvent": PAGER,
    "RestartStorm": PAGER,
    "StartupSlowerThanProbe": TICKET,
    "QueueBacklog": TICKET,
    "KvCacheSaturated": TICKET,
}
INCIDENT_QUIET = ("RestartsWithoutOom", "TargetDown", "ExporterDown", "SourceFailing")
# Where memory runs out, a memory alert the scenario does not expect is a true alarm racing the ones it does (the
# sglang-incident's TargetMemoryOverBudget, half a minute before its OOM): allowed, not failed.
OOM_RACE = MEMORY_ALERTS


@dataclass(frozen=True)
class DrillScenario:
    name: str
    summary: str
    simulation: str  # a scenario of oomguard.simulate
    minutes: float  # simulated minutes to run
    # Alert (without the bundle's prefix) -> the receiver it must reach (None: info, fires but is not routed).
    expected: dict[str, str | None]
    quiet: tuple[str, ...]
    # What `oomguard diagnose` must conclude from the drill's Prometheus (a verdict of diagnose/verdict.py).
    verdict: str
    memory_alert_before_oom: bool = False
    bundle: dict = field(default_factory=lambda: PROBE)  # bundle configuration overrides
    engine: str = "vllm"  # the simulated engine (simulation.engine): one with a simulator
    # Alerts neither expected nor quiet that may arrive all the same (the report says `allowed`); any other that
    # arrives is `unexpected` and fails the drill.
    may_arrive: tuple[str, ...] = ()


SCENARIOS: dict[str, DrillScenario] = {
    s.name: s
    for s in (
        DrillScenario(
            name="incident",
            summary="The postmortem replayed: over-provisioned concurrency, KV cache and queue growth, memory "
            "past 90 % and 95 %, CUDA OOM, and a restart loop whose model load (4 minutes) is longer than the "
            "probe delay (3 minutes).",
            simulation="incident",
            minutes=36,
            # GpuMemoryHigh and GpuMemoryCritical are not expected: the engine reserves 0.90, so they judge the
            # headroom above it (95 % and 97.5 % used), and this spike stays above those for less than their
            # `for:` (5m, 2m) before the OOM. The trend's ExhaustedSoon pages first, minutes ahead (docs/drill.md).
            expected=INCIDENT,
            quiet=INCIDENT_QUIET,
            verdict="memory_overcommit",
            memory_alert_before_oom=True,
            may_arrive=OOM_RACE,
        ),
        DrillScenario(
            name="sglang-incident",
            summary="The incident on SGLang at mem_fraction_static 0.9, with a model that loads in 2 minutes: the "
            "KV pool fills and the scheduler retracts requests (`KV cache pool is full. Retract requests.`: "
            "pressure, counted as preemptions, not as OOMs), the queue grows, memory climbs to PyTorch's CUDA OOM "
            "in the scheduler 12 minutes in; each relaunch (answering /health 503 while it loads, longer than the "
            "90 s probe) dies sooner: a restart storm.",
            simulation="incident-quick",
            engine="sglang",
            # The third relaunch comes 21.5 minutes in (later on a busy host, where each process takes longer to
            # start and to go), and RestartStorm after it.
            minutes=30,
            expected=INCIDENT,
            quiet=INCIDENT_QUIET,
            verdict="memory_overcommit",
            memory_alert_before_oom=True,
            may_arrive=OOM_RACE,
            bundle={"alerts": {"startup_slower_than_probe": {"probe_initial_delay_seconds": 90}}},
        ),
        DrillScenario(
            name="slow-leak",
            summary="Memory climbs 1 % of the GPU per minute from 56 % and never falls back; it reaches 90 % only "
            "34 minutes in, and CUDA runs out of memory at 43 minutes.",
            simulation="slow-leak",
            minutes=46,
            # The trend's time to full pages first (the hour: 45 minutes of it), its climb and the engine beyond its
            # budget are tickets (the climb's inhibited by the page of the same GPU: a race), three quarters of the
            # headroom in use a ticket minutes before the OOM (inhibited by the page). Critical stays quiet: the
            # trend sees the climb, and ExhaustedSoon judges when.
            expected={
                "GpuMemoryExhaustedSoon": PAGER,
                "GpuMemoryClimbing": TICKET_OR_INHIBITED,
                "GpuMemoryHigh": TICKET_OR_INHIBITED,
                "TargetMemoryOverBudget": TICKET,
                "OomEvent": PAGER,
            },
            quiet=("RestartStorm", "RestartsWithoutOom", "StartupSlowerThanProbe", "TargetDown", "QueueBacklog"),
            verdict="memory_leak",
            memory_alert_before_oom=True,
            may_arrive=OOM_RACE,
        ),
        DrillScenario(
            name="probe-kill",
            summary="Memory is normal; a probe kills the engine two minutes after each start. Restarts, no OOM: "
            "the other root cause.",
            simulation="probe-kill",
            minutes=15,
            expected={"RestartsWithoutOom": TICKET, "RestartStorm": PAGER},
            quiet=("OomEvent", "GpuMemoryHigh", "GpuMemoryCritical", "GpuMemoryClimbing", "TargetMemoryClimbing"),
            verdict="probe_kill",
        ),
        DrillScenario(
            name="hot-steady",
            summary="A hot but steady server at 88 %: nothing may page; the only finding is its thin headroom.",
            simulation="hot-steady",
            minutes=40,
            expected={"LowHeadroomConfig": NOT_DELIVERED},
            quiet=(
                "GpuMemoryHigh",
                "GpuMemoryCritical",
                "GpuMemoryClimbing",
                "TargetMemoryClimbing",
                "GpuMemoryClimbingPredicted",
                "GpuMemoryExhaustedSoon",
                "OomEvent",
                "RestartStorm",
                "TargetDown",
                "QueueBacklog",
            ),
            verdict="healthy",
        ),
        DrillScenario(
            name="default-steady",
            summary="vLLM at its default gpu_memory_utilization 0.90 on a healthy server for an hour: NVML shows "
            "90.6 % all along, which is the reservation, not a risk. Nothing may page, nothing may be ticketed; "
            "the only finding is the thin headroom of the configuration (info).",
            simulation="default-steady",
            minutes=60,
            expected={"LowHeadroomConfig": NOT_DELIVERED},
            quiet=(*MEMORY_ALERTS, *ENGINE_ALERTS),
            verdict="healthy",
            bundle=HEALTHY_PROBE,
        ),
        DrillScenario(
            name="tight-steady",
            summary="The same at gpu_memory_utilization 0.95: NVML shows 95.6 % for an hour, above the old "
            "critical threshold, and nothing may page or be ticketed; the thin headroom is the only finding.",
            simulation="tight-steady",
            minutes=60,
            expected={"LowHeadroomConfig": NOT_DELIVERED},
            quiet=(*MEMORY_ALERTS, *ENGINE_ALERTS),
            verdict="healthy",
            bundle=HEALTHY_PROBE,
        ),
        DrillScenario(
            name="long-warmup",
            summary="vLLM at gpu_memory_utilization 0.95 (on its command line) warming up for 5 minutes after "
            "its KV cache pool is allocated, its port closed: NVML shows 95.6 % with no /metrics to say why. The "
            "reservation is read from the command line meanwhile, so nothing may page or be ticketed; judged on "
            "the total, GpuMemoryCritical would page 2 minutes in.",
            simulation="long-warmup",
            minutes=20,
            expected={"LowHeadroomConfig": NOT_DELIVERED},
            quiet=(*MEMORY_ALERTS, *ENGINE_ALERTS),
            verdict="healthy",
            # A 5.5-minute start, plus the drill's own start-up read at 30x: a probe that waits for it.
            bundle={"alerts": {"startup_slower_than_probe": {"probe_initial_delay_seconds": 900}}},
        ),
        DrillScenario(
            name="tp-skew",
            summary="A tensor-parallel engine (TP=2) at 0.90: both GPUs at 90.6 % for 5 minutes, then GPU 1 "
            "alone climbs beyond the reservation at 0.4 % of the GPU per minute, to CUDA OOM at 99.4 % 22.2 minutes "
            "later; GPU 0 stays at 90.6 %. The engine is judged by its worst GPU: a page must come before the OOM.",
            simulation="tp-skew",
            minutes=30,
            # GPU 1's headroom (10 % of the GPU) fills 4 % a minute. The trend sees the climb in what is left
            # first (ExhaustedSoon, ~15 minutes ahead), then its rank holds 5 % of the GPU beyond its budget
            # (OverBudget, a ticket, ~4). Critical stays quiet while the trend sees the climb. Its climb ticket
            # (~6) and High (three quarters of the headroom) may arrive (OOM_RACE): not expected. GPU 0 stays at
            # 90.6 %.
            expected={
                "GpuMemoryExhaustedSoon": PAGER,
                "TargetMemoryOverBudget": TICKET,
                "OomEvent": PAGER,
                "LowHeadroomConfig": NOT_DELIVERED,
            },
            quiet=tuple(a for a in ENGINE_ALERTS if a != "OomEvent"),  # one OOM: no loop, no backlog
            verdict="memory_leak",
            memory_alert_before_oom=True,
            may_arrive=OOM_RACE,
            bundle=HEALTHY_PROBE,
        ),
        DrillScenario(
            name="long-loading",
            summary="A large model loading for two hours: it refuses connections all along, which is loading, "
            "not down.",
            simulation="long-loading",
            minutes=35,
            expected={"TargetLoadingTooLong": TICKET},
            quiet=("TargetDown", "OomEvent", "RestartStorm", "RestartsWithoutOom"),
            verdict="healthy",
        ),
        DrillScenario(
            name="foreign-process",
            summary="vLLM at gpu_memory_utilization 0.8 shares its GPU: it holds its reservation and never more, "
            "while another process grows 1 % of the GPU a minute from 5 minutes after load, to CUDA OOM 19 "
            "minutes later; the other process keeps what it holds, so every relaunch fails at start.",
            simulation="foreign-process",
            # 35: the storm's third relaunch came after the 30th minute once, with four test workers on two cores (at
            # 30x each relaunch's imports are a minute or more of simulated time there).
            minutes=35,
            # The other process's climb in the headroom pages ~14 minutes ahead; its climb ticket comes under that page
            # (inhibited: a race); High may arrive around the OOM (OOM_RACE).
            expected={
                "GpuMemoryExhaustedSoon": PAGER,
                "GpuMemoryClimbing": TICKET_OR_INHIBITED,
                "OomEvent": PAGER,
                "RestartStorm": PAGER,  # the relaunches that fail at start, from 30 s after the OOM
            },
            quiet=FOREIGN_QUIET,
            verdict="foreign_process",
            memory_alert_before_oom=True,
            may_arrive=OOM_RACE,
            bundle=HEALTHY_PROBE,
        ),
        DrillScenario(
            name="startup-memory",
            summary="vLLM with a max_model_len its KV cache cannot hold: each start loads the weights for a "
            "minute, then fails to allocate and exits; relaunched 20 s later, it never serves.",
            simulation="startup-memory",
            minutes=15,
            # These lives never serve: each is seen in the log alone (its startup line), and counted from there.
            expected={"OomEvent": PAGER, "RestartStorm": PAGER},
            quiet=("RestartsWithoutOom", "StartupSlowerThanProbe", "TargetDown", *MEMORY_ALERTS),
            verdict="startup_memory",
            bundle=HEALTHY_PROBE,
        ),
    )
}


def find(name: str) -> DrillScenario:
    """The drill scenario `name` (or an old name of the simulation's for it); a ValueError says why there is none,
    with the closest name, or what to run instead of a scenario the simulation alone has."""
    name = ALIASES.get(name, name)
    if name in SCENARIOS:
        return SCENARIOS[name]
    if name in SIMULATION_ONLY:
        raise ValueError(
            f"unknown scenario {name!r}: it is the simulation's alone (`oomguard serve --simulate {name}`), "
            f"with no alerts expected of it: {SIMULATION_ONLY[name]}"
        )
    raise ValueError(unknown_scenario(name, list(SCENARIOS), [*SCENARIOS, *ALIASES]))
