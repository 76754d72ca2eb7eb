"""Engine families: what the engine says of itself on its /metrics, per target and served model.

The numbers it gives (its KV cache use, its queue...) are declared in model.ENGINE_FIGURES, beside the readings'
fields: their metrics are built from there and written by the two loops of `add`. The others (its settings, its
sleep state, its memory by part) are declared and written here.
"""

from __future__ import annotations

from oomguard.exporter.exposition.encoder import Exposition
from oomguard.exporter.exposition.spec import CONDITIONAL, MetricSpec, metric
from oomguard.exporter.model import (
    ENGINE_FIGURES,
    FIGURES,
    MEMORY_COMPONENTS,
    SLEEP_STATES,
    EngineFigure,
    TargetReading,
)

SECTION = "Engine (per target)"
TARGET_INFO = metric(SECTION, "target_info", "info", "", "target engine url", "A configured engine target.")


def _figure_spec(figure: EngineFigure) -> MetricSpec:
    """The metric of one of the engine's figures, as model.ENGINE_FIGURES declares it."""
    labels = "target model_name" if figure.per_model else "target"
    presence = CONDITIONAL if figure.conditional else None
    return metric(SECTION, figure.metric, figure.kind, figure.unit, labels, figure.help, presence=presence)


# Each figure's metric with the reading's field it is written from: one per served model, then the engine's own.
FIGURE_METRICS: tuple[tuple[EngineFigure, MetricSpec], ...] = tuple(
    (figure, _figure_spec(figure)) for figure in ENGINE_FIGURES
)
_PER_MODEL = tuple((figure.field, spec) for figure, spec in FIGURE_METRICS if figure.per_model)
_PER_TARGET = tuple((figure.field, spec) for figure, spec in FIGURE_METRICS if not figure.per_model)
ENGINE_SLEEP_STATE = metric(
    SECTION,
    "engine_sleep_state",
    "gauge",
    "",
    "target state",
    "1 for the engine's sleep state (awake, weights_offloaded, discard_all; each engine's families: docs/metrics.md, \"Engine families read\"), 0 for the others. A sleeping engine has released its memory: memory near zero is then no fault, and its reservation does not count.",
    presence=CONDITIONAL,
)
ENGINE_MEMORY_BYTES = metric(
    SECTION,
    "engine_memory_bytes",
    "gauge",
    "bytes",
    "target component",
    'GPU memory the engine says each part of it holds on each of its GPUs (the largest over its ranks): component weights, kv_cache or cuda_graphs (each engine\'s families: docs/metrics.md, "Engine families read"). Only the parts the engine reports; they need not add up to its whole use.',
    presence=CONDITIONAL,
)
ENGINE_SETTING = metric(
    SECTION,
    "engine_setting",
    "gauge",
    "",
    "target engine setting origin",
    "The engine's setting as started, one series per setting, read from its process's command line (or "
    "environment) on this host, or from a discovered pod's container command, args and env: its memory and "
    "concurrency settings under the engine's own names (each engine's in docs/engines.md, \"Settings as gauges\"). "
    "origin=flag when on its command line, default when the engine's default for its version; a setting neither "
    "given nor of a known default is absent.",
    presence=CONDITIONAL,
)
ENGINE_FIGURE_READ = metric(
    SECTION,
    "engine_figure_read",
    "gauge",
    "",
    "target figure",
    "1 when the target's last reading had the figure, 0 when not, for each figure its engine gives once it serves "
    f"({', '.join(FIGURES)}: docs/engines.md); only while "
    "its /metrics is read. 0 means a name the reader no longer finds (an engine upgrade renamed it): the alerts "
    "on that figure cannot fire for this target.",
)
METRICS = (
    TARGET_INFO, *(spec for _, spec in FIGURE_METRICS), ENGINE_SLEEP_STATE, ENGINE_MEMORY_BYTES, ENGINE_SETTING,
    ENGINE_FIGURE_READ,
)  # fmt: skip


def add(out: Exposition, target: TargetReading) -> None:
    t = target.name
    out.add(TARGET_INFO, (t, target.engine, target.url), 1.0)
    for name, setting in sorted(target.settings.items()):
        out.add(ENGINE_SETTING, (t, target.engine, name, setting.origin), setting.value)
    reading = target.engine_reading
    if reading is None or (target.pod is not None and target.pod.leader_elsewhere):
        return  # the engine's figures are its leader's exporter's (model.PodRef): once in Prometheus, not twice
    for figure, read in target.figures_read.items():
        out.add(ENGINE_FIGURE_READ, (t, figure), float(read))
    for model in reading.models:
        labels = (t, model.model_name)
        for field, spec in _PER_MODEL:
            out.add(spec, labels, getattr(model, field))
    for field, spec in _PER_TARGET:
        out.add(spec, (t,), getattr(reading, field))
    memory = dict(reading.memory_bytes)
    for component in MEMORY_COMPONENTS:
        out.add(ENGINE_MEMORY_BYTES, (t, component), memory.get(component))
    if reading.sleep_state is not None:
        for state in SLEEP_STATES:
            out.add(ENGINE_SLEEP_STATE, (t, state), 1.0 if reading.sleep_state == state else 0.0)
