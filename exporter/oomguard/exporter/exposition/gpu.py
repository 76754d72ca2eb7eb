"""GPU families (NVML): memory, utilization, identity, per-process memory."""

from __future__ import annotations

from oomguard.exporter.exposition.encoder import Exposition
from oomguard.exporter.exposition.spec import CONDITIONAL, metric
from oomguard.exporter.model import GpuReadings

SECTION = "GPU (NVML)"
GPU_INFO = metric(
    SECTION,
    "gpu_info",
    "info",
    "",
    "node gpu uuid name pci_bus_id driver_version",
    "Identity of a GPU; join on `gpu` to add names to other series.",
)
GPU_MIG_INFO = metric(
    SECTION,
    "gpu_mig_info",
    "info",
    "",
    "node gpu parent_gpu parent_uuid profile gpu_instance compute_instance",
    'A GPU that is a MIG GPU instance (`gpu` "<parent>/<GI>"): its parent GPU\'s index and UUID, its profile '
    "(3g.40gb), its GPU instance id and, where one, its compute instance id. Its memory series are the instance's: "
    "the memory its engine can run out of.",
    presence=CONDITIONAL,
)
DCGM_MEMORY_FAMILY_INFO = metric(
    SECTION,
    "dcgm_memory_family_info",
    "info",
    "",
    "node figure family unit",
    "Which dcgm-exporter family each memory figure of a node is read from, in which unit (`figure`: used, free, "
    "reserved, total; `unit`: MiB or bytes): the naming of that node's dcgm-exporter, 4.8's or 4.9's "
    '(docs/kubernetes.md, "dcgm-exporter 4.9 and later"). The cluster mode and dcgm.urls only.',
    presence=CONDITIONAL,
)
GPU_UP = metric(
    SECTION,
    "gpu_up",
    "gauge",
    "",
    "node gpu",
    "1 when NVML answers for this GPU, 0 when it is lost (fell off the bus, needs a reset).",
)
GPU_MEMORY_TOTAL_BYTES = metric(
    SECTION, "gpu_memory_total_bytes", "gauge", "bytes", "node gpu", "Total memory of the GPU."
)
GPU_MEMORY_USED_BYTES = metric(
    SECTION,
    "gpu_memory_used_bytes",
    "gauge",
    "bytes",
    "node gpu",
    "Memory allocated by processes (NVML `used`; excludes the driver's reservation where NVML reports it apart).",
)
GPU_MEMORY_FREE_BYTES = metric(
    SECTION, "gpu_memory_free_bytes", "gauge", "bytes", "node gpu", "Memory free for allocation."
)
GPU_MEMORY_RESERVED_BYTES = metric(
    SECTION,
    "gpu_memory_reserved_bytes",
    "gauge",
    "bytes",
    "node gpu",
    "Memory reserved by the driver and firmware (NVML memory info v2; absent on drivers with v1 only).",
    presence=CONDITIONAL,
)
GPU_MEMORY_USED_RATIO = metric(
    SECTION,
    "gpu_memory_used_ratio",
    "gauge",
    "ratio",
    "node gpu",
    "used / total, 0-1: the figure the 90 % alert watches.",
)
GPU_UTILIZATION_RATIO = metric(
    SECTION, "gpu_utilization_ratio", "gauge", "ratio", "node gpu", "Share of the last sample period a kernel ran, 0-1."
)
GPU_PROCESS_MEMORY_USED_BYTES = metric(
    SECTION,
    "gpu_process_memory_used_bytes",
    "gauge",
    "bytes",
    "node gpu pid process_name",
    "GPU memory used by one compute process (absent when NVML cannot say).",
    presence=CONDITIONAL,
)
GPU_PROCESS_QUERY_SUCCESS = metric(
    SECTION,
    "gpu_process_query_success",
    "gauge",
    "",
    "node gpu",
    "1 when the per-process query worked, so an absent process series means an idle GPU and not a failed query; 0 when it failed, or the GPU source lists no processes (dcgm-exporter).",
)
METRICS = (
    GPU_INFO, GPU_MIG_INFO, DCGM_MEMORY_FAMILY_INFO, GPU_UP, GPU_MEMORY_TOTAL_BYTES, GPU_MEMORY_USED_BYTES, GPU_MEMORY_FREE_BYTES, GPU_MEMORY_RESERVED_BYTES,
    GPU_MEMORY_USED_RATIO, GPU_UTILIZATION_RATIO, GPU_PROCESS_MEMORY_USED_BYTES, GPU_PROCESS_QUERY_SUCCESS,
)  # fmt: skip


def used_ratio(used_bytes: float, total_bytes: float) -> float:
    """used / total of a GPU, 0 to 1 as its metrics say: a used figure above the total (dcgm-exporter's used MiB,
    rounded up, against the exact bytes of a full GPU; a driver's glitch) reads as full, never as 112 % of a GPU.
    The bytes are published as read. The status view's share is this one."""
    return min(max(used_bytes, 0.0), total_bytes) / total_bytes


def add(out: Exposition, readings: GpuReadings) -> None:
    driver = readings.driver_version
    for node, figure, family, unit in readings.dcgm_families:
        out.add(DCGM_MEMORY_FAMILY_INFO, (node, figure, family, unit), 1.0)
    for gpu in readings.gpus:
        g = (gpu.node, gpu.label)
        out.add(GPU_UP, g, 1.0 if gpu.up else 0.0)
        if gpu.uuid:
            out.add(GPU_INFO, (*g, gpu.uuid, gpu.name, gpu.pci_bus_id, driver), 1.0)
        if (mig := gpu.mig) is not None:
            ci = "" if mig.compute_instance is None else str(mig.compute_instance)
            out.add(GPU_MIG_INFO, (*g, str(gpu.index), mig.parent_uuid, mig.profile, str(mig.gpu_instance), ci), 1.0)
        out.add(GPU_MEMORY_TOTAL_BYTES, g, gpu.total_bytes)
        out.add(GPU_MEMORY_USED_BYTES, g, gpu.used_bytes)
        out.add(GPU_MEMORY_FREE_BYTES, g, gpu.free_bytes)
        out.add(GPU_MEMORY_RESERVED_BYTES, g, gpu.reserved_bytes)
        if gpu.total_bytes and gpu.used_bytes is not None:
            out.add(GPU_MEMORY_USED_RATIO, g, used_ratio(gpu.used_bytes, gpu.total_bytes))
        out.add(GPU_UTILIZATION_RATIO, g, gpu.utilization_ratio)
        if gpu.up and not gpu.error:
            # A source without per-process lists (dcgm-exporter) says 0: the process series are absent, not 0.
            out.add(GPU_PROCESS_QUERY_SUCCESS, g, 0.0 if gpu.processes is None else 1.0)
        for proc in gpu.processes or ():
            out.add(GPU_PROCESS_MEMORY_USED_BYTES, (*g, str(proc.pid), proc.name), proc.used_bytes)
