"""Snapshots the status view is built from in tests/status/test_view_golden.py: a host's (NVML, a MIG instance, two
engines, an OOM, restarts, trends), a cluster's (dcgm-exporter on two nodes, pods, a leader elsewhere, names an
engine or a pod chose with control characters, quotes and markup, a figure that is NaN), one whose GPU source did
not run, and many GPUs of equal use (the cut and the order of ties)."""

from __future__ import annotations

import math

from oomguard.bundle.thresholds import default_thresholds
from oomguard.common.thresholds import Thresholds
from oomguard.exporter.model import (
    Counts,
    EngineReading,
    EventSourceHealth,
    GpuMemory,
    GpuReading,
    GpuReadings,
    MigInstance,
    ModelReading,
    PodRef,
    Snapshot,
    SourceResult,
    TargetMemory,
    TargetReading,
    Trend,
    TrendKey,
    TrendReading,
)

GIB = 1024**3
NOW = 1_800_000_000.0
OK, FAILED = SourceResult(True, 0.01), SourceResult(False, 0.5)


def _trend(state: str, seconds_to_full: float | None = None) -> TrendReading:
    return TrendReading(Trend(state, 0.9, 0.001, 0.001, 600.0, seconds_to_full), 80 * GIB, "headroom")


def _gpu_memory(node: str, label: str, used: float, reserved: float, unreserved: float) -> GpuMemory:
    total = 80 * GIB
    return GpuMemory(
        (node, label), total, used, reserved, None, None, None, unreserved, unreserved / max(total - reserved, 1.0)
    )


def host() -> Snapshot:
    mig = MigInstance(parent_uuid="GPU-p", gpu_instance=1, compute_instance=0, profile="3g.40gb")
    gpus = GpuReadings(
        up=True,
        driver_version="550.54",
        gpus=(
            GpuReading(0, True, "GPU-0", "H100", total_bytes=80 * GIB, used_bytes=74 * GIB, free_bytes=6 * GIB),
            GpuReading(1, True, "GPU-1", "H100", total_bytes=80 * GIB, used_bytes=20 * GIB),
            GpuReading(2, True, "GPU-p", "H100", total_bytes=40 * GIB, used_bytes=39.5 * GIB, mig=mig),
            GpuReading(3, False, error="lost"),
        ),
    )
    vllm = TargetReading(
        "vllm-0",
        "vllm",
        "http://127.0.0.1:8000",
        (0,),
        True,
        "up",
        0.02,
        engine_reading=EngineReading(
            models=(
                ModelReading(
                    "m", kv_cache_usage_ratio=0.71, requests_waiting=3, requests_running=8, preemptions_total=5
                ),
                ModelReading(
                    "lora", kv_cache_usage_ratio=0.9, requests_waiting=1, requests_running=2, preemptions_total=0
                ),
            ),
            memory_utilization_ratio=0.9,
        ),
        restarts_total=4,
        last_restart_at=NOW - 120,
        startup_seconds=95.0,
    )
    down = TargetReading("sglang-1", "sglang", "http://127.0.0.1:30000", (1,), False, "down", 1.0, restarts_total=1)
    return Snapshot(
        gpus=gpus,
        targets=(vllm, down),
        sources={"nvml": OK, "targets": FAILED, "settings": OK},
        collected_at=NOW,
        memory={
            "vllm-0": TargetMemory((("", "0"),), 74 * GIB, 80 * GIB, 73 * GIB, 72 * GIB, 2 * GIB),
            "sglang-1": TargetMemory((("", "1"),), 20 * GIB, 80 * GIB, None, None, None),
        },
        gpu_memory={
            ("", "0"): _gpu_memory("", "0", 74 * GIB, 72 * GIB, 2 * GIB),
            ("", "2/1"): _gpu_memory("", "2/1", 39.5 * GIB, 0.0, 39.5 * GIB),
        },
        trends={
            TrendKey.of_gpu(("", "0")): _trend("climbing", 600.0),
            TrendKey.of_gpu(("", "1")): _trend("steady"),
            TrendKey("target", "vllm-0", "gpu"): _trend("climbing", 900.0),
        },
        trend_samples_total=120,
        events={
            "vllm-0": Counts(
                {"cuda_oom": 2, "container_oom_killed": 1, "engine_start": 4},
                {"cuda_oom": NOW - 600, "container_oom_killed": NOW - 60, "engine_start": NOW - 120},
            ),
            "sglang-1": Counts({"cuda_oom": 1}, {"cuda_oom": NOW - 86400}),
        },
        event_sources=(EventSourceHealth("sglang-1", "file:/var/log/sglang.log", ("startup_memory", "cuda_oom")),),
    )


def cluster() -> Snapshot:
    hostile = 'llm\u2028<img src=x onerror=alert(1)>\x1b]52;c;\x07"q"\\n\nnext\u202e'
    gpus = GpuReadings(
        up=True,
        gpus=(
            GpuReading(0, True, total_bytes=80 * GIB, used_bytes=79 * GIB, node="node-a"),
            GpuReading(1, True, total_bytes=80 * GIB, used_bytes=math.nan, node="node-a"),
            GpuReading(0, True, total_bytes=80 * GIB, used_bytes=60 * GIB, node="node-b\x85"),
            GpuReading(1, True, total_bytes=math.nan, used_bytes=10 * GIB, node="node-b\x85"),
        ),
        dcgm_families=(("node-a", "used", "DCGM_FI_DEV_FB_USED", "MiB"),),
    )
    leader = TargetReading(
        hostile,
        "vllm",
        "http://10.0.0.1:8000/\u2029",
        (),
        True,
        "up",
        0.02,
        engine_reading=EngineReading(models=(ModelReading("m\x1b[31m", 0.5, 48, 16, math.nan),)),
        pod=PodRef("ns\u2028", "vllm-0\x1b", "engine", probe_grace_seconds=300.0, node="node-a"),
        startup_seconds=420.0,
    )
    worker = TargetReading(
        "ray-worker",
        "vllm",
        "http://10.0.0.2:8000",
        (),
        True,
        "loading",
        0.02,
        engine_reading=EngineReading(models=(ModelReading("m", 0.99, 100, 1),)),
        pod=PodRef("ns", "ray-1", "engine", node="node-b\x85", leader_elsewhere=True),
    )
    return Snapshot(
        gpus=gpus,
        targets=(leader, worker),
        sources={"dcgm": OK, "targets": OK, "kubernetes\u2028": FAILED},
        collected_at=NOW,
        memory={
            hostile: TargetMemory((("node-a", "0"), ("node-a", "1")), 79 * GIB, 80 * GIB, None, 72 * GIB, 7 * GIB),
            "ray-worker": TargetMemory((("node-b\x85", "0"),), 60 * GIB, 80 * GIB, None, 72 * GIB, None),
        },
        gpu_memory={("node-a", "0"): _gpu_memory("node-a", "0", 79 * GIB, 72 * GIB, 7 * GIB)},
        trends={TrendKey.of_gpu(("node-a", "0")): _trend("spike", 30.0)},
        trend_samples_total=5,
        events={
            hostile: Counts(
                {"cgroup_oom_kill": 1, "startup_memory": 1}, {"cgroup_oom_kill": NOW - 10, "startup_memory": NOW - 5}
            )
        },
        node="node-a",
    )


def no_gpu_source() -> Snapshot:
    """GPUs read, but no GPU source among the sources (as exposition/__init__.py writes no GPU families then)."""
    snapshot = host()
    return Snapshot(
        gpus=snapshot.gpus,
        targets=snapshot.targets,
        sources={"targets": OK},
        collected_at=NOW,
        memory=snapshot.memory,
        gpu_memory=snapshot.gpu_memory,
        trends=snapshot.trends,
        trend_samples_total=None,  # trends off: no trend families
        events=snapshot.events,
    )


def many_gpus() -> Snapshot:
    """150 GPUs on three nodes, most of them equally used: the fullest 64, ties in the order read."""
    readings = tuple(
        GpuReading(i % 50, True, total_bytes=80 * GIB, used_bytes=(40 + (i % 7 == 0) * 30) * GIB, node=f"n{i // 50}")
        for i in range(150)
    )
    targets = tuple(
        TargetReading(f"t{i:03d}", "vllm", f"http://10.0.{i}.1:8000", (), i % 3 != 0, "up" if i % 3 else "down", 0.0)
        for i in range(80)
    )
    return Snapshot(
        gpus=GpuReadings(up=True, gpus=readings),
        targets=targets,
        sources={"dcgm": OK},
        collected_at=NOW,
        memory={
            t.name: TargetMemory(((f"n{i % 3}", str(i % 50)),), 40 * GIB, 80 * GIB, None, None, None)
            for i, t in enumerate(targets)
        },
    )


def history() -> dict[tuple[str, str], list[float]]:
    return {("", "0"): [0.8, 0.85, 0.9, 0.925], ("node-a", "0"): [0.5, 0.99]}


CASES = {"host": host, "cluster": cluster, "no_gpu_source": no_gpu_source, "many_gpus": many_gpus}


def thresholds_of(case: str) -> Thresholds | None:
    return None if case == "no_gpu_source" else default_thresholds()
