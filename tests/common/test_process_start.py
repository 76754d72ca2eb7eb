"""A process's start time from /proc, against a wall clock that can be stepped."""

from __future__ import annotations

import os
import time

import pytest

from oomguard.common import process_start


def test_the_start_time_holds_still_and_follows_a_step_of_the_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    me = os.getpid()
    first = process_start.start_time(me)
    assert first is not None and first <= time.time()
    assert process_start.start_time(me) == first  # the same value at every call: no jitter reads as a restart
    real_time = time.time
    # The wall clock stepped 0.6 s forward against the boot clock (a VM paused, NTP): the start computed in a
    # process that read the boot time before the step must agree with one read after it (the simulator's).
    monkeypatch.setattr(process_start.time, "time", lambda: real_time() + 0.6)
    assert process_start.start_time(me) == pytest.approx(first + 0.6, abs=0.03)
    # Within /proc/uptime's resolution it holds still again.
    moved = process_start.start_time(me)
    monkeypatch.setattr(process_start.time, "time", lambda: real_time() + 0.605)
    assert process_start.start_time(me) == moved
