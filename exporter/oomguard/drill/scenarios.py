"""Drill scenarios: the incident and its look-alikes, each with the alerts it must and must not raise.

Durations are simulated time; the drill runs them `time_scale` times faster, and the
bundle's durations and the trend windows are divided by the same factor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PAGER, TICKET = "pager", "ticket"
# Fires in Prometheus but reaches no receiver: an info alert (not routed), or one its critical twin inhibits.
NOT_DELIVERED = None
# Fires; reaches the ticket queue unless a critical twin fires at the time and inhibits it (a race by design).
TICKET_OR_INHIBITED = "ticket?"
MEMORY_ALERTS = (
    "GpuMemoryHigh", "GpuMemoryCritical", "GpuMemoryClimbing", "TargetMemoryClimbing",
    "GpuMemoryClimbingPredicted", "GpuMemoryExhaustedSoon", "TargetMemoryOverBudget",
)  # fmt: skip


# The orchestrator's probe delay in these drills: 3 minutes (the incident's engine needs 4 to load).
# Generous, because a real process also spends a second or two importing, which a 30x drill
# multiplies into simulated minutes.
PROBE = {"alerts": {"startup_slower_than_probe": {"probe_initial_delay_seconds": 180}}}


@dataclass(frozen=True)
class DrillScenario:
    name: str
    summary: str
    simulation: str  # a scenario of oomguard.simulate
    minutes: float  # simulated minutes to run
    # Alert (without the bundle's prefix) -> the receiver it must reach (None: info, fires but is not routed).
    expected: dict[str, str | None]
    quiet: tuple[str, ...]
    memory_alert_before_oom: bool = False
    bundle: dict = field(default_factory=lambda: PROBE)  # bundle configuration overrides


SCENARIOS: dict[str, DrillScenario] = {
    s.name: s
    for s in (
        DrillScenario(
            name="incident",
            summary="The postmortem replayed: over-provisioned concurrency, KV cache and queue growth, memory "
            "past 90 % and 95 %, CUDA OOM, and a restart loop whose model load (4 minutes) is longer than the "
            "probe delay (3 minutes).",
            simulation="overcommit",
            minutes=36,
            expected={
                # Fires; its critical twins inhibit it while they fire (deploy/alertmanager).
                "GpuMemoryHigh": TICKET_OR_INHIBITED,
                "GpuMemoryExhaustedSoon": PAGER,
                "GpuMemoryCritical": PAGER,
                "OomEvent": PAGER,
                "RestartStorm": PAGER,
                "StartupSlowerThanProbe": TICKET,
                "QueueBacklog": TICKET,
                "KvCacheSaturated": TICKET,
            },
            quiet=("RestartsWithoutOom", "TargetDown", "ExporterDown", "SourceFailing"),
            memory_alert_before_oom=True,
        ),
        DrillScenario(
            name="slow-leak",
            summary="Memory climbs 1 % of the GPU per minute from 56 % and never falls back; it reaches 90 % only "
            "34 minutes in, and CUDA runs out of memory at 43 minutes.",
            simulation="leak",
            minutes=46,
            # The GPU's climb and its 90 % alert fire too; GpuMemoryExhaustedSoon and GpuMemoryCritical inhibit
            # them while they fire, and ExhaustedSoon stops once memory is pinned (saturated): a race.
            expected={
                "GpuMemoryExhaustedSoon": PAGER,
                "GpuMemoryClimbing": TICKET_OR_INHIBITED,
                "TargetMemoryClimbing": TICKET,
                "GpuMemoryHigh": TICKET_OR_INHIBITED,
                "GpuMemoryCritical": PAGER,
                "TargetMemoryOverBudget": PAGER,
                "OomEvent": PAGER,
            },
            quiet=("RestartStorm", "RestartsWithoutOom", "StartupSlowerThanProbe", "TargetDown", "QueueBacklog"),
            memory_alert_before_oom=True,
        ),
        DrillScenario(
            name="probe-kill",
            summary="Memory is normal; a probe kills the engine two minutes after each start. Restarts, no OOM: "
            "the other root cause.",
            simulation="probe-kill",
            minutes=15,
            expected={"RestartsWithoutOom": TICKET, "RestartStorm": PAGER},
            quiet=("OomEvent", "GpuMemoryHigh", "GpuMemoryCritical", "GpuMemoryClimbing", "TargetMemoryClimbing"),
        ),
        DrillScenario(
            name="hot-steady",
            summary="A hot but steady server at 88 %: nothing may page; the only finding is its thin headroom.",
            simulation="steady",
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
        ),
        DrillScenario(
            name="long-loading",
            summary="A large model loading for two hours: it refuses connections all along, which is loading, "
            "not down.",
            simulation="loading",
            minutes=35,
            expected={"TargetLoadingTooLong": TICKET},
            quiet=("TargetDown", "OomEvent", "RestartStorm", "RestartsWithoutOom"),
        ),
    )
}
