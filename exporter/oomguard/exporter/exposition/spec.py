"""How a metric is declared: name, type, unit, labels, meaning, section of docs/metrics.md.

A spec object is also the key the families modules add samples under: `out.add(GPU_UP, ...)`
is found by grep and checked by the type checker, where a string key was neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Every per-target series also carries its pod's labels (empty for a configured target), after its own:
# one label set per family whichever targets there are, and `target` stays what rules and dashboards use.
POD_LABELS = ("namespace", "pod", "container")


# When a metric has series, for `oomguard drill --check` (drill/check.py): a missing input of an alert is a
# gap only where its series should exist. Each declaration has one; metric() derives the usual one from the
# labels and the section, and a declaration names the others.
ALWAYS = "always"  # while the exporter runs
PER_GPU = "gpu"  # while NVML reads a GPU
PER_TARGET = "target"  # while a target is known (configured or discovered)
ENGINE_UP = "engine"  # while a target's engine is up and gives the figure
EVENT = "event"  # born with its first event: an XID, a kernel OOM kill, an OOM, a start watched
# only where its condition holds, which its help text says ("only while climbing or spiking": a time to full goes
# when the climb stops, so no event arms it)
CONDITIONAL = "conditional"
PRESENCE = (ALWAYS, PER_GPU, PER_TARGET, ENGINE_UP, EVENT, CONDITIONAL)


# eq=False: specs are compared and hashed by identity, which is what a key needs and costs nothing.
@dataclass(frozen=True, eq=False, slots=True)
class MetricSpec:
    name: str  # with the oomguard_ prefix, without _total
    kind: str  # gauge | counter | info
    unit: str
    labels: tuple[str, ...]
    help: str
    section: str
    presence: str = ALWAYS  # one of PRESENCE
    # Computed once: the text format's header, the sample name, the labels in sorted order.
    header: str = field(init=False, repr=False)
    # Where the `target` label is in a per-target metric's labels (-1: not one): the encoder appends that
    # target's POD_LABELS to what the families modules pass.
    target_index: int = field(init=False, repr=False)
    sample_name: str = field(init=False, repr=False)
    label_order: tuple[tuple[int, str], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        sample_name = self.name + "_total" if self.kind == "counter" else self.name
        # # HELP and # TYPE as the text format writes them (counters named with _total, info as gauge).
        kind = "counter" if self.kind == "counter" else "gauge"
        help_text = self.help.replace("\\", r"\\").replace("\n", r"\n")
        object.__setattr__(self, "sample_name", sample_name)
        object.__setattr__(self, "header", f"# HELP {sample_name} {help_text}\n# TYPE {sample_name} {kind}\n")
        # prometheus_client sorts labels in the text format; the golden test holds us to it.
        object.__setattr__(self, "label_order", tuple(sorted(enumerate(self.labels), key=lambda item: item[1])))
        per_target = "target" in self.labels and self.labels[-len(POD_LABELS) :] == POD_LABELS
        object.__setattr__(self, "target_index", self.labels.index("target") if per_target else -1)


def metric(
    section: str, name: str, kind: str, unit: str, labels: str, help_text: str, *, presence: str | None = None
) -> MetricSpec:
    """A spec; `name` without the oomguard_ prefix, `labels` space-separated (POD_LABELS added after `target`'s).
    `presence`: when it has series (PRESENCE); by default an engine's figure is there while the engine is up,
    a per-target series while the target is known, a per-GPU one while NVML reads the GPU, any other always."""
    names = tuple(labels.split()) if labels else ()
    if "target" in names:
        names += POD_LABELS
    if presence is None:
        if "target" in names:
            presence = ENGINE_UP if name.startswith("engine_") else PER_TARGET
        else:
            presence = PER_GPU if "gpu" in names else ALWAYS
    assert presence in PRESENCE, presence
    return MetricSpec(f"oomguard_{name}", kind, unit, names, help_text, section, presence)
