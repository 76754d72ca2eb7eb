"""Event families: OOMs and deaths by kind, restarts and startup time, kernel OOM kills, XIDs, and the
health of the sources they are read from (docs/events.md)."""

from __future__ import annotations

from oomguard.common.kinds import XID
from oomguard.exporter.exposition.encoder import Exposition
from oomguard.exporter.exposition.spec import CONDITIONAL, EVENT, metric
from oomguard.exporter.model import HOST, Counts, EventSourceHealth, Snapshot

SECTION = "Events: OOMs, restarts, kernel OOM kills, XIDs (see docs/events.md)"
TARGET_EVENTS = metric(
    SECTION,
    "target_events",
    "counter",
    "",
    "target kind",
    "Events of the target by kind: cuda_oom, startup_memory, engine_death (from its logs, one per incident however many lines), cgroup_oom_kill (the kernel killed one of its processes: its cgroup's oom_kill counter, or the kernel log); for a discovered pod, from the API: container_oom_killed (its engine container ended OOMKilled or with exit code 137), probe_failure (a failed liveness or startup probe), probe_kill (the kubelet killed it for one). Zero from the start for every kind its sources can see.",
    presence=EVENT,
)
TARGET_LAST_EVENT_TIMESTAMP_SECONDS = metric(
    SECTION,
    "target_last_event_timestamp_seconds",
    "gauge",
    "seconds",
    "target kind",
    "When the last event of the kind was seen, Unix time: `time() - x < window` catches the first event of a new series, which increase() misses.",
    presence=EVENT,
)
TARGET_RESTARTS = metric(
    SECTION,
    "target_restarts",
    "counter",
    "",
    "target",
    "New lives of the engine: a new process start time or pid, or a return to up after down or loading with neither known; or a startup line in its log, for lives that never serve.",
)
TARGET_LAST_RESTART_TIMESTAMP_SECONDS = metric(
    SECTION,
    "target_last_restart_timestamp_seconds",
    "gauge",
    "seconds",
    "target",
    "When the engine last restarted (its new process start), Unix time.",
    presence=EVENT,
)
TARGET_STARTUP_SECONDS = metric(
    SECTION,
    "target_startup_seconds",
    "gauge",
    "seconds",
    "target",
    "The last start watched: from the process start (to a clock tick, local targets) or from the first scrape that saw it not up, to the first /health 200 (asked every second between scrapes while the target is not up, whatever the scrape interval). Compare with the probe's initial delay.",
    presence=EVENT,
)
TARGET_PROBE_GRACE_SECONDS = metric(
    SECTION,
    "target_probe_grace_seconds",
    "gauge",
    "seconds",
    "target",
    "A discovered pod's time from its engine container's start to the first kill a failing probe can cause: initialDelaySeconds + failureThreshold x periodSeconds of its startupProbe, else of its livenessProbe (Kubernetes' defaults 0, 3, 10 where absent). Absent without such a probe. A start (target_startup_seconds) longer than this is killed while loading.",
    presence=CONDITIONAL,
)
HOST_EVENTS = metric(
    SECTION,
    "host_events",
    "counter",
    "",
    "kind",
    "Host events by kind: kernel_oom_kill (one per kill).",
    presence=CONDITIONAL,
)
HOST_LAST_EVENT_TIMESTAMP_SECONDS = metric(
    SECTION,
    "host_last_event_timestamp_seconds",
    "gauge",
    "seconds",
    "kind",
    "When the last host event of the kind was seen, Unix time.",
    presence=EVENT,
)
GPU_EVENTS = metric(
    SECTION,
    "gpu_events",
    "counter",
    "",
    "node gpu kind xid",
    "GPU events from NVML: kind xid, by XID code (31 page fault, 43 GPU stopped, 48 double-bit ECC, 79 fell off the bus).",
    presence=EVENT,
)
GPU_LAST_EVENT_TIMESTAMP_SECONDS = metric(
    SECTION,
    "gpu_last_event_timestamp_seconds",
    "gauge",
    "seconds",
    "node gpu kind",
    "When the GPU's last XID was seen, Unix time.",
    presence=EVENT,
)
EVENT_SOURCE_LINES_READ = metric(
    SECTION,
    "event_source_lines_read",
    "counter",
    "",
    "target source",
    "Lines read from an event source (file:GLOB, journald:UNIT, k8s:NS/POD/CONTAINER, k8s-log:NS/POD/CONTAINER, kernel:PATH; for k8s-api, the API objects that told of an event of any discovered pod: a pod's end, a kubelet Event); target is empty for the host and for k8s-api, whose health (one watch for the whole exporter) is said once, not per pod.",
    presence=CONDITIONAL,
)
EVENT_SOURCE_BYTES_BEHIND = metric(
    SECTION,
    "event_source_bytes_behind",
    "gauge",
    "bytes",
    "target source",
    "Bytes written to the source's files and not read yet.",
    presence=CONDITIONAL,
)
EVENT_SOURCE_READ_ERRORS = metric(
    SECTION,
    "event_source_read_errors",
    "counter",
    "",
    "target source",
    "Failed reads of the source (vanished file, permission, journalctl error): rising means events may be missed.",
    presence=CONDITIONAL,
)
EVENT_SOURCE_READ_BYTES = metric(
    SECTION,
    "event_source_read_bytes",
    "counter",
    "bytes",
    "target source",
    "Bytes read from an event source.",
    presence=CONDITIONAL,
)
EVENT_SOURCE_LINES_TRUNCATED = metric(
    SECTION,
    "event_source_lines_truncated",
    "counter",
    "",
    "target source",
    "Lines longer than the reader's limit, of which only the head was read: a pattern past the cut is missed.",
    presence=CONDITIONAL,
)
EVENT_SOURCE_LINES_MALFORMED = metric(
    SECTION,
    "event_source_lines_malformed",
    "counter",
    "",
    "target source",
    "Lines not in the source's format (a Kubernetes log line without its CRI header), read as they are.",
    presence=CONDITIONAL,
)
EVENT_SOURCE_LINES_DROPPED = metric(
    SECTION,
    "event_source_lines_dropped",
    "counter",
    "",
    "target source",
    "Lines let go unread because more came than the poller took (a flood of a pod's log through the API); the lines "
    "that could count are kept first.",
    presence=CONDITIONAL,
)
EVENT_SOURCE_FILES = metric(
    SECTION,
    "event_source_files",
    "gauge",
    "",
    "target source",
    "Files the source follows now (a log file glob, a pod's logs): 0 means its pattern matches no file (a typo, or "
    "the engine not started yet), and nothing there is counted. Absent for journald, cgroup and kernel sources.",
    presence=CONDITIONAL,
)
EVENT_STATE_WRITE_ERRORS = metric(
    SECTION,
    "event_state_write_errors",
    "counter",
    "",
    "",
    "Failed writes of the event state file in state_dir: rising means a restart of the exporter will recount events.",
    presence=CONDITIONAL,
)
EVENT_STATE_READ_ERRORS = metric(
    SECTION,
    "event_state_read_errors",
    "counter",
    "",
    "",
    "1 when the event state file in state_dir could not be trusted at start (unreadable, not a regular file, too "
    "large, not JSON, or of a wrong shape or type anywhere): it was kept aside as *.corrupt and the counts "
    "started afresh (no log is read again, so nothing is recounted).",
    presence=CONDITIONAL,
)
GPU_EVENT_READ_ERRORS = metric(
    SECTION,
    "gpu_event_read_errors",
    "counter",
    "",
    "",
    "Failed waits for NVML's XID events (other than its timeout): rising means XIDs may be missed.",
    presence=CONDITIONAL,
)
METRICS = (
    TARGET_EVENTS, TARGET_LAST_EVENT_TIMESTAMP_SECONDS, TARGET_RESTARTS, TARGET_LAST_RESTART_TIMESTAMP_SECONDS,
    TARGET_STARTUP_SECONDS, TARGET_PROBE_GRACE_SECONDS, HOST_EVENTS, HOST_LAST_EVENT_TIMESTAMP_SECONDS, GPU_EVENTS,
    GPU_LAST_EVENT_TIMESTAMP_SECONDS, EVENT_SOURCE_LINES_READ, EVENT_SOURCE_BYTES_BEHIND, EVENT_SOURCE_READ_ERRORS,
    EVENT_SOURCE_READ_BYTES, EVENT_SOURCE_LINES_TRUNCATED, EVENT_SOURCE_LINES_MALFORMED, EVENT_SOURCE_LINES_DROPPED,
    EVENT_SOURCE_FILES,
    EVENT_STATE_WRITE_ERRORS, EVENT_STATE_READ_ERRORS, GPU_EVENT_READ_ERRORS,
)  # fmt: skip


def _add_health(out: Exposition, labels: tuple[str, str], health: EventSourceHealth) -> None:
    out.add(EVENT_SOURCE_LINES_READ, labels, float(health.lines_read))
    out.add(EVENT_SOURCE_BYTES_BEHIND, labels, float(health.bytes_behind))
    out.add(EVENT_SOURCE_READ_ERRORS, labels, float(health.read_errors))
    out.add(EVENT_SOURCE_READ_BYTES, labels, float(health.bytes_read))
    out.add(EVENT_SOURCE_LINES_TRUNCATED, labels, float(health.lines_truncated))
    out.add(EVENT_SOURCE_LINES_MALFORMED, labels, float(health.lines_malformed))
    if health.lines_dropped is not None:
        out.add(EVENT_SOURCE_LINES_DROPPED, labels, float(health.lines_dropped))
    if health.files is not None:
        out.add(EVENT_SOURCE_FILES, labels, float(health.files))


def add(out: Exposition, snapshot: Snapshot) -> None:
    kinds_of: dict[str, set[str]] = {}  # target -> the kinds its sources can see
    # An exporter's reader shared by every pod (the API's Events) is one health, said once with the target empty;
    # each pod's source of it has the same figures, but for a poll of its own that raised (counted by the runner).
    exporter_wide: dict[str, EventSourceHealth] = {}
    for health in snapshot.event_sources:
        kinds_of.setdefault(health.target, set()).update(health.kinds)
        if health.exporter_wide:
            said = exporter_wide.get(health.exporter_wide)
            if said is None or health.read_errors > said.read_errors:
                exporter_wide[health.exporter_wide] = health
            continue
        _add_health(out, (health.target, health.source), health)
    for name, health in sorted(exporter_wide.items()):
        _add_health(out, (HOST, name), health)
    for target in snapshot.targets:
        counts = snapshot.events.get(target.name, Counts())
        # Zeros from the start for every kind its sources can see: increase() then sees the first event.
        for kind in sorted(kinds_of.get(target.name, set()) | counts.total.keys()):
            out.add(TARGET_EVENTS, (target.name, kind), float(counts.total.get(kind, 0)))
            out.add(TARGET_LAST_EVENT_TIMESTAMP_SECONDS, (target.name, kind), counts.last.get(kind))
        out.add(TARGET_RESTARTS, (target.name,), float(target.restarts_total))
        out.add(TARGET_LAST_RESTART_TIMESTAMP_SECONDS, (target.name,), target.last_restart_at)
        out.add(TARGET_STARTUP_SECONDS, (target.name,), target.startup_seconds)
        out.add(TARGET_PROBE_GRACE_SECONDS, (target.name,), target.pod.probe_grace_seconds if target.pod else None)
    if HOST in kinds_of:
        host = snapshot.events.get(HOST, Counts())
        for kind in sorted(kinds_of[HOST] | host.total.keys()):
            out.add(HOST_EVENTS, (kind,), float(host.total.get(kind, 0)))
            out.add(HOST_LAST_EVENT_TIMESTAMP_SECONDS, (kind,), host.last.get(kind))
    for (gpu, xid), n in sorted(snapshot.xid.items()):
        out.add(GPU_EVENTS, (snapshot.node, str(gpu), XID, str(xid)), float(n))
    for gpu, at in sorted(snapshot.xid_last.items()):
        out.add(GPU_LAST_EVENT_TIMESTAMP_SECONDS, (snapshot.node, str(gpu), XID), at)
    if snapshot.xid_read_errors is not None:
        out.add(GPU_EVENT_READ_ERRORS, (), float(snapshot.xid_read_errors))
    if snapshot.event_state_write_errors is not None:
        out.add(EVENT_STATE_WRITE_ERRORS, (), float(snapshot.event_state_write_errors))
    if snapshot.event_state_read_errors is not None:
        out.add(EVENT_STATE_READ_ERRORS, (), float(snapshot.event_state_read_errors))
