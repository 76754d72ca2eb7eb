"""The exposition is written straight to text; prometheus_client's writer is the reference it must equal.

`render` skips prometheus_client's per-sample validation for speed (see bench/bench_scrape.py),
so this test feeds both writers the same samples, label values that need escaping included,
and requires the same bytes; promtool then lints the result.
"""

from __future__ import annotations

import dataclasses

import support
from prometheus_client.exposition import generate_latest
from support import promtool_check_metrics, samples

from oomguard.common.kinds import HOST_EVENT_KINDS, LOG_EVENT_KINDS
from oomguard.exporter.exposition import METRICS, families, render
from oomguard.exporter.exposition.health import WEB_CONFIG_METRICS
from oomguard.exporter.join import join_gpus, join_targets
from oomguard.exporter.model import (
    HOST,
    Counts,
    EngineReading,
    EngineSetting,
    EventSourceHealth,
    GpuProcess,
    GpuReading,
    GpuReadings,
    LogStreams,
    MigInstance,
    ModelReading,
    PodRef,
    ProcessTree,
    Snapshot,
    SourceResult,
    TargetReading,
    Trend,
    TrendKey,
    TrendReading,
)

GIB = 2**30
AWKWARD = 'a "quoted" back\\slash\nnew line, ünïcode'


def busy_snapshot() -> Snapshot:
    """Every section of the exposition filled, with label values that need escaping."""
    trend = Trend("climbing", 0.93, 1e-4, 5e-5, 600.0, 70.0)
    model = ModelReading(AWKWARD, 0.97, 12.0, 3.0, 41.0, 1000.0, 250.0, 5.0, 8e9, 2e9, 1.0)
    snapshot = Snapshot(
        gpus=GpuReadings(
            up=True,
            driver_version="550.54.15",
            dcgm_families=(("gpu-a", "total", "DCGM_FI_DEV_FB_CAPACITY_BYTES", "bytes"),),
            gpus=(
                GpuReading(
                    0,
                    True,
                    uuid="GPU-1",
                    name="NVIDIA H200",
                    pci_bus_id="00000000:01:00.0",
                    total_bytes=140.0 * GIB,
                    used_bytes=131.5 * GIB,
                    free_bytes=8.5 * GIB,
                    reserved_bytes=0.5 * GIB,
                    utilization_ratio=0.99,
                    processes=(GpuProcess(4242, AWKWARD, 130.0 * GIB), GpuProcess(4243, "", None)),
                ),
                GpuReading(1, False, error="GPU is lost"),
                GpuReading(
                    2,
                    True,
                    uuid="MIG-3",
                    name="NVIDIA H200 MIG 3g.71gb",
                    total_bytes=71.0 * GIB,
                    used_bytes=1.0 * GIB,
                    mig=MigInstance("GPU-2", 1, 0, "3g.71gb"),
                ),
            ),
        ),
        targets=(
            TargetReading(
                name="vllm-0",
                engine="vllm",
                url="http://127.0.0.1:8000",
                gpus=(0,),
                up=True,
                state="up",
                scrape_duration_seconds=0.0213,
                health_status=200,
                health_latency_seconds=0.0011,
                engine_reading=EngineReading(
                    (model,), 0.9, 2048.0, 16.0, 120.0 * GIB, 1.7e9, "awake", (("weights", 15.0 * GIB),)
                ),
                process=ProcessTree(4242, frozenset({4242, 4250}), 3.5 * GIB, 1.7e9 + 0.25),
                errors_total={"timeout": 2, "refused": 0},
                restarts_total=3,
                last_restart_at=1.7e9 + 3600,
                startup_seconds=95.5,
                pod=PodRef("llm", "vllm-0", "vllm", probe_grace_seconds=65.0),
                figures_read={"kv_cache_usage": True, "preemptions": False},
                settings={
                    "max_num_seqs": EngineSetting(256.0, "flag"),
                    "gpu_memory_utilization": EngineSetting(0.9, "default"),
                },
            ),
            TargetReading("vllm-1", "vllm", "http://gpu-2:8000", (), False, "down", 1.0, error_kind="timeout"),
        ),
        sources={"nvml": SourceResult(True, 0.004), "targets": SourceResult(False, 1.0)},
        collected_at=1.7e9,
        trends={
            TrendKey("gpu", "0", "gpu"): TrendReading(trend, 140.0 * GIB),
            TrendKey("target", "vllm-0", "gpu"): TrendReading(trend, 140.0 * GIB),
            TrendKey("target", "vllm-0", "host"): TrendReading(trend, 64.0 * GIB),
        },
        trend_samples_total=900,
        trend_errors_total=1,
        events={"vllm-0": Counts({"cuda_oom": 4}, {"cuda_oom": 1.7e9 + 3000}), HOST: Counts({"kernel_oom_kill": 1})},
        event_sources=(
            EventSourceHealth("vllm-0", "file:/var/log/vllm.log", LOG_EVENT_KINDS, 10, 2048, 0, 0, 1, 0, files=1),
            EventSourceHealth(HOST, "kernel:/dev/kmsg", HOST_EVENT_KINDS, 3, 300, 0, 1),
            EventSourceHealth("vllm-0", "k8s-log:llm/vllm-0/vllm", LOG_EVENT_KINDS, 40, 4096, lines_dropped=25),
        ),
        event_state_write_errors=0,
        event_state_read_errors=0,
        xid={(0, 79): 1},
        xid_last={0: 1.7e9 + 10},
        xid_read_errors=0,
        dcgm_refusals={("gpu-a", "tenant", "fake-dcgm", "owner"): 1},
        dcgm_node_pods={"gpu-a": 1},
        log_streams=LogStreams(open=84, limit=84, waiting=216, refused_total=216),
    )
    # The joins are part of a collection: done here as the collection does them.
    memory = join_targets(snapshot.gpus, snapshot.targets)
    gpu_memory = join_gpus(snapshot.gpus, snapshot.targets, memory)
    return dataclasses.replace(snapshot, memory=memory, gpu_memory=gpu_memory)


class _Collector:
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self):
        return families(self.snapshot, keep_samples=True).metric_families()


def test_render_equals_prometheus_client_writer(promtool: str) -> None:
    snapshot = busy_snapshot()
    ours = render(snapshot)
    assert ours == generate_latest(_Collector(snapshot))  # type: ignore[arg-type]
    assert render(snapshot) == ours  # again, from the cache of series prefixes
    assert b'\\"quoted\\" back\\\\slash\\nnew line' in ours  # the escaping was exercised
    assert promtool_check_metrics(promtool, ours) == ""


def test_busy_snapshot_fills_most_metrics() -> None:
    # Guards the test above against a snapshot that leaves sections out (the host had no event yet).
    text = render(busy_snapshot()).decode()
    missing = [m.name for m in METRICS if f"# TYPE {m.name}" not in text]
    # The web configuration's metrics are the web layer's, appended after the snapshot's (tests/web_config).
    web_config = [m.name for m in WEB_CONFIG_METRICS]
    assert missing == ["oomguard_host_last_event_timestamp_seconds", *web_config], missing


def test_a_discovered_targets_series_carry_its_pod_and_the_others_empty_ones() -> None:
    pod = TargetReading("llm/vllm-0", "vllm", "http://10.1.2.3:8000", (), True, "up", 0.01,
                        pod=PodRef("llm", "vllm-0", "vllm", probe_grace_seconds=65.0))  # fmt: skip
    static = TargetReading("static", "vllm", "http://127.0.0.1:8000", (), True, "up", 0.01)
    text = render(Snapshot(gpus=None, targets=(pod, static), sources={}, collected_at=1.7e9)).decode()
    assert 'oomguard_target_up{container="vllm",namespace="llm",pod="vllm-0",target="llm/vllm-0"} 1.0' in text
    assert 'oomguard_target_up{container="",namespace="",pod="",target="static"} 1.0' in text
    assert (
        'oomguard_target_probe_grace_seconds{container="vllm",namespace="llm",pod="vllm-0",target="llm/vllm-0"} 65.0'
        in text
    )


def test_values_are_written_as_prometheus_client_writes_them_cached_or_not() -> None:
    """The encoder keeps each value's text: 0.0 and -0.0 (one key, two texts), NaN and the infinities included,
    and once its bound is reached it starts over rather than growing. Through `Exposition.add` as well: -0.0 is
    never written as 0.0's text."""
    from prometheus_client.utils import floatToGoString

    from oomguard.exporter.exposition import encoder

    values = [0.0, -0.0, 1, 1.0, True, 6.4e10, 123456789.0, 1e-7, float("nan"), float("inf"), -float("inf"), -3.5]
    for _ in range(2):  # the second time from the cache
        for value in values:
            assert encoder._value_text(value) == floatToGoString(value) + "\n", value
            cached = encoder._VALUES.get(value)
            assert cached in (None, floatToGoString(value) + "\n") or value == 0, value
    assert encoder._VALUES[-0.0] == "0.0\n"  # the key of both zeros holds 0.0's text...
    spec = encoder.MetricSpec("oomguard_x", "gauge", "", ("a",), "x", "s")
    out = encoder.Exposition((spec,), frozenset({spec}))
    for label, value in (("p", 0.0), ("n", -0.0), ("p2", 0.0)):
        out.add(spec, (label,), value)
    assert out.render().decode().splitlines()[2:] == [
        'oomguard_x{a="p"} 0.0',
        'oomguard_x{a="n"} -0.0',
        'oomguard_x{a="p2"} 0.0',
    ]
    for i in range(encoder._VALUES_MAX + 10):
        encoder._value_text(i + 0.5)
    assert len(encoder._VALUES) <= encoder._VALUES_MAX
    assert encoder._VALUES[0.0] == "0.0\n"  # ...also after the cache started over


def test_label_values_hold_no_character_a_line_splitter_or_a_terminal_acts_on(promtool: str) -> None:
    """A model's or a process's name is the engine's or the tenant's: the text format escapes only backslash, quote
    and line feed, and prometheus_client writes CR, NEL, U+2028, ESC raw, which `str.splitlines()` breaks at and a
    terminal acts on. Each is written as its visible escape; Prometheus' parsers read the value back as that text."""
    from oomguard.common.visible import ACTING, visible

    hostile = "".join(map(chr, [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, *range(0x202A, 0x202F),
                                *range(0x2066, 0x206A)])) + '\\"end'  # fmt: skip
    snapshot = busy_snapshot()
    target = snapshot.targets[0]
    reading = dataclasses.replace(target.engine_reading, models=(ModelReading(hostile, 0.5, 1.0, 2.0, 3.0),))
    gpu = dataclasses.replace(snapshot.gpus.gpus[0], processes=(GpuProcess(4242, hostile, GIB),))
    snapshot = dataclasses.replace(
        snapshot,
        targets=(dataclasses.replace(target, engine_reading=reading), *snapshot.targets[1:]),
        gpus=dataclasses.replace(snapshot.gpus, gpus=(gpu, *snapshot.gpus.gpus[1:])),
    )
    text = render(snapshot).decode()
    assert not ACTING.search(text.replace("\n", "")), ascii(ACTING.search(text.replace("\n", "")))
    assert text.splitlines() == text.split("\n")[:-1]
    assert promtool_check_metrics(promtool, text.encode()) == ""
    shown = "".join(c if c == "\n" else visible(c) for c in hostile)  # a line feed keeps the format's own escape
    read = {(name, dict(labels).get("model_name", dict(labels).get("process_name"))) for name, labels in samples(text)}
    assert ("oomguard_engine_requests_waiting", shown) in read
    assert ("oomguard_gpu_process_memory_used_bytes", shown) in read


def test_a_used_figure_above_the_total_reads_as_full_never_above_one() -> None:
    """A used figure above the total (dcgm-exporter's used MiB, rounded up, against the exact bytes of a full GPU;
    a driver's glitch) is published as read, and its ratios, documented 0-1, as 1."""
    gpu = GpuReading(0, True, uuid="GPU-1", total_bytes=80.0 * GIB, used_bytes=90.0 * GIB, processes=())
    target = TargetReading("vllm-0", "vllm", "http://127.0.0.1:8000", (0,), True, "up", 0.01)
    nvml = GpuReadings(up=True, gpus=(gpu,))
    snapshot = Snapshot(gpus=nvml, targets=(target,), sources={"nvml": SourceResult(True, 0.004)}, collected_at=1.7e9)
    memory = join_targets(snapshot.gpus, snapshot.targets)
    snapshot = dataclasses.replace(snapshot, memory=memory, gpu_memory=join_gpus(nvml, snapshot.targets, memory))
    text = render(snapshot).decode()
    assert support.value(text, "oomguard_gpu_memory_used_bytes", gpu="0") == 90.0 * GIB
    assert support.value(text, "oomguard_gpu_memory_used_ratio", gpu="0") == 1.0
    assert support.value(text, "oomguard_target_gpu_memory_used_ratio", target="vllm-0") == 1.0
