"""Restarts of a target, and how long each start took before /health answered.

A restart is a new life of the engine: a new process start time (from its /metrics,
or from its process on this host), a new pid, or, when neither is known, a return
to "up" after a spell of "down" or "loading". Counted once per new life, however it
was noticed. The startup time is measured from the process start (to a clock tick)
to the first /health 200; where the start is not known, from the first scrape that
saw the target not up (a lower bound).
"""

from __future__ import annotations

from dataclasses import dataclass

START_TOLERANCE = 1.0  # seconds: psutil-style start times are only good to about a second


@dataclass
class RestartTracker:
    restarts_total: int = 0
    last_restart_at: float | None = None
    startup_seconds: float | None = None
    _life: tuple[float | None, int | None] | None = None  # (start time, pid) of the current life
    _not_up_since: float | None = None

    def observe(self, now: float, state: str, start_time: float | None, pid: int | None) -> None:
        if state != "up":
            if self._not_up_since is None:
                self._not_up_since = now
            return
        life = (start_time, pid)
        known = life != (None, None)
        was_down = self._not_up_since is not None
        if self._life is None:
            first_seen_loading = was_down
            self._life = life
            if first_seen_loading:
                self._record_startup(now, start_time)
        elif (known and self._differs(life)) or (not known and was_down):
            self.restarts_total += 1
            self.last_restart_at = start_time if start_time is not None else now
            self._life = life
            self._record_startup(now, start_time)
        self._not_up_since = None

    def _differs(self, life: tuple[float | None, int | None]) -> bool:
        assert self._life is not None
        # Compare what both lives know: a start time seen only now is not a restart by itself. Start
        # times from different sources (/proc here, the engine's own metric) may differ a little.
        (start, pid), (old_start, old_pid) = life, self._life
        moved = start is not None and old_start is not None and abs(start - old_start) > START_TOLERANCE
        return moved or (pid is not None and old_pid is not None and pid != old_pid)

    def _record_startup(self, now: float, start_time: float | None) -> None:
        if start_time is not None and start_time <= now:
            self.startup_seconds = now - start_time
        elif self._not_up_since is not None:
            self.startup_seconds = now - self._not_up_since
