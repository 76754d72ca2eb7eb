"""Trend families: the background sampler's latest analysis, per GPU and per target (docs/trend.md)."""

from __future__ import annotations

from oomguard.exporter.exposition.encoder import Exposition
from oomguard.exporter.exposition.spec import CONDITIONAL, MetricSpec, metric
from oomguard.exporter.model import TREND_STATES, Snapshot

SECTION = "Memory trend (see docs/trend.md)"
_STATE_HELP = "1 for the current trend state (steady, sawtooth, climbing, spike, saturated; defined in docs/trend.md), 0 for the others."
GPU_MEMORY_TREND_STATE = metric(
    SECTION, "gpu_memory_trend_state", "gauge", "", "node gpu state", _STATE_HELP, presence=CONDITIONAL
)
GPU_MEMORY_SLOPE_BYTES_PER_SECOND = metric(
    SECTION,
    "gpu_memory_slope_bytes_per_second",
    "gauge",
    "bytes/s",
    "node gpu window",
    "Robust slope (Theil-Sen over bucket medians) of used memory over the short or long window.",
    presence=CONDITIONAL,
)
GPU_MEMORY_CLIMB_SECONDS = metric(
    SECTION,
    "gpu_memory_climb_seconds",
    "gauge",
    "seconds",
    "node gpu",
    "How long used memory has risen without falling back by more than the tolerance.",
    presence=CONDITIONAL,
)
GPU_MEMORY_SECONDS_TO_FULL = metric(
    SECTION,
    "gpu_memory_seconds_to_full",
    "gauge",
    "seconds",
    "node gpu",
    "At the current pace, time until the GPU is full; only while climbing or spiking.",
    presence=CONDITIONAL,
)
TARGET_MEMORY_TREND_STATE = metric(
    SECTION,
    "target_memory_trend_state",
    "gauge",
    "",
    "target memory state",
    _STATE_HELP + " `memory` is gpu (the target's GPUs) or host (its processes' RSS against host memory).",
    presence=CONDITIONAL,
)
TARGET_MEMORY_SLOPE_BYTES_PER_SECOND = metric(
    SECTION,
    "target_memory_slope_bytes_per_second",
    "gauge",
    "bytes/s",
    "target memory window",
    "Robust slope of the target's memory over the short or long window.",
    presence=CONDITIONAL,
)
TARGET_MEMORY_CLIMB_SECONDS = metric(
    SECTION,
    "target_memory_climb_seconds",
    "gauge",
    "seconds",
    "target memory",
    "How long the target's memory has risen without falling back.",
    presence=CONDITIONAL,
)
TARGET_MEMORY_SECONDS_TO_FULL = metric(
    SECTION,
    "target_memory_seconds_to_full",
    "gauge",
    "seconds",
    "target memory",
    "At the current pace, time until the target's GPUs (or the host) are full; only while climbing or spiking.",
    presence=CONDITIONAL,
)
TARGET_MEMORY_SECONDS_TO_BUDGET = metric(
    SECTION,
    "target_memory_seconds_to_budget",
    "gauge",
    "seconds",
    "target",
    "At the current pace, time until the target's GPUs pass the engine's budget (gpu_memory_utilization); 0 when already past; only while climbing or spiking.",
    presence=CONDITIONAL,
)
TREND_SAMPLES = metric(
    SECTION,
    "trend_samples",
    "counter",
    "",
    "",
    "Background memory samples taken (every trend.interval_seconds).",
    presence=CONDITIONAL,
)
TREND_SAMPLE_ERRORS = metric(
    SECTION, "trend_sample_errors", "counter", "", "", "Background samples that failed.", presence=CONDITIONAL
)
METRICS = (
    GPU_MEMORY_TREND_STATE, GPU_MEMORY_SLOPE_BYTES_PER_SECOND, GPU_MEMORY_CLIMB_SECONDS, GPU_MEMORY_SECONDS_TO_FULL,
    TARGET_MEMORY_TREND_STATE, TARGET_MEMORY_SLOPE_BYTES_PER_SECOND, TARGET_MEMORY_CLIMB_SECONDS,
    TARGET_MEMORY_SECONDS_TO_FULL, TARGET_MEMORY_SECONDS_TO_BUDGET, TREND_SAMPLES, TREND_SAMPLE_ERRORS,
)  # fmt: skip

# state, slope, climb, to full: by the kind of series (TrendKey.kind)
_FAMILIES: dict[str, tuple[MetricSpec, MetricSpec, MetricSpec, MetricSpec]] = {
    "gpu": (GPU_MEMORY_TREND_STATE, GPU_MEMORY_SLOPE_BYTES_PER_SECOND, GPU_MEMORY_CLIMB_SECONDS,
            GPU_MEMORY_SECONDS_TO_FULL),
    "target": (TARGET_MEMORY_TREND_STATE, TARGET_MEMORY_SLOPE_BYTES_PER_SECOND, TARGET_MEMORY_CLIMB_SECONDS,
               TARGET_MEMORY_SECONDS_TO_FULL),
}  # fmt: skip


def add(out: Exposition, snapshot: Snapshot) -> None:
    if snapshot.trend_samples_total is None:
        return
    out.add(TREND_SAMPLES, (), float(snapshot.trend_samples_total))
    out.add(TREND_SAMPLE_ERRORS, (), float(snapshot.trend_errors_total))
    budgets = {
        t.name: t.engine_reading.memory_utilization_ratio for t in snapshot.targets if t.engine_reading is not None
    }
    for key, reading in sorted(
        snapshot.trends.items(), key=lambda kv: (kv[0].kind, kv[0].node, kv[0].name, kv[0].memory)
    ):
        trend, capacity = reading.trend, reading.capacity_bytes
        state_spec, slope_spec, climb_spec, full_spec = _FAMILIES[key.kind]
        labels = (key.node, key.name) if key.kind == "gpu" else (key.name, key.memory)
        for state in TREND_STATES:
            out.add(state_spec, (*labels, state), 1.0 if trend.state == state else 0.0)
        for window, slope in (("short", trend.slope_short), ("long", trend.slope_long)):
            out.add(slope_spec, (*labels, window), None if slope is None else slope * capacity)
        out.add(climb_spec, labels, trend.climb_seconds)
        out.add(full_spec, labels, trend.seconds_to_full)
        budget = budgets.get(key.name)
        if key.kind == "target" and key.memory == "gpu" and budget is not None:
            # On the headroom basis the level is the use beyond the reservations: the budget is its 0.
            on_basis = 0.0 if reading.basis == "headroom" else budget
            out.add(TARGET_MEMORY_SECONDS_TO_BUDGET, (key.name,), trend.seconds_to(on_basis))
