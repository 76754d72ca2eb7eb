"""The time a log's lines are judged on: when they were written, where they say, not when they were read.

A backlog (the lines an engine wrote while the exporter was stopped, or while its poller stalled) is read in one
go; judged on the time of reading, five OOMs seconds apart would be one incident. So each line's time is taken
from its own stamps where it has any: the one its transport put before it (CRI's and the API's `timestamps=true`,
journald's), else the one the engine wrote in its record header (events/records.py). Only their intervals are
used: the clock advances by the time between a line's stamp and the previous stamp of the same kind, so a node's
clock an hour off, or an engine writing local time, changes nothing; a stamp that steps back advances it by
nothing. A line without a stamp (a traceback's raw lines, a log without headers) is at the time of reading:
the clock advances with `time.monotonic()` between lines, and so do the quiet spell and the re-arm between polls.

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
        self._last: dict[str, float] = {}  # the previous stamp of each kind
        self._resync = False  # restored: once the backlog is read, catch up with the wall clock if it is ahead
        if isinstance(saved, dict):
            self._restore(saved)

    def line(self, mono: float, transport: float | None = None, engine: float | None = None) -> float:
        """The time of a line read at `mono`, with the stamps it carries."""
        kind, stamp = (TRANSPORT, transport) if transport is not None else (ENGINE, engine)
        if stamp is None:
            self.at = self.now(mono)
        else:
            previous = self._last.get(kind)
            if previous is None:
                self.at = self.now(mono)
            else:
                self.at += min(max(0.0, stamp - previous), 366 * 86400.0)  # a stamp that steps back: no time
            self._last[kind] = stamp
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
        return {"at": self.at, **{kind: stamp for kind, stamp in self._last.items()}}

    def _restore(self, saved: dict[str, Any]) -> None:
        values = {k: saved.get(k) for k in ("at", TRANSPORT, ENGINE)}
        if not all(v is None or is_time(v) for v in values.values()):
            return  # a damaged clock: as on a first start
        if values["at"] is not None:
            # Where the log was when the exporter stopped, whatever the wall clock says now (an hour behind, the
            # open incident would wait an hour to close).
            self.at = float(values["at"])
            self._resync = True
        self._last = {k: float(v) for k, v in values.items() if k != "at" and v is not None}


def is_time(value: Any) -> bool:
    """A saved time: a finite number (not a bool; an integer a float can hold)."""
    try:
        return type(value) in (int, float) and math.isfinite(value)
    except OverflowError:
        return False


__all__ = ["ENGINE", "TRANSPORT", "LogClock", "is_time"]
