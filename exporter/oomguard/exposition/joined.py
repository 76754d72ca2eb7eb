"""Joined families: a target with the GPUs it runs on (the join itself is in join.py)."""

from __future__ import annotations

from oomguard.exposition.encoder import Exposition
from oomguard.exposition.spec import metric
from oomguard.model import TargetMemory, TargetReading

SECTION = "Joined: GPU x engine"
TARGET_GPU_INFO = metric(
    SECTION,
    "target_gpu_info",
    "info",
    "",
    "target gpu",
    "Which GPUs a target runs on (from `gpus:` in the config, else from NVML's process list).",
)
TARGET_GPU_MEMORY_USED_BYTES = metric(
    SECTION,
    "target_gpu_memory_used_bytes",
    "gauge",
    "bytes",
    "target",
    "Memory used on the target's GPUs, all processes together.",
)
TARGET_GPU_MEMORY_TOTAL_BYTES = metric(
    SECTION, "target_gpu_memory_total_bytes", "gauge", "bytes", "target", "Total memory of the target's GPUs."
)
TARGET_GPU_MEMORY_USED_RATIO = metric(
    SECTION, "target_gpu_memory_used_ratio", "gauge", "ratio", "target", "Used / total over the target's GPUs, 0-1."
)
TARGET_PROCESS_GPU_MEMORY_BYTES = metric(
    SECTION,
    "target_process_gpu_memory_bytes",
    "gauge",
    "bytes",
    "target",
    "GPU memory used by the target's own processes (local targets, from NVML's per-process list).",
)
TARGET_MEMORY_BUDGET_BYTES = metric(
    SECTION,
    "target_memory_budget_bytes",
    "gauge",
    "bytes",
    "target",
    "The engine's memory budget: gpu_memory_utilization x total memory of its GPUs.",
)
TARGET_MEMORY_OVER_BUDGET_BYTES = metric(
    SECTION,
    "target_memory_over_budget_bytes",
    "gauge",
    "bytes",
    "target",
    "Memory in use minus the budget (the target's processes where known, else the whole GPUs). Above 0 is memory the KV cache cannot explain: activations, another process, a leak.",
)
TARGET_RESIDENT_MEMORY_BYTES = metric(
    SECTION,
    "target_resident_memory_bytes",
    "gauge",
    "bytes",
    "target",
    "Host RSS of the target's processes (the listener and its children), for CPU deployments and host-memory leaks.",
)
METRICS = (
    TARGET_GPU_INFO, TARGET_GPU_MEMORY_USED_BYTES, TARGET_GPU_MEMORY_TOTAL_BYTES, TARGET_GPU_MEMORY_USED_RATIO,
    TARGET_PROCESS_GPU_MEMORY_BYTES, TARGET_MEMORY_BUDGET_BYTES, TARGET_MEMORY_OVER_BUDGET_BYTES,
    TARGET_RESIDENT_MEMORY_BYTES,
)  # fmt: skip


def add(out: Exposition, target: TargetReading, memory: TargetMemory | None) -> None:
    t = target.name
    if target.process is not None:
        out.add(TARGET_RESIDENT_MEMORY_BYTES, (t,), target.process.resident_bytes)
    if memory is None:
        return
    for gpu in memory.gpus:
        out.add(TARGET_GPU_INFO, (t, str(gpu)), 1.0)
    if memory.used_bytes is None or not memory.total_bytes:
        return
    out.add(TARGET_GPU_MEMORY_USED_BYTES, (t,), memory.used_bytes)
    out.add(TARGET_GPU_MEMORY_TOTAL_BYTES, (t,), memory.total_bytes)
    out.add(TARGET_GPU_MEMORY_USED_RATIO, (t,), memory.used_bytes / memory.total_bytes)
    out.add(TARGET_PROCESS_GPU_MEMORY_BYTES, (t,), memory.own_bytes)
    out.add(TARGET_MEMORY_BUDGET_BYTES, (t,), memory.budget_bytes)
    out.add(TARGET_MEMORY_OVER_BUDGET_BYTES, (t,), memory.over_budget_bytes)
