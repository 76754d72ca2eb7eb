"""What an event source is, for the runner: something polled for events, with its health and its state.

Every source answers to one protocol, `EventSource`: an engine's log (a line reader and
an incident detector: `LogSource`), the kernel log (kernel.py), a cgroup's OOM kills
(cgroup.py). The runner polls them all alike, counts what they report, and saves what
they return from `state()`; registry.py builds them from the configuration.

A source's `state()` is a dict of the state file's sections ("positions", "incidents")
to what it keeps in each; the runner files it under the source's key "target|name",
the layout the state file has always had.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from oomguard.common.kinds import LOG_EVENT_KINDS
from oomguard.exporter.events.detector import IncidentDetector
from oomguard.exporter.events.log_clock import LogClock
from oomguard.exporter.model import Event, EventSourceHealth, ReadStats

log = logging.getLogger(__name__)

# The sections of the state file a source may keep something in.
POSITIONS = "positions"  # where its reader stopped
INCIDENTS = "incidents"  # its detector's open incident


class EventSource(Protocol):
    target: str  # the target's name, HOST for a host-wide source
    name: str  # the `source` label: "file:PATTERN", "journald:UNIT", "k8s:NS/POD/CONTAINER", "cgroup:DIR", ...
    kinds: tuple[str, ...]  # the event kinds it can report (kinds.py)

    def poll(self, now: float) -> list[Event]:
        """Read what is new (blocking); never raises for I/O: a failed read is counted in health()."""
        ...

    def health(self) -> EventSourceHealth: ...

    def state(self) -> dict[str, Any]:
        """What to save, by section of the state file (POSITIONS, INCIDENTS): given back to its builder."""
        ...

    def close(self) -> list[Event]:
        """Stop reading; the events completed by what the reader still held (a partial CRI record)."""
        ...


class LineReader(Protocol):
    """The lines of one log: a file follower, journald, Kubernetes pod logs. A reader whose transport stamps each
    line (CRI, journald, the API) also keeps `stamps`: those of the lines its last poll returned, in Unix seconds,
    one for each line (None where a line has none)."""

    stats: ReadStats

    def poll(self) -> list[str]: ...

    def state(self) -> dict: ...

    def close(self) -> list[str] | None:
        """Stop reading; the lines it held back and will never finish (None or []: none)."""
        ...


def source_health(
    source: EventSource, stats: ReadStats, read_errors: int = 0, *, exporter_wide: str = ""
) -> EventSourceHealth:
    """`exporter_wide`: the name of the exporter's reader `stats` are (EventSourceHealth.exporter_wide), or ""."""
    return EventSourceHealth(
        target=source.target,
        source=source.name,
        kinds=source.kinds,
        lines_read=stats.lines_read,
        bytes_read=stats.bytes_read,
        bytes_behind=stats.bytes_behind,
        read_errors=stats.read_errors + read_errors,
        lines_truncated=stats.lines_truncated,
        lines_malformed=stats.lines_malformed,
        lines_dropped=stats.lines_dropped,
        files=stats.files_followed,
        exporter_wide=exporter_wide,
    )


class ErrorReport:
    """Logs a source's error once when it appears or changes: its read_errors say how often, this says why."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last = ""

    def __call__(self, source: EventSource, error: str) -> None:
        if error and error != self._last:
            log.warning("event source %s of %r: %s", source.name, source.target or "host", error)
        self._last = error


class LogSource:
    """An engine's log: its lines, through an incident detector, become one event per incident."""

    kinds: tuple[str, ...] = LOG_EVENT_KINDS

    def __init__(
        self, target: str, name: str, reader: LineReader, detector: IncidentDetector, clock: Any = None
    ) -> None:
        """`clock`: the log clock's saved state (log_clock.py), None for none."""
        self.target = target
        self.name = name
        self.reader = reader
        self.detector = detector
        self.monotonic = time.monotonic  # what intervals run on: the runner gives its own
        self._saved_clock = clock
        self.clock: LogClock | None = None  # made at the first poll, from the runner's wall clock
        self._report = ErrorReport()
        self._said_empty = False  # said once that its pattern matches no file

    def poll(self, now: float) -> list[Event]:
        mono = self.monotonic()
        clock = self._clock(now, mono)
        lines = self.reader.poll()
        self._report(self, self.reader.stats.last_error)
        self._say_when_empty(self.reader.stats.files_followed)
        events = self._feed(clock, lines, getattr(self.reader, "stamps", None), mono)
        if not self.reader.stats.bytes_behind:
            clock.caught_up(now, mono)
        return events + self.detector.tick(clock.now(mono)) + self.detector.take_starts()

    def _clock(self, wall: float, mono: float) -> LogClock:
        if self.clock is None:
            saved = self._saved_clock
            if saved is None and (times := self.detector.saved_times()):
                saved = {"at": max(times)}  # a state file from before the clock was saved: go on from its incident
            self.clock = LogClock(wall, mono, saved)
        return self.clock

    def _feed(self, clock: LogClock, lines: list[str], stamps: list[float | None] | None, mono: float) -> list[Event]:
        """Each line judged at its own time (log_clock.py): its transport's stamp, else its header's, else now."""
        if stamps is None or len(stamps) != len(lines):
            stamps = [None] * len(lines)
        events: list[Event] = []
        for line, stamp in zip(lines, stamps, strict=True):
            read, kinds = self.detector.kinds(line)
            events += self.detector.judge(read, kinds, clock.line(mono, stamp, read.stamp))
        return events

    def _say_when_empty(self, files: int | None) -> None:
        """A pattern that matches no file counts nothing, silently: say so once (a typo is the usual cause), and
        once more when it matches at last. oomguard_event_source_files says it all along."""
        if files == 0 and not self._said_empty:
            self._said_empty = True
            log.warning(
                "event source %s of %r follows no file: its pattern matches nothing (a typo? the engine not started "
                "yet?), so its OOMs are not counted until a file matches",
                self.name, self.target,
            )  # fmt: skip
        elif files and self._said_empty:
            self._said_empty = False
            log.info("event source %s of %r now follows %d file(s)", self.name, self.target, files)

    def health(self) -> EventSourceHealth:
        return source_health(self, self.reader.stats)

    def state(self) -> dict[str, Any]:
        incidents = self.detector.state()
        if self.clock is not None:
            incidents = {**(incidents or {}), "clock": self.clock.state()}
        elif self._saved_clock is not None:
            incidents = {**(incidents or {}), "clock": self._saved_clock}
        return {POSITIONS: self.reader.state(), INCIDENTS: incidents}

    def close(self) -> list[Event]:
        held = self.reader.close() or []
        mono = self.monotonic()
        # Never polled: the clock starts now, as a poll's would.
        return self._feed(self._clock(time.time(), mono), held, getattr(self.reader, "stamps", None), mono)
