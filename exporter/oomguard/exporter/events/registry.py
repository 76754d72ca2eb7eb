"""The event sources the configuration asks for: one builder per kind of source.

A target's builder takes the target's configuration, the events configuration and the
saved state, and returns the sources it configures (none when its field is unset); a
host builder the same without a target, and with the NVML library (None without GPUs).
Each source is given back what it saved under its key "target|source" (see source.py),
so a restarted exporter resumes.

To add a kind of event source: write it (an `EventSource`, source.py), add its field
to the configuration (TargetConfig for a target's, EventsConfig for the host's), a
builder below, and the builder's line in TARGET_SOURCES or HOST_SOURCES.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from oomguard.exporter.config import Config, EventsConfig, TargetConfig
from oomguard.exporter.engines import ENGINES
from oomguard.exporter.events.api_log import ApiLogReader
from oomguard.exporter.events.catalogue import load_catalogue
from oomguard.exporter.events.cgroup import CgroupOomReader, CgroupSource
from oomguard.exporter.events.cri import PodLogReader
from oomguard.exporter.events.detector import IncidentDetector
from oomguard.exporter.events.file_follower import FileFollower
from oomguard.exporter.events.journald import JournaldReader
from oomguard.exporter.events.kernel import KernelLogSource, KmsgReader
from oomguard.exporter.events.source import INCIDENTS, POSITIONS, EventSource, LineReader, LogSource
from oomguard.exporter.events.xid import XidSource
from oomguard.exporter.model import HOST

COUNTS = "counts"  # the state file's section of event counts, by target: the runner's
GPU_COUNTS = "gpu_counts"  # the state file's section of GPUs' event counts (XIDs): the runner's


class SavedState:
    """The state file as it was read: each source's sections under its key "target|source"."""

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self.data = data or {}

    def of(self, target: str, source: str) -> dict[str, Any]:
        """What the source `source` of `target` saved, by section ({} when nothing)."""
        key = f"{target}|{source}"
        return {
            section: entries[key]
            for section, entries in self.data.items()
            if section not in (COUNTS, GPU_COUNTS) and isinstance(entries, dict) and key in entries
        }

    def put(self, target: str, source: str, state: Mapping[str, Any]) -> None:
        """What the source `source` of `target` resumes from when it is built: a state handed over from another
        exporter (sources/kubernetes/handover.py), in place of what this one saved."""
        key = f"{target}|{source}"
        data = dict(self.data)
        for section, entries in list(data.items()):
            if section not in (COUNTS, GPU_COUNTS) and isinstance(entries, dict) and key in entries:
                data[section] = {k: v for k, v in entries.items() if k != key}
        for section, value in state.items():
            data[section] = {**(data.get(section) or {}), key: value}
        self.data = data

    def find(self, source: str) -> dict[str, Any]:
        """What the source `source` saved, under whichever target (a pod's sources are named after the pod)."""
        for section, entries in self.data.items():
            if section in (COUNTS, GPU_COUNTS) or not isinstance(entries, dict):
                continue
            for key in entries:
                if key.partition("|")[2] == source:
                    return self.of(key.partition("|")[0], source)
        return {}


TargetBuilder = Callable[[TargetConfig, EventsConfig, SavedState], list[EventSource]]
HostBuilder = Callable[[EventsConfig, SavedState, Any], list[EventSource]]


def log_source(
    target: TargetConfig, events: EventsConfig, name: str, reader: LineReader, saved: dict[str, Any]
) -> LogSource:
    """A log of the target, read through a detector with its engine's patterns, its open incident resumed."""
    detector = IncidentDetector(
        load_catalogue(target.engine, [p.model_dump() for p in events.patterns]),
        grammar=ENGINES[target.engine].log_grammar,
        quiet_seconds=events.quiet_seconds,
        rearm_seconds=events.rearm_seconds,
    )
    incidents = saved.get(INCIDENTS)
    detector.restore(incidents)
    clock = incidents.get("clock") if isinstance(incidents, dict) else None
    return LogSource(target.label, name, reader, detector, clock)


def file_logs(target: TargetConfig, events: EventsConfig, saved: SavedState) -> list[EventSource]:
    out: list[EventSource] = []
    for pattern in target.logs:
        name = f"file:{pattern}"
        state = saved.of(target.label, name)
        reader = FileFollower(
            pattern, state=state.get(POSITIONS), from_start=events.from_start, follow_symlinks=target.follow_symlinks
        )
        out.append(log_source(target, events, name, reader, state))
    return out


def journald_unit(target: TargetConfig, events: EventsConfig, saved: SavedState) -> list[EventSource]:
    if not target.journald_unit:
        return []
    name = f"journald:{target.journald_unit}"
    state = saved.of(target.label, name)
    reader = JournaldReader(target.journald_unit, state=state.get(POSITIONS), from_start=events.from_start)
    return [log_source(target, events, name, reader, state)]


def k8s_pod_logs(target: TargetConfig, events: EventsConfig, saved: SavedState) -> list[EventSource]:
    pod = target.k8s_pod_logs
    if pod is None:
        return []
    name = f"k8s:{pod.namespace}/{pod.pod}/{pod.container}"
    state = saved.of(target.label, name)
    pattern = os.path.join(events.k8s_pods_dir, f"{pod.namespace}_{pod.pod}_*", pod.container, "*.log")
    reader = PodLogReader(pattern, state=state.get(POSITIONS), from_start=events.from_start)
    return [log_source(target, events, name, reader, state)]


def pod_log(
    target: TargetConfig, events: EventsConfig, saved: SavedState, pod: tuple[str, str, str, str], *, from_start: bool
) -> EventSource:
    """The engine container's log of a discovered pod (namespace, name, UID, container), under k8s_pods_dir."""
    namespace, name, uid, container = pod
    source = f"k8s:{namespace}/{name}/{container}"
    state = saved.of(target.label, source)
    pattern = os.path.join(events.k8s_pods_dir, f"{namespace}_{name}_{uid}", container, "*.log")
    reader = PodLogReader(pattern, state=state.get(POSITIONS), from_start=from_start or events.from_start)
    return log_source(target, events, source, reader, state)


def pod_api_log(
    target: TargetConfig, events: EventsConfig, saved: SavedState, pod: tuple[str, str, str], *, from_start: bool
) -> tuple[EventSource, ApiLogReader]:
    """The cluster mode's: the engine container's log of a discovered pod (namespace, name, container) through the
    API; the reader is what its follower (sources/kubernetes/pod_logs.py) feeds."""
    namespace, name, container = pod
    source = f"k8s-log:{namespace}/{name}/{container}"
    state = saved.of(target.label, source)
    reader = ApiLogReader(state=state.get(POSITIONS), from_start=from_start or events.from_start)
    log = log_source(target, events, source, reader, state)
    reader.keep = log.detector.may_count  # in a flood, the lines that could count are the last let go
    return log, reader


def cgroup(target: TargetConfig, events: EventsConfig, saved: SavedState) -> list[EventSource]:
    if not target.cgroup:
        return []
    state = saved.of(target.label, f"cgroup:{target.cgroup}")
    return [CgroupSource(target.label, CgroupOomReader(target.cgroup, state=state.get(POSITIONS)))]


def kernel_log(events: EventsConfig, saved: SavedState, nvml: Any = None) -> list[EventSource]:
    if not events.kernel_log:
        return []
    state = saved.of(HOST, f"kernel:{events.kernel_log_path}")
    reader = KmsgReader(events.kernel_log_path, state=state.get(POSITIONS), from_start=events.from_start)
    return [KernelLogSource(reader)]


def xid_events(events: EventsConfig, saved: SavedState, nvml: Any = None) -> list[EventSource]:
    """NVML's XID events, where there is an NVML to ask (pynvml or the simulation's); nothing saved to resume."""
    return [XidSource(nvml)] if events.xid and nvml is not None else []


# The configuration's field -> the builder of its sources, in the order they are polled.
TARGET_SOURCES: dict[str, TargetBuilder] = {
    "logs": file_logs,
    "journald_unit": journald_unit,
    "k8s_pod_logs": k8s_pod_logs,
    "cgroup": cgroup,
}
HOST_SOURCES: dict[str, HostBuilder] = {
    "kernel_log": kernel_log,
    "xid": xid_events,
}


def build_sources(config: Config, saved: SavedState | None = None, nvml: Any = None) -> list[EventSource]:
    """Every target's sources, in the order of the targets, then the host's; `nvml`: the NVML library, or None."""
    saved = saved or SavedState()
    sources = [
        source
        for target in config.targets
        for build in TARGET_SOURCES.values()
        for source in build(target, config.events, saved)
    ]
    sources += [source for build in HOST_SOURCES.values() for source in build(config.events, saved, nvml)]
    return sources
