"""Restarts of a target, and how long each start took before /health answered.

A restart is a new life of the engine: a new process start time (from its /metrics,
or from its process on this host), a new pid, or, when neither is known, a return
to "up" after a spell of "down" or "loading". Counted once per new life, however it
was noticed. The startup time is measured from the process start (to a clock tick)
to the first /health 200, as the watch between scrapes saw it (`healthy_since`, to
its interval: else the first scrape that saw it up, which counted up to a scrape
interval more); where the start is not known, from the first scrape that saw the
target not up (a lower bound).

A life that never serves (a start that cannot allocate its memory, a probe that kills
the load) is seen only in the engine's log: its `startup` line (`log_start`). A life
announced there is the same life as the process that later comes up if that process
started before the line was read; two startup lines naming one pid are one life.
"""

from __future__ import annotations

from dataclasses import dataclass

START_TOLERANCE = 1.0  # seconds: psutil-style start times are only good to about a second
# A startup line read this long after the start of a life seen up before it is that life's own line: engines
# print theirs within seconds of the process start (vLLM, SGLang), or after the load (uvicorn), read up to a
# poll later. Later than this, it is a new life's.
ANNOUNCE_WINDOW = 900.0


@dataclass
class RestartTracker:
    restarts_total: int = 0
    last_restart_at: float | None = None
    startup_seconds: float | None = None
    announce_window: float = ANNOUNCE_WINDOW  # shorter on a simulation's faster clock
    _life: tuple[float | None, int | None] | None = None  # (start time, pid) of the current life
    _not_up_since: float | None = None
    # The current life as its log told it: when its startup line was read, and the pid that line names.
    _announced_at: float | None = None
    _log_pid: int | None = None
    _from_log: bool = False  # known only from its startup line: not seen up yet

    def log_start(self, at: float, pid: int | None = None) -> None:
        """A startup line of the engine, read at `at`, naming process `pid` (None when it names none)."""
        if pid is not None and pid == self._log_pid:
            return  # another line of the same start
        if self._life is None:
            self._adopt_log_life(at, pid)  # the first life seen: not a restart
            return
        start = self._life[0]
        if (
            self._announced_at is None
            and not self._from_log
            and (start is None or -START_TOLERANCE <= at - start <= self.announce_window)
        ):
            # The line of the life already seen up, read after it came up.
            self._announced_at, self._log_pid = at, pid
            return
        self.restarts_total += 1
        self.last_restart_at = at
        self._adopt_log_life(at, pid)

    def _adopt_log_life(self, at: float, pid: int | None) -> None:
        self._life = (at, None)
        self._announced_at, self._log_pid, self._from_log = at, pid, True

    def observe(
        self, now: float, state: str, start_time: float | None, pid: int | None, healthy_since: float | None = None
    ) -> None:
        """A scrape at `now`: the target's `state`, its process's start time and pid where known; `healthy_since`:
        when /health first answered 200 in the spell of answers that goes on now, where a watch between scrapes
        saw it sooner than `now` (a startup ends there)."""
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
                self._record_startup(now, start_time, healthy_since)
        elif self._from_log:
            announced = self._announced_at if self._announced_at is not None else now
            if start_time is not None and start_time > announced + START_TOLERANCE:
                # A process younger than the announced life's line: yet another life.
                self.restarts_total += 1
                self.last_restart_at = start_time
            self._life = life
            self._from_log = False
            self._record_startup(now, start_time, healthy_since)
        elif (known and self._differs(life)) or (not known and was_down):
            self.restarts_total += 1
            self.last_restart_at = start_time if start_time is not None else now
            self._life = life
            self._announced_at = self._log_pid = None
            self._record_startup(now, start_time, healthy_since)
        elif known:
            # The same life, as read now: a start time that moved within the tolerance (the wall clock stepped
            # against the boot clock, process_start.py) is followed, so that steps never add up to a restart.
            old_start, old_pid = self._life
            self._life = (start_time if start_time is not None else old_start, pid if pid is not None else old_pid)
        self._not_up_since = None

    def is_new_life(self, start_time: float | None, pid: int | None) -> bool:
        """Whether a process (its start time, its pid) is another life than the one last seen up."""
        return self._life is not None and (start_time, pid) != (None, None) and self._differs((start_time, pid))

    def _differs(self, life: tuple[float | None, int | None]) -> bool:
        assert self._life is not None
        # Compare what both lives know: a start time seen only now is not a restart by itself. Start
        # times from different sources (/proc here, the engine's own metric) may differ a little.
        (start, pid), (old_start, old_pid) = life, self._life
        moved = start is not None and old_start is not None and abs(start - old_start) > START_TOLERANCE
        return moved or (pid is not None and old_pid is not None and pid != old_pid)

    def _record_startup(self, now: float, start_time: float | None, healthy_since: float | None) -> None:
        # The start of this life: its process's, else the first scrape that saw it not up.
        start = start_time if start_time is not None and start_time <= now else self._not_up_since
        if start is None:
            return
        # The first 200 seen between scrapes ends the startup, if it is this life's (not before its start).
        served = healthy_since if healthy_since is not None and start <= healthy_since <= now else now
        self.startup_seconds = served - start
