"""Health of the monitor: which oomguard, how each source fared, and each target's scrape."""

from __future__ import annotations

import platform
from collections.abc import Mapping

from oomguard import __version__
from oomguard.exporter.exposition.encoder import Exposition
from oomguard.exporter.exposition.spec import CONDITIONAL, EVENT, metric
from oomguard.exporter.model import (
    ERROR_KINDS,
    GPU_SOURCES,
    TARGET_STATES,
    VALUE_REJECT_REASONS,
    Snapshot,
    TargetReading,
)

SECTION = "Exporter health"
BUILD_INFO = metric(SECTION, "build_info", "info", "", "version python_version", "The running oomguard.")
SOURCE_SUCCESS = metric(
    SECTION,
    "source_success",
    "gauge",
    "",
    "source",
    f"1 when the source ({' or '.join(GPU_SOURCES)}, targets, processes, settings, events, local_discovery, kubernetes, pod_processes: those in use) completed in time in its last run; for kubernetes, its last list or watch of the API.",
)
SOURCE_DURATION_SECONDS = metric(
    SECTION,
    "source_duration_seconds",
    "gauge",
    "seconds",
    "source",
    "How long the source took in its last run.",
)
NVML_UP = metric(
    SECTION,
    "nvml_up",
    "gauge",
    "",
    "",
    "1 when the NVML library is loaded and answering; 0 on a host without an NVIDIA driver. Absent when "
    "nvml.enabled is false (a CPU deployment). Where GPUs are read from dcgm-exporter instead (`dcgm:`), 1 while "
    'any of its endpoints answers (each failing one makes oomguard_source_success{source="dcgm"} 0).',
    presence=CONDITIONAL,
)
TARGET_UP = metric(
    SECTION,
    "target_up",
    "gauge",
    "",
    "target",
    "1 when the target's /metrics was read and understood in the last collection.",
)
TARGET_STATE = metric(
    SECTION,
    "target_state",
    "gauge",
    "",
    "target state",
    "1 for the target's current state: up (health 200), loading (never healthy since first seen, or refusing since its process restarted), down (was up, now refuses or fails).",
)
TARGET_SCRAPE_DURATION_SECONDS = metric(
    SECTION,
    "target_scrape_duration_seconds",
    "gauge",
    "seconds",
    "target",
    "Time to read the target's /metrics and /health.",
)
TARGET_SCRAPE_ERRORS = metric(
    SECTION,
    "target_scrape_errors",
    "counter",
    "",
    "target kind",
    "Failed reads of a target by kind: " + ", ".join(ERROR_KINDS) + " (limit: over the target's sample_limit, "
    "label_value_length_limit or label_limit, the reading dropped whole).",
)
TARGET_VALUES_REJECTED = metric(
    SECTION,
    "target_values_rejected",
    "counter",
    "",
    "target reason",
    "Values of a target's engine dropped from its reading, by reason: non_finite (NaN, +Inf, -Inf), negative (a "
    "count, size or ratio below 0), out_of_range (a ratio above 1, a reservation of 0). The rest of the reading "
    "is kept.",
)
TARGET_HEALTH_STATUS_CODE = metric(
    SECTION,
    "target_health_status_code",
    "gauge",
    "",
    "target",
    "HTTP status of the target's /health (absent when it did not answer).",
    presence=CONDITIONAL,
)
TARGET_HEALTH_LATENCY_SECONDS = metric(
    SECTION,
    "target_health_latency_seconds",
    "gauge",
    "seconds",
    "target",
    "Time for /health to answer (absent when it did not answer).",
    presence=CONDITIONAL,
)
WEB_CONFIG_LAST_RELOAD_SUCCESSFUL = metric(
    SECTION,
    "web_config_last_reload_successful",
    "gauge",
    "",
    "",
    "1 when the last read of --web.config.file (and the files it names) succeeded; 0 while a bad change is refused and the last good configuration serves. Only with --web.config.file.",
    presence=CONDITIONAL,
)
WEB_CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP_SECONDS = metric(
    SECTION,
    "web_config_last_reload_success_timestamp_seconds",
    "gauge",
    "seconds",
    "",
    "When the web configuration in force was read (Unix time). Only with --web.config.file.",
    presence=CONDITIONAL,
)
WEB_REQUESTS_REFUSED = metric(
    SECTION,
    "web_requests_refused",
    "counter",
    "",
    "reason",
    "Requests refused before their handler: unauthorized (401: no or a wrong basic auth password), "
    "rate_limit (429: rate_limit's bucket was empty), busy (429: too many password checks from that "
    "address already waited for bcrypt). Only with --web.config.file.",
    presence=CONDITIONAL,
)
WEB_CONNECTIONS_REFUSED = metric(
    SECTION,
    "web_connections_refused",
    "counter",
    "",
    "",
    "Connections closed as soon as accepted: the exporter already served its limit (its share of the file "
    "descriptors, a quarter; docs/security.md). Only where oomguard serve runs the listener.",
    presence=CONDITIONAL,
)
WEB_REQUEST_REFUSAL_REASONS = ("unauthorized", "rate_limit", "busy")
# Last in the section, and the section last of all: the web layer appends them after the snapshot's render.
DCGM_PODS_REFUSED = metric(
    SECTION,
    "dcgm_pods_refused",
    "counter",
    "",
    "node namespace pod reason",
    "Times a pod was refused as its node's dcgm-exporter (the cluster mode): reason owner (no DaemonSet of "
    "dcgm.daemonsets controls it, or it runs outside dcgm.namespaces: a pod that poses as one), conflict (its node "
    "claimed by two pods: read from neither, oomguard_dcgm_node_pods 2). Appears with the first refusal; past 256 "
    'pods, under pod "".',
    presence=EVENT,
)
DCGM_NODE_PODS = metric(
    SECTION,
    "dcgm_node_pods",
    "gauge",
    "",
    "node",
    "The pods taken as the node's dcgm-exporter at the last read (the cluster mode: in dcgm.namespaces, "
    "controlled by a DaemonSet of dcgm.daemonsets): 1, its GPUs read from it; 2 and more, a conflict: the node is "
    "read from none of them, its GPU series are absent and its memory alerts cannot fire. A series per node with "
    "such a pod, of this exporter's shard.",
    presence=CONDITIONAL,
)
LOG_STREAMS_OPEN = metric(
    SECTION,
    "log_streams_open",
    "gauge",
    "",
    "",
    "Engine containers' logs followed through the API with a stream open now. The cluster mode only, once the API "
    "is found (as every oomguard_log_streams_ series).",
    presence=CONDITIONAL,
)
LOG_STREAMS_LIMIT = metric(
    SECTION,
    "log_streams_limit",
    "gauge",
    "",
    "",
    "The most log streams open at once: their share of the process's file descriptors (RLIMIT_NOFILE; "
    "docs/security.md, File descriptors), so that they never take those of /metrics or of /proc reads.",
    presence=CONDITIONAL,
)
LOG_STREAMS_WAITING = metric(
    SECTION,
    "log_streams_waiting",
    "gauge",
    "",
    "",
    "Followed logs without a stream, over the limit: each read by turns of short requests, its lines later but "
    "none lost, until a stream is free for it (the slots of streams that end go to those waiting, in turn).",
    presence=CONDITIONAL,
)
LOG_STREAMS_REFUSED = metric(
    SECTION,
    "log_streams_refused",
    "counter",
    "",
    "",
    "Log streams asked for when none was free (one each time a follower starts waiting).",
    presence=CONDITIONAL,
)
LOG_STREAM_METRICS = (LOG_STREAMS_OPEN, LOG_STREAMS_LIMIT, LOG_STREAMS_WAITING, LOG_STREAMS_REFUSED)
WEB_CONFIG_METRICS = (
    WEB_CONFIG_LAST_RELOAD_SUCCESSFUL,
    WEB_CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP_SECONDS,
    WEB_REQUESTS_REFUSED,
    WEB_CONNECTIONS_REFUSED,
)
_WEB_CONFIG_DECLARED = frozenset(WEB_CONFIG_METRICS)
METRICS = (
    BUILD_INFO, SOURCE_SUCCESS, SOURCE_DURATION_SECONDS, NVML_UP, TARGET_UP, TARGET_STATE,
    TARGET_SCRAPE_DURATION_SECONDS, TARGET_SCRAPE_ERRORS, TARGET_VALUES_REJECTED, TARGET_HEALTH_STATUS_CODE,
    TARGET_HEALTH_LATENCY_SECONDS, *LOG_STREAM_METRICS, DCGM_PODS_REFUSED, DCGM_NODE_PODS,
    *WEB_CONFIG_METRICS,
)  # fmt: skip


def add_exporter(out: Exposition, snapshot: Snapshot) -> None:
    out.add(BUILD_INFO, (__version__, platform.python_version()), 1.0)
    for name, result in sorted(snapshot.sources.items()):
        out.add(SOURCE_SUCCESS, (name,), 1.0 if result.success else 0.0)
        out.add(SOURCE_DURATION_SECONDS, (name,), result.duration_seconds)
    if any(source in snapshot.sources for source in GPU_SOURCES):
        out.add(NVML_UP, (), 1.0 if snapshot.gpus is not None and snapshot.gpus.up else 0.0)
    if (streams := snapshot.log_streams) is not None:
        out.add(LOG_STREAMS_OPEN, (), float(streams.open))
        out.add(LOG_STREAMS_LIMIT, (), float(streams.limit))
        out.add(LOG_STREAMS_WAITING, (), float(streams.waiting))
        out.add(LOG_STREAMS_REFUSED, (), float(streams.refused_total))
    for labels, times in sorted((snapshot.dcgm_refusals or {}).items()):
        out.add(DCGM_PODS_REFUSED, labels, float(times))
    for node, pods in sorted((snapshot.dcgm_node_pods or {}).items()):
        out.add(DCGM_NODE_PODS, (node,), float(pods))


def add_target(out: Exposition, target: TargetReading) -> None:
    t = target.name
    out.add(TARGET_UP, (t,), 1.0 if target.up else 0.0)
    for state in TARGET_STATES:
        out.add(TARGET_STATE, (t, state), 1.0 if target.state == state else 0.0)
    out.add(TARGET_SCRAPE_DURATION_SECONDS, (t,), target.scrape_duration_seconds)
    for kind in ERROR_KINDS:
        out.add(TARGET_SCRAPE_ERRORS, (t, kind), float(target.errors_total.get(kind, 0)))
    for reason in VALUE_REJECT_REASONS:
        out.add(TARGET_VALUES_REJECTED, (t, reason), float(target.values_rejected_total.get(reason, 0)))
    out.add(TARGET_HEALTH_STATUS_CODE, (t,), target.health_status)
    out.add(TARGET_HEALTH_LATENCY_SECONDS, (t,), target.health_latency_seconds)


def render_web_config(
    successful: bool | None,
    success_timestamp: float | None,
    requests_refused: Mapping[str, int] | None = None,
    connections_refused: int | None = None,
) -> bytes:
    """The web layer's state, which is not in a snapshot; None: not served (no web configuration, no listener)."""
    out = Exposition(WEB_CONFIG_METRICS, _WEB_CONFIG_DECLARED)
    out.add(WEB_CONFIG_LAST_RELOAD_SUCCESSFUL, (), None if successful is None else float(successful))
    out.add(WEB_CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP_SECONDS, (), success_timestamp)
    if requests_refused is not None:
        for reason in WEB_REQUEST_REFUSAL_REASONS:
            out.add(WEB_REQUESTS_REFUSED, (reason,), float(requests_refused.get(reason, 0)))
    out.add(WEB_CONNECTIONS_REFUSED, (), None if connections_refused is None else float(connections_refused))
    return out.render()
