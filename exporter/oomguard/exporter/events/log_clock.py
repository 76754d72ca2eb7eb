"""The time a log's lines are judged on: when they were written, where they say, not when they were read.

A backlog (the lines an engine wrote while the exporter was stopped, or while its poller stalled) is read in one
go; judged on the time of reading, five OOMs seconds apart would be one incident. So each line's time is taken
from its own stamps where it has any: the one its transport put before it (CRI's and the API's `timestamps=true`,
journald's), else the one the engine wrote in its record header (events/records.py). Only their intervals are
used: a line is as far after the previous line stamped the same way as their stamps say (or at the time of the
line before it, if that is later), so a node's clock an hour off, or an engine writing local time, changes nothing;
a stamp that steps back advances the clock by nothing. A line without a stamp (a traceback's raw lines, a log
without headers) is at the time of reading: the clock advances with `time.monotonic()` between lines, and so do
the quiet spell and the re-arm between polls.

The exporter's wall clock sets the clock once, when the log is first followed, and again after a restart once the
backlog is read (when it is ahead: the time the exporter was away), so that the times it stamps on events are
near the wall clock's; a step of the wall clock while the exporter runs changes no interval.
"""

from __future__ import annotations

import math
from typing import Any

TRANSPORT, ENGINE = "transport", "engine"


class LogClock:
    def __init__(self, wall: float, mono: float, saved: Any = None) -> None:
        self.at = wall  # the time of the last line (or of the start): what the detector's times are in
        self._mono_at = mono  # time.monotonic() when `at` was set
        self._last: dict[str, tuple[float, float]] = {}  # each kind's previous stamp, and `at` when it came
        self._resync = False  # restored: once the backlog is read, catch up with the wall clock if it is ahead
        if isinstance(saved, dict):
            self._restore(saved)

    def line(self, mono: float, transport: float | None = None, engine: float | None = None) -> float:
        """The time of a line read at `mono`, with the stamps it carries."""
        kind, stamp = (TRANSPORT, transport) if transport is not None else (ENGINE, engine)
        previous = self._last.get(kind) if stamp is not None else None
        if previous is None:
            self.at = self.now(mono)
        else:
            after = previous[1] + min(stamp - previous[0], 366 * 86400.0)  # type: ignore[operator]
            self.at = max(self.at, after)  # a stamp that steps back: no time passes
        if stamp is not None:
            self._last[kind] = (stamp, self.at)
        self._mono_at = mono
        return self.at

    def now(self, mono: float) -> float:
        """The time now, for the quiet spell and the re-arm between polls."""
        return self.at + max(0.0, mono - self._mono_at)

    def caught_up(self, wall: float, mono: float) -> None:
        """A poll read the log to its end: after a restart, the time the exporter was away passes now."""
        if self._resync:
            self._resync = False
            if wall > self.now(mono):
                self.at, self._mono_at = wall, mono

    # -- persistence ---------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"at": self.at, **{kind: list(last) for kind, last in self._last.items()}}

    def _restore(self, saved: dict[str, Any]) -> None:
        at, last = saved.get("at"), {k: saved[k] for k in (TRANSPORT, ENGINE) if k in saved}
        if not (at is None or is_time(at)) or not all(is_stamp(v) for v in last.values()):
            return  # a damaged clock: as on a first start
        if at is not None:
            # Where the log was when the exporter stopped, whatever the wall clock says now (an hour behind, the
            # open incident would wait an hour to close).
            self.at = float(at)
            self._resync = True
        self._last = {k: (float(v[0]), float(v[1])) for k, v in last.items()}


def is_time(value: Any) -> bool:
    """A saved time: a finite number (not a bool; an integer a float can hold)."""
    try:
        return type(value) in (int, float) and math.isfinite(value)
    except OverflowError:
        return False


def is_stamp(value: Any) -> bool:
    """A saved stamp: [the stamp, the clock when it came]."""
    return isinstance(value, list) and len(value) == 2 and all(is_time(v) for v in value)


def is_clock(value: Any) -> bool:
    """A saved clock, as `LogClock.state` writes it."""
    return isinstance(value, dict) and all(
        (k == "at" and is_time(v)) or (k in (TRANSPORT, ENGINE) and is_stamp(v)) for k, v in value.items()
    )


__all__ = ["ENGINE", "TRANSPORT", "LogClock", "is_clock", "is_stamp", "is_time"]
