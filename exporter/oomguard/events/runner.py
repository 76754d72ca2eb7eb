"""Reads every event source in the background and keeps the counts, across exporter restarts.

Per target: its log files (globs), its journald unit, its Kubernetes pod logs, each
through its own incident detector, and its cgroup's OOM kills. For the host: kernel
OOM kills. Read positions, open incidents, counts and last-event times are saved in
`state_dir` after each poll that changed them (written to a temporary file, then
renamed), so a restarted exporter neither loses nor recounts an event.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from oomguard.config import Config, TargetConfig
from oomguard.events.cgroup import CgroupOomReader
from oomguard.events.cri import CriDecoder
from oomguard.events.detector import IncidentDetector, load_catalogue
from oomguard.events.follow import FileFollower, FollowStats
from oomguard.events.journald import JournaldReader
from oomguard.events.kernel import KmsgReader, is_oom_kill

log = logging.getLogger(__name__)
STATE_FILE = "events-state.json"
HOST = ""  # the `target` of host-wide sources (the kernel log)


class LineSource(Protocol):
    stats: FollowStats

    def poll(self) -> list[str]: ...
    def state(self) -> dict: ...
    def close(self) -> None: ...


class _PodLogs:
    """Kubernetes container logs: CRI-format files under /var/log/pods, rotated by the kubelet."""

    def __init__(self, pattern: str, state: dict | None, from_start: bool) -> None:
        self.follower = FileFollower(pattern, state=state, from_start=from_start)
        self.decoders: dict[str, CriDecoder] = {}  # one per file: partial records never join across files
        self.stats = self.follower.stats

    def poll(self) -> list[str]:
        return [
            message
            for path, lines in self.follower.poll_by_file()
            for line in lines
            for message in self.decoders.setdefault(path, CriDecoder()).feed(line)
        ]

    def state(self) -> dict:
        return self.follower.state()

    def close(self) -> None:
        self.follower.close()


@dataclass
class Counts:
    """Events of one target by kind, and when each kind last happened."""

    total: dict[str, int] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)

    def add(self, kind: str, n: int, at: float) -> None:
        self.total[kind] = self.total.get(kind, 0) + n
        self.last[kind] = max(self.last.get(kind, 0.0), at)


@dataclass
class _Stream:
    target: str
    source: str  # e.g. "file:/var/log/vllm/*.log"
    reader: LineSource
    detector: IncidentDetector | None  # None: the kernel log, whose lines are one event each


@dataclass(frozen=True, slots=True)
class SourceHealth:
    target: str
    source: str
    lines_read: int
    bytes_behind: int
    read_errors: int


class EventRunner:
    def __init__(self, config: Config, *, clock: Callable[[], float] = time.time) -> None:
        events = config.events
        self.clock = clock
        self.state_path = Path(config.state_dir) / STATE_FILE if config.state_dir else None
        saved = self._load()
        patterns = load_catalogue([p.model_dump() for p in events.patterns])
        self.counts: dict[str, Counts] = {
            name: Counts(dict(c.get("total", {})), dict(c.get("last", {})))
            for name, c in saved.get("counts", {}).items()
        }
        self.streams: list[_Stream] = []
        self.cgroups: list[tuple[str, str, CgroupOomReader]] = []  # target, source, reader
        positions = saved.get("positions", {})
        incidents = saved.get("incidents", {})
        for target in config.targets:
            for source, reader in self._readers(target, positions, events.from_start, events.k8s_pods_dir):
                detector = IncidentDetector(
                    patterns, quiet_seconds=events.quiet_seconds, rearm_seconds=events.rearm_seconds
                )
                detector.restore(incidents.get(f"{target.label}|{source}"))
                self.streams.append(_Stream(target.label, source, reader, detector))
            if target.cgroup:
                source = f"cgroup:{target.cgroup}"
                reader = CgroupOomReader(target.cgroup, state=positions.get(f"{target.label}|{source}"))
                self.cgroups.append((target.label, source, reader))
        if events.kernel_log:
            source = f"kernel:{events.kernel_log_path}"
            reader = KmsgReader(
                events.kernel_log_path, state=positions.get(f"{HOST}|{source}"), from_start=events.from_start
            )
            self.streams.append(_Stream(HOST, source, reader, None))
        self.state_errors = 0
        self._reported: dict[str, str] = {}  # source -> the last error logged for it

    @staticmethod
    def _readers(
        target: TargetConfig, positions: dict[str, Any], from_start: bool, pods_dir: str
    ) -> list[tuple[str, LineSource]]:
        def saved(source: str) -> dict | None:
            return positions.get(f"{target.label}|{source}")

        out: list[tuple[str, LineSource]] = []
        for pattern in target.logs:
            source = f"file:{pattern}"
            out.append((source, FileFollower(pattern, state=saved(source), from_start=from_start)))
        if target.journald_unit:
            source = f"journald:{target.journald_unit}"
            out.append((source, JournaldReader(target.journald_unit, state=saved(source), from_start=from_start)))
        if target.k8s_pod_logs:
            pod = target.k8s_pod_logs
            source = f"k8s:{pod.namespace}/{pod.pod}/{pod.container}"
            pattern = os.path.join(pods_dir, f"{pod.namespace}_{pod.pod}_*", pod.container, "*.log")
            out.append((source, _PodLogs(pattern, saved(source), from_start)))
        return out

    # -- one poll: blocking (file reads, journalctl), run in a worker thread ---------------
    def poll(self) -> None:
        changed = False
        for stream in self.streams:
            try:
                lines = stream.reader.poll()
            except Exception:  # a reader bug must not stop the others
                stream.reader.stats.read_errors += 1
                log.exception("event source %s of %r failed", stream.source, stream.target)
                continue
            self._report(stream.target, stream.source, stream.reader.stats.last_error)
            now = self.clock()
            changed |= bool(lines)
            for line in lines:
                if stream.detector is None:
                    if is_oom_kill(line):
                        self._count(stream.target, "kernel_oom_kill", 1, now)
                    continue
                for event in stream.detector.feed(line, now):
                    self._count(stream.target, event.kind, 1, event.timestamp)
            if stream.detector is not None:
                for event in stream.detector.tick(now):
                    changed = True
                    self._count(stream.target, event.kind, 1, event.timestamp)
        for target, source, reader in self.cgroups:
            new = reader.read_new()
            self._report(target, source, reader.last_error)
            if new:
                changed = True
                self._count(target, "cgroup_oom_kill", new, self.clock())
        if changed:
            self._save()

    def _report(self, target: str, source: str, error: str) -> None:
        """Log a source's error once when it appears or changes: the counter says how often, this says why."""
        if error and self._reported.get(source) != error:
            log.warning("event source %s of %r: %s", source, target or "host", error)
        self._reported[source] = error

    def _count(self, target: str, kind: str, n: int, at: float) -> None:
        self.counts.setdefault(target, Counts()).add(kind, n, at)
        log.warning("event: %s %s", target or "host", kind)

    def health(self) -> list[SourceHealth]:
        out = [
            SourceHealth(
                s.target, s.source, s.reader.stats.lines_read, s.reader.stats.bytes_behind, s.reader.stats.read_errors
            )
            for s in self.streams
        ]
        out += [SourceHealth(t, source, 0, 0, r.read_errors) for t, source, r in self.cgroups]
        return out

    # -- state file ---------------------------------------------------------------------------
    def _load(self) -> dict[str, Any]:
        if self.state_path is None or not self.state_path.exists():
            return {}
        try:
            return json.loads(self.state_path.read_text())
        except (OSError, ValueError) as exc:
            # Unreadable state: start at the end of every log (no recount), and say so.
            log.error("cannot read %s (%s): events before now are not recounted", self.state_path, exc)
            return {}

    def _save(self) -> None:
        if self.state_path is None:
            return
        state = {
            "positions": {f"{s.target}|{s.source}": s.reader.state() for s in self.streams}
            | {f"{t}|{source}": r.state() for t, source, r in self.cgroups},
            "incidents": {f"{s.target}|{s.source}": s.detector.state() for s in self.streams if s.detector},
            "counts": {name: {"total": c.total, "last": c.last} for name, c in self.counts.items()},
        }
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.state_path.parent, prefix=".events-state.")
            with os.fdopen(fd, "w") as out:
                json.dump(state, out)
            os.replace(tmp, self.state_path)
        except OSError as exc:
            self.state_errors += 1
            if self.state_errors == 1:
                log.error("cannot write %s (%s): fix events.state_dir, or a restart will recount", self.state_path, exc)
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(tmp)

    def close(self) -> None:
        self._save()
        for stream in self.streams:
            stream.reader.close()
