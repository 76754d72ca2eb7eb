"""The exposition: every metric oomguard exports, declared once, rendered fresh from each snapshot.

One module per section of docs/metrics.md declares its metrics and adds their samples;
`METRICS` is their concatenation, in the order they are written and documented
(`oomguard docs` generates docs/metrics.md from it, so a metric cannot ship undocumented).
"""

from __future__ import annotations

from oomguard.exporter.exposition import engine, events, gpu, health, joined, trend
from oomguard.exporter.exposition.encoder import Exposition
from oomguard.exporter.exposition.spec import MetricSpec
from oomguard.exporter.model import GPU_SOURCES, Snapshot

METRICS: tuple[MetricSpec, ...] = (
    *gpu.METRICS,
    *engine.METRICS,
    *joined.METRICS,
    *trend.METRICS,
    *events.METRICS,
    *health.METRICS,
)
_DECLARED = frozenset(METRICS)


def families(snapshot: Snapshot, *, keep_samples: bool = False) -> Exposition:
    """The snapshot's samples, written; `keep_samples` also keeps them as numbers (Exposition.metric_families)."""
    pods = {t.name: (t.pod.namespace, t.pod.name, t.pod.container) for t in snapshot.targets if t.pod}
    out = Exposition(METRICS, _DECLARED, pods, keep_samples=keep_samples)
    health.add_exporter(out, snapshot)
    if snapshot.gpus is not None and any(source in snapshot.sources for source in GPU_SOURCES):
        gpu.add(out, snapshot.gpus)
    for target in snapshot.targets:
        health.add_target(out, target)
        engine.add(out, target)
        joined.add(out, target, snapshot.memory.get(target.name))
    for _, gpu_memory in sorted(snapshot.gpu_memory.items()):
        joined.add_gpu(out, gpu_memory)
    trend.add(out, snapshot)
    events.add(out, snapshot)
    return out


def render(snapshot: Snapshot) -> bytes:
    """The text exposition of one snapshot."""
    return families(snapshot).render()


__all__ = ["METRICS", "Exposition", "MetricSpec", "families", "render"]
