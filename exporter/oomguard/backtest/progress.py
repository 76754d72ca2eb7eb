"""Progress lines while a history is replayed: the readings replayed, of about how many, and the time left.

A week of 8 GPUs is a minute of replay, a month of 64 GPUs far longer: without a count the command looked hung. The
count is kept per step (an addition and a clock read); a line is made only every PROGRESS_SECONDS, plain text for a
log as much as for a terminal. How much of the history is read comes from the history itself (`read_share`: a
file's bytes read, a Prometheus window's time), where it can say.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from oomguard.backtest.history import Step

PROGRESS_SECONDS = 3.0  # between two lines


def metered(
    steps: Iterator[Step],
    progress: Callable[[str], None],
    read_share: Callable[[Step], float | None] | None = None,
    *,
    started: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Step]:
    """`steps`, passed on as they come; every PROGRESS_SECONDS a line to `progress`. `read_share(step)`: how much of
    the history is read once `step` is (0-1), or None where that is not known; `started`: the replay's start on
    `clock` (the steps read ahead before this call count in its time)."""
    every = PROGRESS_SECONDS
    start = clock() if started is None else started
    due = start + every
    for count, step in enumerate(steps, 1):
        yield step
        now = clock()
        if now >= due:
            due = now + every
            share = read_share(step) if read_share is not None else None
            progress(line(count, step.t, share, now - start))


def line(count: int, t: float, share: float | None, elapsed: float) -> str:
    """`12,345 of about 40,320 readings replayed (31 %, at 2024-05-03 10:00:00 UTC), about 40 s left`; without the
    share read, the count and the time reached."""
    at = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    if share is None or not 0 < share <= 1:
        return f"{count:,} readings replayed (at {at})"
    total = max(count, round(count / share))
    left = elapsed * (1 - share) / share
    when = f"about {_duration(left)} left" if left >= 1 else "nearly read"
    return f"{count:,} of about {total:,} readings replayed ({share * 100:.0f} %, at {at}), {when}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{round(seconds)} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
