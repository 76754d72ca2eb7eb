"""Every metric oomguard exports: declared once here, rendered fresh from each snapshot.

`METRICS` is the single list of names, types, labels and meanings; `docs/metrics.md`
is generated from it (`oomguard docs`), so a metric cannot ship undocumented.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from oomguard import __version__
from oomguard.collector import Snapshot
from oomguard.events.detector import EVENT_KINDS
from oomguard.events.runner import HOST, Counts
from oomguard.snapshot import ERROR_KINDS, TARGET_STATES, GpuReading, TargetReading
from oomguard.trend.analysis import STATES


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    kind: str  # gauge | counter | info
    unit: str
    labels: tuple[str, ...]
    help: str
    section: str


def _m(section: str, name: str, kind: str, unit: str, labels: str, help_text: str) -> MetricSpec:
    return MetricSpec(f"oomguard_{name}", kind, unit, tuple(labels.split()) if labels else (), help_text, section)


GPU, ENGINE, JOINED, HEALTH = "GPU (NVML)", "Engine (per target)", "Joined: GPU x engine", "Exporter health"
TREND = "Memory trend (see docs/trend.md)"
EVENTS = "Events: OOMs, restarts, kernel OOM kills, XIDs (see docs/events.md)"
_STATE_HELP = "1 for the current trend state (steady, sawtooth, climbing, spike, saturated; defined in docs/trend.md), 0 for the others."
METRICS: tuple[MetricSpec, ...] = (
    _m(
        GPU,
        "gpu_info",
        "info",
        "",
        "gpu uuid name pci_bus_id driver_version",
        "Identity of a GPU; join on `gpu` to add names to other series.",
    ),
    _m(
        GPU,
        "gpu_up",
        "gauge",
        "",
        "gpu",
        "1 when NVML answers for this GPU, 0 when it is lost (fell off the bus, needs a reset).",
    ),
    _m(GPU, "gpu_memory_total_bytes", "gauge", "bytes", "gpu", "Total memory of the GPU."),
    _m(
        GPU,
        "gpu_memory_used_bytes",
        "gauge",
        "bytes",
        "gpu",
        "Memory allocated by processes (NVML `used`; excludes the driver's reservation where NVML reports it apart).",
    ),
    _m(GPU, "gpu_memory_free_bytes", "gauge", "bytes", "gpu", "Memory free for allocation."),
    _m(
        GPU,
        "gpu_memory_reserved_bytes",
        "gauge",
        "bytes",
        "gpu",
        "Memory reserved by the driver and firmware (NVML memory info v2; absent on drivers with v1 only).",
    ),
    _m(GPU, "gpu_memory_used_ratio", "gauge", "ratio", "gpu", "used / total, 0-1: the figure the 90 % alert watches."),
    _m(GPU, "gpu_utilization_ratio", "gauge", "ratio", "gpu", "Share of the last sample period a kernel ran, 0-1."),
    _m(
        GPU,
        "gpu_process_memory_used_bytes",
        "gauge",
        "bytes",
        "gpu pid process_name",
        "GPU memory used by one compute process (absent when NVML cannot say).",
    ),
    _m(
        GPU,
        "gpu_process_query_success",
        "gauge",
        "",
        "gpu",
        "1 when the per-process query worked, so an absent process series means an idle GPU and not a failed query.",
    ),
    _m(ENGINE, "target_info", "info", "", "target engine url", "A configured engine target."),
    _m(
        ENGINE,
        "engine_kv_cache_usage_ratio",
        "gauge",
        "ratio",
        "target model_name",
        "Share of the engine's KV cache blocks in use, 0-1 (vLLM `kv_cache_usage_perc`, or `gpu_cache_usage_perc` before 0.9), averaged over data-parallel engines.",
    ),
    _m(
        ENGINE,
        "engine_requests_waiting",
        "gauge",
        "requests",
        "target model_name",
        "Requests queued, not yet scheduled; a queue that stays up means concurrency is over-provisioned.",
    ),
    _m(ENGINE, "engine_requests_running", "gauge", "requests", "target model_name", "Requests in the running batch."),
    _m(
        ENGINE,
        "engine_preemptions",
        "counter",
        "",
        "target model_name",
        "Requests preempted because the KV cache was full (the engine's own counter, summed over engines).",
    ),
    _m(
        ENGINE,
        "engine_prefix_cache_queries_tokens",
        "counter",
        "tokens",
        "target model_name",
        "Tokens looked up in the prefix cache.",
    ),
    _m(
        ENGINE,
        "engine_prefix_cache_hits_tokens",
        "counter",
        "tokens",
        "target model_name",
        "Tokens found in the prefix cache.",
    ),
    _m(
        ENGINE,
        "engine_gpu_memory_utilization_ratio",
        "gauge",
        "ratio",
        "target",
        "The engine's configured share of each GPU's memory (vLLM `gpu_memory_utilization`).",
    ),
    _m(
        ENGINE,
        "engine_kv_cache_blocks",
        "gauge",
        "blocks",
        "target",
        "KV cache blocks the engine allocated at start (vLLM `num_gpu_blocks`).",
    ),
    _m(ENGINE, "engine_kv_cache_block_size_tokens", "gauge", "tokens", "target", "Tokens per KV cache block."),
    _m(
        ENGINE,
        "engine_kv_cache_memory_bytes",
        "gauge",
        "bytes",
        "target",
        "Memory the engine reserved for its KV cache (recent vLLM only).",
    ),
    _m(
        ENGINE,
        "engine_process_start_time_seconds",
        "gauge",
        "seconds",
        "target",
        "Start time of the engine's API server process, Unix time; a change is a restart.",
    ),
    _m(
        JOINED,
        "target_gpu_info",
        "info",
        "",
        "target gpu",
        "Which GPUs a target runs on (from `gpus:` in the config, else from NVML's process list).",
    ),
    _m(
        JOINED,
        "target_gpu_memory_used_bytes",
        "gauge",
        "bytes",
        "target",
        "Memory used on the target's GPUs, all processes together.",
    ),
    _m(JOINED, "target_gpu_memory_total_bytes", "gauge", "bytes", "target", "Total memory of the target's GPUs."),
    _m(JOINED, "target_gpu_memory_used_ratio", "gauge", "ratio", "target", "Used / total over the target's GPUs, 0-1."),
    _m(
        JOINED,
        "target_process_gpu_memory_bytes",
        "gauge",
        "bytes",
        "target",
        "GPU memory used by the target's own processes (local targets, from NVML's per-process list).",
    ),
    _m(
        JOINED,
        "target_memory_budget_bytes",
        "gauge",
        "bytes",
        "target",
        "The engine's memory budget: gpu_memory_utilization x total memory of its GPUs.",
    ),
    _m(
        JOINED,
        "target_memory_over_budget_bytes",
        "gauge",
        "bytes",
        "target",
        "Memory in use minus the budget (the target's processes where known, else the whole GPUs). Above 0 is memory the KV cache cannot explain: activations, another process, a leak.",
    ),
    _m(
        JOINED,
        "target_resident_memory_bytes",
        "gauge",
        "bytes",
        "target",
        "Host RSS of the target's processes (the listener and its children), for CPU deployments and host-memory leaks.",
    ),
    _m(TREND, "gpu_memory_trend_state", "gauge", "", "gpu state", _STATE_HELP),
    _m(
        TREND,
        "gpu_memory_slope_bytes_per_second",
        "gauge",
        "bytes/s",
        "gpu window",
        "Robust slope (Theil-Sen over bucket medians) of used memory over the short or long window.",
    ),
    _m(
        TREND,
        "gpu_memory_climb_seconds",
        "gauge",
        "seconds",
        "gpu",
        "How long used memory has risen without falling back by more than the tolerance.",
    ),
    _m(
        TREND,
        "gpu_memory_seconds_to_full",
        "gauge",
        "seconds",
        "gpu",
        "At the current pace, time until the GPU is full; only while climbing or spiking.",
    ),
    _m(
        TREND,
        "target_memory_trend_state",
        "gauge",
        "",
        "target memory state",
        _STATE_HELP + " `memory` is gpu (the target's GPUs) or host (its processes' RSS against host memory).",
    ),
    _m(
        TREND,
        "target_memory_slope_bytes_per_second",
        "gauge",
        "bytes/s",
        "target memory window",
        "Robust slope of the target's memory over the short or long window.",
    ),
    _m(
        TREND,
        "target_memory_climb_seconds",
        "gauge",
        "seconds",
        "target memory",
        "How long the target's memory has risen without falling back.",
    ),
    _m(
        TREND,
        "target_memory_seconds_to_full",
        "gauge",
        "seconds",
        "target memory",
        "At the current pace, time until the target's GPUs (or the host) are full; only while climbing or spiking.",
    ),
    _m(
        TREND,
        "target_memory_seconds_to_budget",
        "gauge",
        "seconds",
        "target",
        "At the current pace, time until the target's GPUs pass the engine's budget (gpu_memory_utilization); 0 when already past; only while climbing or spiking.",
    ),
    _m(TREND, "trend_samples", "counter", "", "", "Background memory samples taken (every trend.interval_seconds)."),
    _m(TREND, "trend_sample_errors", "counter", "", "", "Background samples that failed."),
    _m(
        EVENTS,
        "target_events",
        "counter",
        "",
        "target kind",
        "Events of the target by kind: cuda_oom, startup_memory, engine_death (from its logs, one per incident however many lines), cgroup_oom_kill (its cgroup's memory.events). Zero from the start for every kind its sources can see.",
    ),
    _m(
        EVENTS,
        "target_last_event_timestamp_seconds",
        "gauge",
        "seconds",
        "target kind",
        "When the last event of the kind was seen, Unix time: `time() - x < window` catches the first event of a new series, which increase() misses.",
    ),
    _m(
        EVENTS,
        "target_restarts",
        "counter",
        "",
        "target",
        "New lives of the engine: a new process start time or pid, or a return to up after down or loading with neither known.",
    ),
    _m(
        EVENTS,
        "target_last_restart_timestamp_seconds",
        "gauge",
        "seconds",
        "target",
        "When the engine last restarted (its new process start), Unix time.",
    ),
    _m(
        EVENTS,
        "target_startup_seconds",
        "gauge",
        "seconds",
        "target",
        "The last start watched: from the process start (to a clock tick, local targets) or from the first scrape that saw it not up, to the first /health 200. Compare with the probe's initial delay.",
    ),
    _m(EVENTS, "host_events", "counter", "", "kind", "Host events by kind: kernel_oom_kill (from the kernel log)."),
    _m(
        EVENTS,
        "host_last_event_timestamp_seconds",
        "gauge",
        "seconds",
        "kind",
        "When the last host event of the kind was seen, Unix time.",
    ),
    _m(
        EVENTS,
        "gpu_events",
        "counter",
        "",
        "gpu kind xid",
        "GPU events from NVML: kind xid, by XID code (31 page fault, 43 GPU stopped, 48 double-bit ECC, 79 fell off the bus).",
    ),
    _m(
        EVENTS,
        "gpu_last_event_timestamp_seconds",
        "gauge",
        "seconds",
        "gpu kind",
        "When the GPU's last XID was seen, Unix time.",
    ),
    _m(
        EVENTS,
        "event_source_lines_read",
        "counter",
        "",
        "target source",
        "Lines read from an event source (file:GLOB, journald:UNIT, k8s:NS/POD/CONTAINER, kernel:PATH); target is empty for the host.",
    ),
    _m(
        EVENTS,
        "event_source_bytes_behind",
        "gauge",
        "bytes",
        "target source",
        "Bytes written to the source's files and not read yet.",
    ),
    _m(
        EVENTS,
        "event_source_read_errors",
        "counter",
        "",
        "target source",
        "Failed reads of the source (vanished file, permission, journalctl error): rising means events may be missed.",
    ),
    _m(HEALTH, "build_info", "info", "", "version python_version", "The running oomguard."),
    _m(
        HEALTH,
        "source_success",
        "gauge",
        "",
        "source",
        "1 when the source (nvml, targets) completed in time in the last collection.",
    ),
    _m(
        HEALTH,
        "source_duration_seconds",
        "gauge",
        "seconds",
        "source",
        "How long the source took in the last collection.",
    ),
    _m(
        HEALTH,
        "nvml_up",
        "gauge",
        "",
        "",
        "1 when the NVML library is loaded and answering; 0 on a host without an NVIDIA driver.",
    ),
    _m(
        HEALTH,
        "target_up",
        "gauge",
        "",
        "target",
        "1 when the target's /metrics was read and understood in the last collection.",
    ),
    _m(
        HEALTH,
        "target_state",
        "gauge",
        "",
        "target state",
        "1 for the target's current state: up (health 200), loading (never healthy since first seen, or refusing since its process restarted), down (was up, now refuses or fails).",
    ),
    _m(
        HEALTH,
        "target_scrape_duration_seconds",
        "gauge",
        "seconds",
        "target",
        "Time to read the target's /metrics and /health.",
    ),
    _m(
        HEALTH,
        "target_scrape_errors",
        "counter",
        "",
        "target kind",
        "Failed reads of a target by kind: " + ", ".join(ERROR_KINDS) + ".",
    ),
    _m(
        HEALTH,
        "target_health_status_code",
        "gauge",
        "",
        "target",
        "HTTP status of the target's /health (absent when it did not answer).",
    ),
    _m(
        HEALTH,
        "target_health_latency_seconds",
        "gauge",
        "seconds",
        "target",
        "Time for /health to answer (absent when it did not answer).",
    ),
)
SPECS = {spec.name.removeprefix("oomguard_"): spec for spec in METRICS}


def _header(spec: MetricSpec) -> str:
    """# HELP and # TYPE as the text format writes them (counters named with _total, info as gauge)."""
    name = spec.name + "_total" if spec.kind == "counter" else spec.name
    kind = "counter" if spec.kind == "counter" else "gauge"
    help_text = spec.help.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"


# Per metric, computed once: its header, its sample name, and its labels in the sorted
# order of the text format (prometheus_client sorts them; the golden test holds us to it).
_HEADERS = {key: _header(spec) for key, spec in SPECS.items()}
_SAMPLE_NAMES = {key: spec.name + "_total" if spec.kind == "counter" else spec.name for key, spec in SPECS.items()}
_LABEL_ORDER = {key: sorted(enumerate(spec.labels), key=lambda item: item[1]) for key, spec in SPECS.items()}


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


# "name{labels} " by metric and label values: the same series come back at every scrape.
_PREFIXES: dict[tuple[str, tuple[str, ...]], str] = {}
_PREFIXES_MAX = 50_000  # label values churn (pids, restarts): cleared when this full, not grown forever


def _prefix(key: str, labels: tuple[str, ...]) -> str:
    name, order = _SAMPLE_NAMES[key], _LABEL_ORDER[key]
    if order:
        pairs = ",".join(f'{label}="{_escape(labels[i])}"' for i, label in order)
        prefix = f"{name}{{{pairs}}} "
    else:
        prefix = f"{name} "
    if len(_PREFIXES) >= _PREFIXES_MAX:
        _PREFIXES.clear()
    _PREFIXES[(key, labels)] = prefix
    return prefix


class _Families:
    """Fresh samples for one render; `add` skips values we do not have (never NaN).

    Written straight to the text format rather than through prometheus_client's
    generate_latest, which validates and escapes every name on every sample: most of the
    render time for names declared once above. `metric_families` gives the same
    samples as prometheus_client objects, and a test holds the two outputs byte-equal.
    """

    def __init__(self) -> None:
        self._samples: dict[str, list[tuple[tuple[str, ...], float]]] = {}

    def add(self, key: str, labels: tuple[str, ...], value: float | None) -> None:
        if value is None:
            return
        samples = self._samples.get(key)
        if samples is None:
            assert key in SPECS, key
            samples = self._samples[key] = []
        samples.append((labels, value))

    def render(self) -> bytes:
        out: list[str] = []
        # Spec order, so the exposition is stable whatever the order of sources.
        for key, header in _HEADERS.items():
            samples = self._samples.get(key)
            if not samples:
                continue
            out.append(header)
            for labels, value in samples:
                prefix = _PREFIXES.get((key, labels)) or _prefix(key, labels)
                out.append(f"{prefix}{floatToGoString(value)}\n")
        return "".join(out).encode()

    def metric_families(self) -> Iterator[Metric]:
        for key, spec in SPECS.items():
            samples = self._samples.get(key)
            if not samples:
                continue
            cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            family = cls(spec.name, spec.help, labels=spec.labels, unit="")
            for labels, value in samples:
                family.add_metric(list(labels), value)
            yield family


def _gpu_families(out: _Families, gpus: tuple[GpuReading, ...], driver: str) -> None:
    for gpu in gpus:
        g = str(gpu.index)
        out.add("gpu_up", (g,), 1.0 if gpu.up else 0.0)
        if gpu.uuid:
            out.add("gpu_info", (g, gpu.uuid, gpu.name, gpu.pci_bus_id, driver), 1.0)
        out.add("gpu_memory_total_bytes", (g,), gpu.total_bytes)
        out.add("gpu_memory_used_bytes", (g,), gpu.used_bytes)
        out.add("gpu_memory_free_bytes", (g,), gpu.free_bytes)
        out.add("gpu_memory_reserved_bytes", (g,), gpu.reserved_bytes)
        if gpu.total_bytes and gpu.used_bytes is not None:
            out.add("gpu_memory_used_ratio", (g,), gpu.used_bytes / gpu.total_bytes)
        out.add("gpu_utilization_ratio", (g,), gpu.utilization_ratio)
        if gpu.up and not gpu.error:
            out.add("gpu_process_query_success", (g,), 0.0 if gpu.processes is None else 1.0)
        for proc in gpu.processes or ():
            out.add("gpu_process_memory_used_bytes", (g, str(proc.pid), proc.name), proc.used_bytes)


def _target_gpus(target: TargetReading, gpus: dict[int, GpuReading]) -> list[int]:
    if target.gpus:
        return [i for i in target.gpus if i in gpus]
    if target.process is None:
        return []
    return sorted(i for i, g in gpus.items() if any(p.pid in target.process.pids for p in g.processes or ()))


def _target_families(out: _Families, target: TargetReading, gpus: dict[int, GpuReading]) -> None:
    t = target.name
    out.add("target_info", (t, target.engine, target.url), 1.0)
    out.add("target_up", (t,), 1.0 if target.up else 0.0)
    for state in TARGET_STATES:
        out.add("target_state", (t, state), 1.0 if target.state == state else 0.0)
    out.add("target_scrape_duration_seconds", (t,), target.scrape_duration_seconds)
    for kind in ERROR_KINDS:
        out.add("target_scrape_errors", (t, kind), float(target.errors_total.get(kind, 0)))
    out.add("target_health_status_code", (t,), target.health_status)
    out.add("target_health_latency_seconds", (t,), target.health_latency_seconds)
    if target.process is not None:
        out.add("target_resident_memory_bytes", (t,), target.process.resident_bytes)

    reading = target.engine_reading
    if reading is not None:
        for model in reading.models:
            labels = (t, model.model_name)
            out.add("engine_kv_cache_usage_ratio", labels, model.kv_cache_usage_ratio)
            out.add("engine_requests_waiting", labels, model.requests_waiting)
            out.add("engine_requests_running", labels, model.requests_running)
            out.add("engine_preemptions", labels, model.preemptions_total)
            out.add("engine_prefix_cache_queries_tokens", labels, model.prefix_cache_queries_total)
            out.add("engine_prefix_cache_hits_tokens", labels, model.prefix_cache_hits_total)
        out.add("engine_gpu_memory_utilization_ratio", (t,), reading.memory_utilization_ratio)
        out.add("engine_kv_cache_blocks", (t,), reading.kv_cache_blocks)
        out.add("engine_kv_cache_block_size_tokens", (t,), reading.kv_cache_block_size_tokens)
        out.add("engine_kv_cache_memory_bytes", (t,), reading.kv_cache_memory_bytes)
        out.add("engine_process_start_time_seconds", (t,), reading.process_start_time_seconds)

    mine = [gpus[i] for i in _target_gpus(target, gpus)]
    for gpu in mine:
        out.add("target_gpu_info", (t, str(gpu.index)), 1.0)
    measured = [g for g in mine if g.total_bytes and g.used_bytes is not None]
    if not measured:
        return
    total = sum(g.total_bytes or 0.0 for g in measured)
    used = sum(g.used_bytes or 0.0 for g in measured)
    out.add("target_gpu_memory_used_bytes", (t,), used)
    out.add("target_gpu_memory_total_bytes", (t,), total)
    out.add("target_gpu_memory_used_ratio", (t,), used / total)
    own: float | None = None
    if target.process is not None and all(g.processes is not None for g in measured):
        mine_procs = [p for g in measured for p in g.processes or () if p.pid in target.process.pids]
        # No match at all: the exporter sees other pids than NVML (a container without the
        # host PID namespace), so "0 bytes" would be a lie; fall back to the whole GPUs.
        if mine_procs:
            own = sum(p.used_bytes or 0.0 for p in mine_procs)
            out.add("target_process_gpu_memory_bytes", (t,), own)
    if reading is not None and reading.memory_utilization_ratio is not None:
        budget = reading.memory_utilization_ratio * total
        out.add("target_memory_budget_bytes", (t,), budget)
        out.add("target_memory_over_budget_bytes", (t,), (own if own is not None else used) - budget)


def _trend_families(out: _Families, snapshot: Snapshot) -> None:
    if snapshot.trend_samples_total is None:
        return
    out.add("trend_samples", (), float(snapshot.trend_samples_total))
    out.add("trend_sample_errors", (), float(snapshot.trend_errors_total))
    budgets = {
        t.name: t.engine_reading.memory_utilization_ratio for t in snapshot.targets if t.engine_reading is not None
    }
    for key, reading in sorted(snapshot.trends.items(), key=lambda kv: (kv[0].kind, kv[0].name, kv[0].memory)):
        trend, capacity = reading.trend, reading.capacity_bytes
        prefix, labels = ("gpu_memory", (key.name,)) if key.kind == "gpu" else ("target_memory", (key.name, key.memory))
        for state in STATES:
            out.add(f"{prefix}_trend_state", (*labels, state), 1.0 if trend.state == state else 0.0)
        for window, slope in (("short", trend.slope_short), ("long", trend.slope_long)):
            out.add(f"{prefix}_slope_bytes_per_second", (*labels, window), None if slope is None else slope * capacity)
        out.add(f"{prefix}_climb_seconds", labels, trend.climb_seconds)
        out.add(f"{prefix}_seconds_to_full", labels, trend.seconds_to_full)
        budget = budgets.get(key.name)
        if key.kind == "target" and key.memory == "gpu" and budget is not None:
            out.add("target_memory_seconds_to_budget", (key.name,), trend.seconds_to(budget))


def _event_families(out: _Families, snapshot: Snapshot) -> None:
    sources_of: dict[str, set[str]] = {}
    for health in snapshot.event_sources:
        sources_of.setdefault(health.target, set()).add(health.source.partition(":")[0])
        labels = (health.target, health.source)
        out.add("event_source_lines_read", labels, float(health.lines_read))
        out.add("event_source_bytes_behind", labels, float(health.bytes_behind))
        out.add("event_source_read_errors", labels, float(health.read_errors))
    for target in snapshot.targets:
        kinds: set[str] = set()
        if sources_of.get(target.name, set()) - {"cgroup"}:
            kinds.update(EVENT_KINDS)  # zeros from the start: increase() then sees the first event
        if "cgroup" in sources_of.get(target.name, set()):
            kinds.add("cgroup_oom_kill")
        counts = snapshot.events.get(target.name, Counts())
        kinds.update(counts.total)
        for kind in sorted(kinds):
            out.add("target_events", (target.name, kind), float(counts.total.get(kind, 0)))
            out.add("target_last_event_timestamp_seconds", (target.name, kind), counts.last.get(kind))
        out.add("target_restarts", (target.name,), float(target.restarts_total))
        out.add("target_last_restart_timestamp_seconds", (target.name,), target.last_restart_at)
        out.add("target_startup_seconds", (target.name,), target.startup_seconds)
    if HOST in sources_of:
        host = snapshot.events.get(HOST, Counts())
        out.add("host_events", ("kernel_oom_kill",), float(host.total.get("kernel_oom_kill", 0)))
        out.add("host_last_event_timestamp_seconds", ("kernel_oom_kill",), host.last.get("kernel_oom_kill"))
    for (gpu, xid), n in sorted(snapshot.xid.items()):
        out.add("gpu_events", (str(gpu), "xid", str(xid)), float(n))
    for gpu, at in sorted(snapshot.xid_last.items()):
        out.add("gpu_last_event_timestamp_seconds", (str(gpu), "xid"), at)


def families(snapshot: Snapshot) -> _Families:
    out = _Families()
    out.add("build_info", (__version__, platform.python_version()), 1.0)
    for name, result in sorted(snapshot.sources.items()):
        out.add("source_success", (name,), 1.0 if result.success else 0.0)
        out.add("source_duration_seconds", (name,), result.duration_seconds)
    gpus: dict[int, GpuReading] = {}
    if "nvml" in snapshot.sources:
        nvml = snapshot.nvml
        out.add("nvml_up", (), 1.0 if nvml is not None and nvml.up else 0.0)
        if nvml is not None:
            _gpu_families(out, nvml.gpus, nvml.driver_version)
            gpus = {g.index: g for g in nvml.gpus if g.up}
    for target in snapshot.targets:
        _target_families(out, target, gpus)
    _trend_families(out, snapshot)
    _event_families(out, snapshot)
    return out


def render(snapshot: Snapshot) -> bytes:
    """The text exposition of one snapshot."""
    return families(snapshot).render()
