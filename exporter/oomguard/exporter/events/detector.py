"""From log lines to events: one incident, one event, however many lines it spans.

A CUDA OOM in vLLM is a traceback of dozens of lines, often printed twice (by the
engine core and again by its parent), each line carrying a `(EngineCore pid=N)`
prefix, and flushed in pieces. Counting matching lines would count it many times.
So lines that match the catalogue open an *incident*; the incident collects the
kinds it sees and closes when the engine starts again (a `startup` line) or after
`quiet_seconds` without a matching line. On closing it yields exactly one event, of
its most telling kind: a memory line anywhere in the incident makes it an OOM, and
`engine_death` is only what remains when no memory line came with the fatal error.

An engine dies once per life. Its parts do not always come together: vLLM 0.32's
startup failure prints the cause in the engine core, again 3 s later from its parent
process, and the API server's own error 3 s after that. So after an incident is
counted, matching lines are taken as the same death until the engine starts again
(a `startup` line) or the log stays free of them for `rearm_seconds`.

Only the engine's own records count (records.py): each line is read with the engine's grammar first, and a
pattern matches only where it may (the start of an engine record's message, or the exception that ends a
traceback of the same process). A line that carries an API user's text counts nothing, whatever it holds.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from typing import Any

from oomguard.common.kinds import LOG_EVENT_KINDS, STARTUP
from oomguard.exporter.engines.base import LogGrammar
from oomguard.exporter.events.catalogue import Pattern
from oomguard.exporter.events.records import EXCEPTION, OUTSIDE, RECORD, Line, RecordReader
from oomguard.exporter.model import Event

log = logging.getLogger(__name__)
GENERIC = LogGrammar()  # no header known: no line is a record; tracebacks still end in exceptions

# The process a startup line names: vLLM's "(APIServer pid=N)" tag, uvicorn's "Started server process [N]".
STARTUP_PID = re.compile(r"(?:\bpid=|process \[)(\d+)")


@dataclass
class Incident:
    started_at: float
    last_line_at: float
    kinds: list[str] = field(default_factory=list)

    def event(self) -> Event:
        return Event(next(k for k in LOG_EVENT_KINDS if k in self.kinds), self.started_at)


class IncidentDetector:
    def __init__(
        self,
        patterns: list[Pattern],
        *,
        grammar: LogGrammar = GENERIC,
        quiet_seconds: float = 5.0,
        rearm_seconds: float = 60.0,
    ) -> None:
        """`grammar`: how the engine writes its own records (its plugin's `log_grammar`); without one, no line is a
        record, and only the exceptions that end Python tracebacks can count."""
        self.patterns = patterns
        self._records = RecordReader(grammar)
        self._at_record = [p for p in patterns if p.at == RECORD]
        self._at_exception = [p for p in patterns if p.at == EXCEPTION]
        self.quiet_seconds = quiet_seconds
        self.rearm_seconds = rearm_seconds
        self.open: Incident | None = None
        self.dead_until_startup: float | None = None  # last matching line of a death already counted
        self.starts: list[tuple[float, int | None]] = []  # (when, pid) of each `startup` line read: take_starts

    def kinds(self, line: str) -> tuple[Line, list[str]]:
        """What `line` is to the engine's grammar, and the kinds of the patterns that match it where they may."""
        read = self._records.read(line)
        if read.role == RECORD:
            return read, [p.kind for p in self._at_record if _matches(p, read)]
        if read.role == EXCEPTION:
            return read, [p.kind for p in self._at_exception if p.regex.match(read.message)]
        return read, []

    def may_count(self, line: str) -> bool:
        """Whether `line` could count, read alone (a traceback's exception depends on the lines before it): a reader
        that must let lines go keeps these. Keeps no state: safe from any thread."""
        parsed, _, _ = self._records.parse(line)
        if parsed.role == OUTSIDE:
            return False
        message = parsed.message
        if self._records.opens_traceback(message) or any(p.regex.match(message) for p in self._at_exception):
            return True
        return parsed.role == RECORD and any(_matches(p, parsed) for p in self._at_record)

    def feed(self, line: str, now: float) -> list[Event]:
        """One line, written at `now` (its own time where it has one: LogSource's clock)."""
        read, kinds = self.kinds(line)
        return self.judge(read, kinds, now)

    def judge(self, read: Line, kinds: list[str], now: float) -> list[Event]:
        """A line `kinds` read, at `now`: first what the time since the last line closed or re-armed (a backlog
        read at once is judged as it was written), then the line."""
        events = self.tick(now)
        if not kinds:
            if self.open is not None and read.in_traceback:
                self.open.last_line_at = now  # a traceback flushed slowly is still one
            return events
        if STARTUP in kinds:
            events += self.close()
            self.dead_until_startup = None
            pid = STARTUP_PID.search(read.tag) or STARTUP_PID.search(read.message[:200])
            self.starts.append((now, int(pid.group(1)) if pid else None))
            return events
        if self.dead_until_startup is not None:
            self.dead_until_startup = now  # more of the death already counted
            return events
        if self.open is None:
            self.open = Incident(started_at=now, last_line_at=now)
        self.open.last_line_at = now
        self.open.kinds.extend(k for k in kinds if k not in self.open.kinds)
        return events

    def tick(self, now: float) -> list[Event]:
        events: list[Event] = []
        if self.open is not None and now - self.open.last_line_at >= self.quiet_seconds:
            last = self.open.last_line_at
            events = self.close()
            self.dead_until_startup = last
        if self.dead_until_startup is not None and now - self.dead_until_startup >= self.rearm_seconds:
            self.dead_until_startup = None
        return events

    def saved_times(self) -> list[float]:
        """The times the open incident and the death already counted hold (what the log's clock goes on from)."""
        times = [] if self.open is None else [self.open.last_line_at]
        return times + ([] if self.dead_until_startup is None else [self.dead_until_startup])

    def take_starts(self) -> list[Event]:
        """The engine's starts read since the last call, as `startup` events: not counted as events, they tell the
        target's restart tracker of lives that never serve (a start that fails, a probe that kills the load)."""
        starts, self.starts = self.starts, []
        return [Event(STARTUP, at, pid=pid) for at, pid in starts]

    def close(self) -> list[Event]:
        incident, self.open = self.open, None
        return [incident.event()] if incident is not None else []

    # -- persistence: an incident open when the exporter stops is resumed, not lost or doubled
    def state(self) -> dict[str, Any] | None:
        tracebacks = self._records.state()
        if self.open is None and self.dead_until_startup is None and not tracebacks:
            return None
        incident = self.open
        state: dict[str, Any] = {
            "open": None if incident is None else [incident.started_at, incident.last_line_at, incident.kinds],
            "dead_until_startup": self.dead_until_startup,
        }
        if tracebacks:
            state["tracebacks"] = tracebacks  # by process tag: a traceback being read when the exporter stopped
        return state

    def restore(self, state: dict[str, Any] | None) -> None:
        """Resume what `state()` saved; a saved state this cannot read is dropped whole, with a warning (an
        incident it held may go uncounted, as after a start without state), never raised."""
        if not state or not isinstance(state, dict):
            return
        self._records.restore(state.get("tracebacks"))
        try:
            incident = None
            if state.get("open"):
                started, last, kinds = state["open"]
                incident = Incident(_time(started), _time(last), [k for k in kinds if k in LOG_EVENT_KINDS])
                if not incident.kinds:
                    raise ValueError(f"no event kind in {str(kinds)[:80]}")
            dead = state.get("dead_until_startup")
            dead = None if dead is None else _time(dead)
        except (TypeError, ValueError, AttributeError) as exc:
            log.warning("saved incident state ignored (%s): this incident, if any, is not counted", exc)
            return
        self.open, self.dead_until_startup = incident, dead


def _matches(pattern: Pattern, record: Line) -> bool:
    """A record pattern: at the start of the record's message, from its source where it names one."""
    return bool(pattern.regex.match(record.message)) and (
        pattern.source is None or pattern.source.fullmatch(record.source) is not None
    )


def _time(value: Any) -> float:
    """A saved time: a finite number (a NaN would keep an incident open, or the detector unarmed, for ever)."""
    try:
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    except OverflowError:  # an integer too large for a float
        pass
    raise ValueError(f"not a time: {str(value)[:40]}")
