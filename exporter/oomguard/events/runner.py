"""Reads every event source in the background and keeps the counts, across exporter restarts.

The sources are what the configuration asks for (registry.py): per target its log
files (globs), its journald unit, its Kubernetes pod logs, each through its own
incident detector, and its cgroup's OOM kills; for the host, kernel OOM kills. All
answer to one protocol (source.py) and are polled alike. Read positions, open
incidents, counts and last-event times are saved in `state_dir` after each poll that
changed them (written to a temporary file, then renamed), so a restarted exporter
neither loses nor recounts an event.

The state file: {"positions": {KEY: ...}, "incidents": {KEY: ...}, "counts": {TARGET:
{"total": {KIND: N}, "last": {KIND: T}}}}, KEY being "target|source" (target "" for
the host). Its layout is kept as it is: an upgraded exporter resumes from an old one's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oomguard.config import Config
from oomguard.events.kill_owners import KillOwners
from oomguard.events.kinds import CGROUP_OOM_KILL, KERNEL_OOM_KILL, STARTUP
from oomguard.events.registry import COUNTS, SavedState, build_sources
from oomguard.events.source import INCIDENTS, POSITIONS, EventSource
from oomguard.model import Counts, Event, EventSourceHealth

log = logging.getLogger(__name__)
STATE_FILE = "events-state.json"
TEMPORARY = ".events-state."  # the prefix of the file written before it is renamed over STATE_FILE


class EventRunner:
    def __init__(self, config: Config, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.state_path = Path(config.state_dir) / STATE_FILE if config.state_dir else None
        self.has_state = self.state_path is not None
        self.state_read_errors = 0  # a state file found unreadable at start (set aside as *.corrupt)
        saved = self._load()
        self.saved = SavedState(saved)  # for the sources added later (discovered pods)
        self.counts: dict[str, Counts] = {
            name: Counts(dict(c.get("total", {})), dict(c.get("last", {}))) for name, c in saved.get(COUNTS, {}).items()
        }
        self.sources: list[EventSource] = build_sources(config, self.saved)
        self.state_write_errors = 0
        self._failures = [0] * len(self.sources)  # polls that raised (a bug): counted as read errors
        self._states = [source.state() for source in self.sources]  # as last saved or seen
        self.starts: list[tuple[str, float, int | None]] = []  # (target, when, pid) of each start read: take_starts
        # Whose processes and pods a kernel OOM kill may be: the runtime updates it from the scrapers.
        self.kill_owners = KillOwners()
        # A poll runs in a worker thread; discovered pods' sources come and go (set_sources) between polls.
        self._lock = threading.RLock()

    # -- one poll: blocking (file reads, journalctl), run in a worker thread ---------------
    def poll(self) -> None:
        with self._lock:
            self._poll()

    def set_sources(self, target: str, sources: list[EventSource]) -> None:
        """Make `sources` the sources of `target` (a discovered pod; [] when it is gone): those it had and that
        are not among them are closed, and what they held counted (blocking: a close reads the rest)."""
        with self._lock:
            kept = [i for i, s in enumerate(self.sources) if s.target != target or s in sources]
            for i, source in enumerate(self.sources):
                if i not in kept:
                    try:
                        self._count(source, source.close())
                    except Exception:
                        log.exception("event source %s of %r failed to close", source.name, target)
            new = [s for s in sources if s not in self.sources]
            self.sources = [self.sources[i] for i in kept] + new
            self._failures = [self._failures[i] for i in kept] + [0] * len(new)
            self._states = [self._states[i] for i in kept] + [s.state() for s in new]
            self._save()

    def _poll(self) -> None:
        changed = False
        for i, source in enumerate(self.sources):
            try:
                events = source.poll(self.clock())
                state = source.state()
            except Exception:  # a source's bug must not stop the others
                self._failures[i] += 1
                log.exception("event source %s of %r failed", source.name, source.target or "host")
                continue
            self._count(source, events)
            changed |= bool(events) or state != self._states[i]
            self._states[i] = state
        if changed:
            self._save()

    def _count(self, source: EventSource, events: list[Event]) -> None:
        for event in events:
            if event.kind == STARTUP:  # a new life, for the restart tracker: not an event to count
                self.starts.append((source.target, event.timestamp, event.pid))
                continue
            self.counts.setdefault(source.target, Counts()).add(event.kind, event.count, event.timestamp)
            log.warning("event: %s %s x%d", source.target or "host", event.kind, event.count)
            if event.kind == KERNEL_OOM_KILL:
                self._count_for_owner(event)

    def _count_for_owner(self, event: Event) -> None:
        """A kernel OOM kill of a target's process or pod is also the target's, counted as its cgroup's kills are;
        but not for a target with a cgroup source: that counter has counted it already."""
        owner = self.kill_owners.owner_of(event.pid, event.cgroup)
        if owner is None or any(s.target == owner and CGROUP_OOM_KILL in s.kinds for s in self.sources):
            return
        self.counts.setdefault(owner, Counts()).add(CGROUP_OOM_KILL, event.count, event.timestamp)
        log.warning(
            "event: %s %s x%d (the kernel log's kill of pid %s)", owner, CGROUP_OOM_KILL, event.count, event.pid
        )

    def take_starts(self) -> list[tuple[str, float, int | None]]:
        """(target, when, pid or None) of each engine start read in the logs since the last call."""
        starts, self.starts = self.starts, []
        return starts

    def health(self) -> list[EventSourceHealth]:
        with self._lock:
            return self._health()

    def _health(self) -> list[EventSourceHealth]:
        return [
            dataclasses.replace(h, read_errors=h.read_errors + failures) if failures else h
            for h, failures in zip((s.health() for s in self.sources), self._failures, strict=True)
        ]

    # -- state file ---------------------------------------------------------------------------
    def _load(self) -> dict[str, Any]:
        if self.state_path is None:
            return {}
        self._clear_temporaries()
        if not self.state_path.exists():
            return {}
        try:
            saved = json.loads(self.state_path.read_text())
            if not isinstance(saved, dict):
                raise ValueError("not a JSON object")
            return saved
        except (OSError, ValueError) as exc:
            # Unreadable state: start at the end of every log (no recount), and say so. The file is kept
            # aside, not overwritten by the next save, and the metric tells the counts started afresh.
            self.state_read_errors += 1
            aside = self.state_path.with_name(self.state_path.name + ".corrupt")
            try:
                os.replace(self.state_path, aside)
                kept = f"kept as {aside}"
            except OSError as move:
                kept = f"and it could not be kept aside ({move})"
            log.error(
                "cannot read %s (%s), %s: counts start afresh, events before now are not recounted",
                self.state_path, exc, kept,
            )  # fmt: skip
            return {}

    def _clear_temporaries(self) -> None:
        """Remove what writes cut short (the exporter killed between the temporary file and its rename) left."""
        assert self.state_path is not None
        with contextlib.suppress(OSError):
            for leftover in self.state_path.parent.glob(f"{TEMPORARY}*"):
                with contextlib.suppress(OSError):
                    leftover.unlink()

    def _save(self) -> None:
        if self.state_path is None:
            return
        state: dict[str, dict[str, Any]] = {POSITIONS: {}, INCIDENTS: {}}
        for source, saved in zip(self.sources, self._states, strict=True):
            for section, value in saved.items():
                state.setdefault(section, {})[f"{source.target}|{source.name}"] = value
        state[COUNTS] = {name: {"total": c.total, "last": c.last} for name, c in self.counts.items()}
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.state_path.parent, prefix=TEMPORARY)
            with os.fdopen(fd, "w") as out:
                json.dump(state, out)
            os.replace(tmp, self.state_path)
        except OSError as exc:
            self.state_write_errors += 1
            if self.state_write_errors == 1:
                log.error("cannot write %s (%s): fix events.state_dir, or a restart will recount", self.state_path, exc)
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(tmp)

    def close(self) -> None:
        """Close every source, count what they still held, and save the state."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        for i, source in enumerate(self.sources):
            try:
                self._count(source, source.close())
                self._states[i] = source.state()
            except Exception:
                log.exception("event source %s of %r failed to close", source.name, source.target or "host")
        self._save()
