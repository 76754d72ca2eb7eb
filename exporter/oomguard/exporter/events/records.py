"""An engine's log lines read as its records: which lines the engine wrote itself, and which carry outside text.

Anyone who can send a request to the model can put text in its log: the request logger echoes prompts, the
access log echoes paths, a request's span echoes its parameters. A pattern searched anywhere in a line would count
a prompt that says "CUDA out of memory". So each line is first read with its engine's grammar
(`engines.base.LogGrammar`) and given a role, and the patterns (catalogue.py) apply only where their role says:

* `record`: a record of the engine's own, its header recognised (vLLM's "ERROR 05-01 12:00:00 [core.py:701] ");
  a pattern matches at the start of its message, and where it names a `source`, only from that logger or file.
* `exception`: the last line of a Python traceback of the same process (the same tag): a traceback begins with
  "Traceback (most recent call last):" at the start of a message (or after the engine's declared lead-in),
  goes on with indented lines, and ends at the first line that is not indented: the exception. Its lines are
  raw, or carry the very header of its first line (vLLM writes a record's header on each of its lines); a
  record with another header is another record, written between two lines of the traceback.
* `traceback`: the rest of a traceback (its first line, frames, the lines that chain two exceptions): nothing
  counts there, but they keep an open incident open.
* `outside`: a record that carries outside text (the grammar's `outside`, `outside_sources`): never counted.
* `raw`: any other line (no header, outside a traceback): never counted.

What a line's role is judged on is read from its first `HEAD_BYTES`: a long line costs no more to classify than a
short one, and a header's regex cannot be made to backtrack over a megabyte.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass

from oomguard.exporter.engines.base import LogGrammar

RECORD, EXCEPTION, TRACEBACK, OUTSIDE, RAW = "record", "exception", "traceback", "outside", "raw"
HEAD_BYTES = 4096  # what the tag and header are looked for in
MAX_PROCESSES = 256  # tracebacks in progress kept at once, by process tag: beyond this the oldest is forgotten

_TRACEBACK = r"Traceback \(most recent call last\):\s*\Z"
# Between two chained exceptions, and Python 3.11's exception groups' lines.
_CHAIN = re.compile(
    r"(?:During handling of the above exception, another exception occurred:"
    r"|The above exception was the direct cause of the following exception:)\s*\Z"
)
_IN, _AFTER = 1, 2  # a process's traceback: its frames being read; its exception just read (a chain may follow)


@dataclass(frozen=True, slots=True)
class Line:
    role: str  # RECORD, EXCEPTION, TRACEBACK, OUTSIDE or RAW
    message: str  # the line after its tag and header
    source: str = ""  # the header's logger or source file, "" for none
    tag: str = ""  # the process tag, "" for none
    in_traceback: bool = False  # a line of a traceback (its first line included): keeps an open incident open
    stamp: float | None = None  # the time the engine wrote in the header, in seconds (for intervals only), or None


class RecordReader:
    """Reads one log's lines with its engine's grammar; keeps each process's traceback in progress."""

    def __init__(self, grammar: LogGrammar) -> None:
        self._tag = re.compile(grammar.tag) if grammar.tag else None
        self._headers = [re.compile(h) for h in grammar.headers]
        self._outside = re.compile("|".join(f"(?:{o})" for o in grammar.outside)) if grammar.outside else None
        sources = grammar.outside_sources
        self._outside_source = re.compile("|".join(f"(?:{o})" for o in sources)) if sources else None
        lead = f"(?:{grammar.traceback_lead})?" if grammar.traceback_lead else ""
        self._opens = re.compile(lead + _TRACEBACK)
        # process tag -> (_IN or _AFTER, the header of the traceback's first line)
        self._tracebacks: dict[str, tuple[int, str]] = {}

    def parse(self, line: str) -> tuple[Line, bool, str]:
        """`line` read alone, without the tracebacks in progress: its role as a record (RECORD, OUTSIDE or RAW),
        whether it had a header, and that header. Keeps no state: safe from any thread."""
        head = line[:HEAD_BYTES]
        tag, pos = "", 0
        if self._tag is not None and (m := self._tag.match(head)):
            tag, pos = m.group(), m.end()
        source, headed, stamp = "", False, None
        for header in self._headers:
            if m := header.match(head, pos):
                headed, pos = True, m.end()
                groups = m.groupdict()
                source = groups.get("source") or ""
                stamp = engine_stamp(groups)
                break
        message = line[pos:]
        role = OUTSIDE if self._is_outside(message, source) else RECORD if headed else RAW
        return Line(role, message, source, tag, stamp=stamp), headed, line[len(tag) : pos]

    def opens_traceback(self, message: str) -> bool:
        return self._opens.match(message) is not None

    def read(self, line: str) -> Line:
        parsed, headed, header = self.parse(line)
        if parsed.role == OUTSIDE:
            return parsed
        message, source, tag, stamp = parsed.message, parsed.source, parsed.tag, parsed.stamp
        state, opened_with = self._tracebacks.get(tag, (None, ""))
        if headed and state is not None and header != opened_with:
            # Another record of the same process: a traceback being read waits for its next line; one whose
            # exception came is over.
            if state == _AFTER:
                del self._tracebacks[tag]
            state = None
        if self.opens_traceback(message):
            self._set(tag, _IN, header)
            # A record that opens a traceback ("Scheduler hit an exception: Traceback ...") is still a record.
            return Line(RECORD if headed else TRACEBACK, message, source, tag, True, stamp)
        if state == _IN:
            if not message or message[0].isspace():
                return Line(TRACEBACK, message, source, tag, True, stamp)  # a frame, its source line, a note
            self._set(tag, _AFTER, opened_with)
            return Line(EXCEPTION, message, source, tag, True, stamp)
        if state == _AFTER:
            if not message.strip() or _CHAIN.match(message):
                return Line(TRACEBACK, message, source, tag, True, stamp)
            del self._tracebacks[tag]
        return parsed

    # -- persistence: a traceback cut by a restart of the exporter still ends in its exception
    def state(self) -> dict[str, str]:
        """The tracebacks whose exception has not come yet, by process tag, with their header (one whose exception
        came needs no resuming)."""
        return {tag: header for tag, (state, header) in self._tracebacks.items() if state == _IN}

    def restore(self, state: object) -> None:
        """What `state()` saved; anything else (a damaged file) is ignored: tracebacks are read from here on."""
        if isinstance(state, dict):
            for tag, header in list(state.items())[-MAX_PROCESSES:]:
                if isinstance(tag, str) and isinstance(header, str) and len(tag) + len(header) <= HEAD_BYTES:
                    self._tracebacks[tag] = (_IN, header)

    def _is_outside(self, message: str, source: str) -> bool:
        """A record that carries outside text; a raw line too where it looks like one (uvicorn's access log written
        without the engine's header)."""
        if self._outside is not None and self._outside.match(message, 0, HEAD_BYTES):
            return True
        return bool(source and self._outside_source is not None and self._outside_source.match(source))

    def _set(self, tag: str, state: int, header: str) -> None:
        self._tracebacks.pop(tag, None)  # re-inserted last: the dict's order is the order of use
        self._tracebacks[tag] = (state, header)
        if len(self._tracebacks) > MAX_PROCESSES:
            del self._tracebacks[next(iter(self._tracebacks))]


def engine_stamp(groups: dict[str, str | None]) -> float | None:
    """The time in a header's named groups (`year` where the engine writes it, `month`, `day`, `hour`, `minute`,
    `second`, `fraction`), in seconds; None where it has none. Only its intervals are used, so the engine's time zone
    does not matter; without a year, a leap year is assumed (an interval across New Year's Eve is not one)."""
    if groups.get("second") is None:
        return None
    try:
        when = (int(groups.get("year") or 2000), int(groups["month"] or 0), int(groups["day"] or 0),
                int(groups["hour"] or 0), int(groups["minute"] or 0), int(groups["second"] or 0))  # fmt: skip
        fraction = groups.get("fraction") or ""
        return calendar.timegm((*when, 0, 0, 0)) + (int(fraction[:9]) / 10 ** len(fraction[:9]) if fraction else 0.0)
    except (ValueError, OverflowError):  # month 13: no time
        return None


__all__ = ["EXCEPTION", "OUTSIDE", "RAW", "RECORD", "TRACEBACK", "Line", "RecordReader"]
