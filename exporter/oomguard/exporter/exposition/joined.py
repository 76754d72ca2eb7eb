"""Joined families: a target with the GPUs it runs on, a GPU with the engines that reserve it (join.py)."""

from __future__ import annotations

from oomguard.exporter.exposition.encoder import Exposition
from oomguard.exporter.exposition.gpu import used_ratio
from oomguard.exporter.exposition.spec import CONDITIONAL, metric
from oomguard.exporter.model import GpuMemory, TargetMemory, TargetReading

SECTION = "Joined: GPU x engine"
TARGET_GPU_INFO = metric(
    SECTION,
    "target_gpu_info",
    "info",
    "",
    "target node gpu",
    "Which GPUs a target runs on (from `gpus:` in the config, else from NVML's process list).",
    presence=CONDITIONAL,
)
TARGET_GPU_MEMORY_USED_BYTES = metric(
    SECTION,
    "target_gpu_memory_used_bytes",
    "gauge",
    "bytes",
    "target",
    "Memory used on the target's worst GPU (highest used/total), all processes together: with tensor parallelism CUDA runs out on one device, so one GPU is judged, not the sum.",
    presence=CONDITIONAL,
)
TARGET_GPU_MEMORY_TOTAL_BYTES = metric(
    SECTION,
    "target_gpu_memory_total_bytes",
    "gauge",
    "bytes",
    "target",
    "Total memory of the target's worst GPU.",
    presence=CONDITIONAL,
)
TARGET_GPU_MEMORY_USED_RATIO = metric(
    SECTION,
    "target_gpu_memory_used_ratio",
    "gauge",
    "ratio",
    "target",
    "Used / total of the target's worst GPU, 0-1.",
    presence=CONDITIONAL,
)
TARGET_PROCESS_GPU_MEMORY_BYTES = metric(
    SECTION,
    "target_process_gpu_memory_bytes",
    "gauge",
    "bytes",
    "target",
    "GPU memory used by the target's own processes on all its GPUs (local targets, from NVML's per-process list).",
    presence=CONDITIONAL,
)
TARGET_MEMORY_BUDGET_BYTES = metric(
    SECTION,
    "target_memory_budget_bytes",
    "gauge",
    "bytes",
    "target",
    "The engine's memory budget on its worst GPU: gpu_memory_utilization x that GPU's total (the budget holds per GPU).",
    presence=CONDITIONAL,
)
TARGET_MEMORY_OVER_BUDGET_BYTES = metric(
    SECTION,
    "target_memory_over_budget_bytes",
    "gauge",
    "bytes",
    "target",
    "Memory in use minus the budget, on the GPU where it is largest (the target's processes where known, else the whole GPU). Above 0 is memory the KV cache cannot explain: activations, another process, a leak.",
    presence=CONDITIONAL,
)
TARGET_RESIDENT_MEMORY_BYTES = metric(
    SECTION,
    "target_resident_memory_bytes",
    "gauge",
    "bytes",
    "target",
    "Host RSS of the target's processes (the listener and its children), for CPU deployments and host-memory leaks.",
    presence=CONDITIONAL,
)
GPU_MEMORY_ENGINE_RESERVED_BYTES = metric(
    SECTION,
    "gpu_memory_engine_reserved_bytes",
    "gauge",
    "bytes",
    "node gpu",
    "Memory the engines on this GPU reserve from their start (gpu_memory_utilization x total, summed over the awake engines that say it). Only on a GPU with such an engine.",
    presence=CONDITIONAL,
)
GPU_MEMORY_ENGINE_USED_BYTES = metric(
    SECTION,
    "gpu_memory_engine_used_bytes",
    "gauge",
    "bytes",
    "node gpu",
    "Memory the engines' own processes use on this GPU (NVML's per-process list); only where every engine on it is a local one whose pids NVML lists.",
    presence=CONDITIONAL,
)
GPU_MEMORY_ENGINE_OVER_RESERVATION_BYTES = metric(
    SECTION,
    "gpu_memory_engine_over_reservation_bytes",
    "gauge",
    "bytes",
    "node gpu",
    "The engines' own use beyond their reservations, summed over engines (activations, late CUDA graphs, NCCL buffers, a leak); where attributable.",
    presence=CONDITIONAL,
)
GPU_MEMORY_OTHER_USED_BYTES = metric(
    SECTION,
    "gpu_memory_other_used_bytes",
    "gauge",
    "bytes",
    "node gpu",
    "Memory used on this GPU by anything but its engines (other processes, driver contexts); where attributable.",
    presence=CONDITIONAL,
)
GPU_MEMORY_UNRESERVED_USED_BYTES = metric(
    SECTION,
    "gpu_memory_unreserved_used_bytes",
    "gauge",
    "bytes",
    "node gpu",
    "What can still grow on a GPU with a reservation: the engines' use beyond it plus every other use; where that cannot be attributed, used minus reserved.",
    presence=CONDITIONAL,
)
GPU_MEMORY_HEADROOM_USED_RATIO = metric(
    SECTION,
    "gpu_memory_headroom_used_ratio",
    "gauge",
    "ratio",
    "node gpu",
    "Unreserved use / (total - reserved): the share of the headroom the reservations leave that is in use, what the memory alerts judge on a reserved GPU. Above 1: the reservation cannot be honoured.",
    presence=CONDITIONAL,
)
METRICS = (
    TARGET_GPU_INFO, TARGET_GPU_MEMORY_USED_BYTES, TARGET_GPU_MEMORY_TOTAL_BYTES, TARGET_GPU_MEMORY_USED_RATIO,
    TARGET_PROCESS_GPU_MEMORY_BYTES, TARGET_MEMORY_BUDGET_BYTES, TARGET_MEMORY_OVER_BUDGET_BYTES,
    TARGET_RESIDENT_MEMORY_BYTES, GPU_MEMORY_ENGINE_RESERVED_BYTES, GPU_MEMORY_ENGINE_USED_BYTES,
    GPU_MEMORY_ENGINE_OVER_RESERVATION_BYTES, GPU_MEMORY_OTHER_USED_BYTES, GPU_MEMORY_UNRESERVED_USED_BYTES,
    GPU_MEMORY_HEADROOM_USED_RATIO,
)  # fmt: skip


def add(out: Exposition, target: TargetReading, memory: TargetMemory | None) -> None:
    t = target.name
    if target.process is not None:
        out.add(TARGET_RESIDENT_MEMORY_BYTES, (t,), target.process.resident_bytes)
    if memory is None:
        return
    for gpu in memory.gpus:
        out.add(TARGET_GPU_INFO, (t, gpu[0], str(gpu[1])), 1.0)
    if memory.used_bytes is None or not memory.total_bytes:
        return
    out.add(TARGET_GPU_MEMORY_USED_BYTES, (t,), memory.used_bytes)
    out.add(TARGET_GPU_MEMORY_TOTAL_BYTES, (t,), memory.total_bytes)
    out.add(TARGET_GPU_MEMORY_USED_RATIO, (t,), used_ratio(memory.used_bytes, memory.total_bytes))
    out.add(TARGET_PROCESS_GPU_MEMORY_BYTES, (t,), memory.own_bytes)
    out.add(TARGET_MEMORY_BUDGET_BYTES, (t,), memory.budget_bytes)
    out.add(TARGET_MEMORY_OVER_BUDGET_BYTES, (t,), memory.over_budget_bytes)


def add_gpu(out: Exposition, gpu: GpuMemory) -> None:
    g = gpu.key
    out.add(GPU_MEMORY_ENGINE_RESERVED_BYTES, g, gpu.reserved_bytes)
    out.add(GPU_MEMORY_ENGINE_USED_BYTES, g, gpu.engine_used_bytes)
    out.add(GPU_MEMORY_ENGINE_OVER_RESERVATION_BYTES, g, gpu.over_reservation_bytes)
    out.add(GPU_MEMORY_OTHER_USED_BYTES, g, gpu.other_used_bytes)
    out.add(GPU_MEMORY_UNRESERVED_USED_BYTES, g, gpu.unreserved_used_bytes)
    out.add(GPU_MEMORY_HEADROOM_USED_RATIO, g, gpu.headroom_used_ratio)
