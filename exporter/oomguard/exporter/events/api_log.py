"""A pod's engine container's log as the Kubernetes API serves it (`pods/log`), for the cluster mode.

The stream itself is read on the event loop (sources/kubernetes/pod_logs.py), which hands each line, with the
timestamp the API puts before it (`timestamps=true`: RFC 3339, nanoseconds), to `ApiLogReader.offer`; the runner's
poll takes the lines in its thread, like a file follower's.

Resuming without losing or repeating a line: a dropped stream is asked again from `sinceTime`. The kubelet skips
every line whose own stamp (the container runtime's, by the node's clock) is before that instant, wherever the line
is in the file and in a followed stream too (pkg/kubelet/kuberuntime/logs/logs.go: the logWriter compares each
line's timestamp with `since`, fixed when the request comes); the API passes the instant on in whole seconds. So a
resumed request asks from LOOKBACK_SECONDS before the position: a node's clock that steps back by up to that much
(NTP, a VM resumed, a hand) stamps the lines written after the step earlier than the position, and asked from the
position itself the kubelet would never send them, in the stream asked again nor in the one open at the step
(their stamps are before its instant). The lines a resumed request sends again are dropped by their place in the
file, not by their stamps: the reader keeps the stamp of the last line it took, how many lines carried exactly it,
and the latest stamp it took (`high`, where the clock stepped back); in a resumed request every line is a repeat
until the position itself comes again (the last of those lines at exactly its stamp), or a line later than every
stamp taken (the position is no longer in the file: rotated); what follows is new, whatever its stamp says. The
position is saved with the other event state, so an exporter that restarts goes on from it.

One position serves the engine container across its restarts, and the containers come in order: before each
stream the previous container's log (`previous=true`, where a crash's traceback is) is read, then the current
one's. Where the position came again in the previous container's, the current container's lines are all new (they
were written after it, whatever their stamps); else the position is in the current container's, which is read as
above.

Every time here is the node's: the exporter's clock (an hour ahead, or behind) decides nothing. A pod found at
start is read from now by asking for the lines of the last seconds (`sinceSeconds`, which the node counts back
from its own clock), the seconds counted on the exporter's monotonic clock. A step back larger than the look-back
can lose the lines written right after it: a jump back of the stamps larger than LOOKBACK_SECONDS is said once
and counted as a read error of the source.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from oomguard.exporter.model import ReadStats

# What is held for the poller, which takes it every poll (0.5 s): beyond this, lines are let go and counted (the
# poller is stuck, or the engine logs faster than it can be read: long prompts with request logging on). The lines
# that could count are kept first (`keep`, the detector's `may_count`): an OOM line in a flood of 64 KiB request
# lines is not pushed out by them. Lines are at most 64 KiB (sources/kubernetes/pod_logs.py), so 500 followed
# containers hold at most 500 MiB in the worst case, and a few KB each in the usual one.
MAX_HELD_BYTES = 1024 * 1024
# How far before the position a resumed request asks: the largest step back of a node's clock that loses no line.
# What it costs is the lines of that hour sent again at each stream (every 30 minutes at most, or after a drop) and
# each turn that follows a turn without a new line: at most the kubelet's current log file (it rotates at 10 MiB by
# default, and a request reads no rotated file).
LOOKBACK_SECONDS = 3600
log = logging.getLogger(__name__)


def parse_timestamp(text: str) -> tuple[int, int] | None:
    """`2026-12-05T12:00:01.123456789Z` -> (Unix seconds, nanoseconds); None when it is not one."""
    head, dot, rest = text.partition(".")
    fraction = rest.rstrip("Z") if dot else ""
    if dot and (not rest.endswith("Z") or not fraction.isdigit() or len(fraction) > 9):
        return None
    if not dot:
        if not head.endswith("Z"):
            return None
        head = head[:-1]
    try:
        seconds = datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None
    return int(seconds), int(fraction.ljust(9, "0")) if fraction else 0


FROM_START = "start"  # the saved `since` of a log to read whole: no line taken yet of a pod that came while watched


def rfc3339(at: tuple[int, int]) -> str:
    """(Unix seconds, nanoseconds) as the API writes a time."""
    return datetime.fromtimestamp(at[0], UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{at[1]:09d}Z"


def since_time(at: tuple[int, int]) -> str:
    """The `sinceTime` that includes `at` (whole seconds, as the API takes it)."""
    return datetime.fromtimestamp(at[0], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiLogReader:
    """The lines of one pod's engine container, from the API; a `LineReader` (events/source.py)."""

    def __init__(
        self,
        *,
        state: dict[str, Any] | None = None,
        from_start: bool = False,
        keep: Callable[[str], bool] | None = None,
    ) -> None:
        """`from_start`: a pod that came while we watched, its log read whole; else (a pod found at start, without
        a saved position) from now on, as a file is followed from its end (what it logged before may be counted
        already). `keep`: whether a line could count, kept first when lines must be let go (None: none)."""
        self.stats = ReadStats(files_followed=1, lines_dropped=0)
        self.keep = keep
        # Called (on the event loop) when a line or an error comes: the runner polls this log then, and a quiet one
        # seldom (events/runner.py, QUIET_MAX_SECONDS). Set by the runner; None: nobody to wake.
        self.wake: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._held: deque[list[Any]] = deque()  # [line, could it count (None: not asked yet), its time]
        self.stamps: list[float | None] = []  # the time of each line the last poll returned (the node's clock)
        self._held_bytes = 0
        self._seen_again = 0  # lines at the request's starting position seen again in it
        self.last: tuple[int, int] | None = None  # the stamp of the last line taken
        self.same = 0  # lines taken at exactly `last`
        self.high: tuple[int, int] | None = None  # the latest stamp taken before the node's clock stepped back
        self._said_step = False  # a step back beyond the look-back said (once)
        # Without a position, a pod found at start is read from now: since when (time.monotonic()); None: whole.
        self._from_now = None if from_start else time.monotonic()
        # The same moment on the wall clock, what `state()` saves: taken once, so that the state of a quiet log stays
        # the same from poll to poll (computed afresh, the two clocks' jitter changed its nanoseconds every time, and
        # the runner wrote the whole state file at every poll).
        self._from_wall = time.time()
        if isinstance(state, dict):
            self._restore(state)  # a saved position goes on from where it was
        if self.last is not None:
            self._from_now = None
        # Where this request started (the last stamp taken, how many at it, the latest stamp taken): its lines are
        # repeats until the position passes; None: whatever comes is new.
        self._resumed: tuple[tuple[int, int], int, tuple[int, int]] | None = None
        self._passed = False  # the position itself came again in this request (not only a later line)
        self._request_previous = False  # this request is of the previous container's log
        # The position of the last line the poller took: what is saved, so that lines held for the poller when
        # the exporter stops are read again by the next one, not skipped.
        self._polled: tuple[tuple[int, int] | None, int, tuple[int, int] | None] = (self.last, self.same, self.high)

    def _restore(self, state: dict[str, Any]) -> None:
        last, same, high = state.get("last"), state.get("same"), state.get("high")
        if isinstance(last, str) and isinstance(same, int) and not isinstance(same, bool) and same >= 0:
            parsed = parse_timestamp(last)
            if parsed is not None:  # a damaged position: as if none was saved
                self.last, self.same = parsed, same
                self.high = parse_timestamp(high) if isinstance(high, str) else None
                return
        # No line taken yet: read from where the exporter that saved it read (its log's start, or since when), so that
        # a quiet pod's OOM written while no exporter ran is read, not skipped by a "from now" of this one's start.
        since = state.get("since")
        if since == FROM_START:
            self._from_now = None
        elif isinstance(since, str) and (at := parse_timestamp(since)) is not None:
            # Back on this exporter's monotonic clock by the wall-clock time gone since: the node's clock, an hour off
            # the exporter's, changes nothing (sinceSeconds), only a step of the exporter's own clock would.
            wall, saved_at = time.time(), at[0] + at[1] / 1e9
            self._from_now, self._from_wall = time.monotonic() - max(0.0, wall - saved_at), min(wall, saved_at)

    # -- the stream's side (the event loop) ------------------------------------------------------------------
    def offer(self, line: str) -> bool:
        """One line of the API's stream, its timestamp first; False when it was a repeat (or had no timestamp)."""
        stamp, _, message = line.partition(" ")
        at = parse_timestamp(stamp)
        with self._lock:
            taken = self._offer(line, message, at)
        if (wake := self.wake) is not None and taken is not None:
            wake()  # after the line is held: a poll woken before it could miss it until the next wake
        return bool(taken)

    def _offer(self, line: str, message: str, at: tuple[int, int] | None) -> bool | None:
        """Whether the line was taken; None: a repeat, which changes nothing."""
        if at is None:
            self.stats.lines_malformed += 1
            return False
        if self._repeat(at):
            return None
        self._take(at)
        self._held.append([message, None, at[0] + at[1] / 1e9])
        self._held_bytes += len(message)
        if self._held_bytes > MAX_HELD_BYTES:
            self._let_go()
        self.stats.lines_read += 1
        self.stats.bytes_read += len(line) + 1
        return True

    def _let_go(self) -> None:
        """Down to half the budget (so that a flood asks `keep` of each line once, not at every line), the oldest
        lines that could not count first; then, only if those that could are over the budget (no engine writes a
        megabyte of them between two polls), the oldest of them."""
        excess, dropped = self._held_bytes - MAX_HELD_BYTES // 2, 0
        kept: deque[list[Any]] = deque()
        for held in self._held:
            if excess > 0:
                if held[1] is None:
                    held[1] = self.keep is not None and self.keep(held[0])
                if not held[1]:
                    excess -= len(held[0])
                    self._held_bytes -= len(held[0])
                    dropped += 1
                    continue
            kept.append(held)
        while self._held_bytes > MAX_HELD_BYTES and kept:
            self._held_bytes -= len(kept.popleft()[0])
            dropped += 1
        self._held = kept
        self.stats.lines_dropped = (self.stats.lines_dropped or 0) + dropped

    def _take(self, at: tuple[int, int]) -> None:
        """The position follows the line taken, back too when the node's clock stepped back."""
        if self.last is not None and at < self.last:
            self.high = max(self.high or self.last, self.last)  # the step: the latest stamp taken, kept
            back = self.last[0] - at[0]
            if back > LOOKBACK_SECONDS and not self._said_step:
                self._said_step = True
                self.stats.read_errors += 1
                self.stats.last_error = (
                    f"the node's clock stepped back by {back} s, more than the {LOOKBACK_SECONDS} s a resumed request "
                    "looks back: lines written right after the step may have been skipped by the kubelet"
                )
                log.warning("kubernetes: pod log: %s", self.stats.last_error)
        elif self.high is not None and at > self.high:
            self.high = None  # the clock has passed the step
        if at == self.last:
            self.same += 1
        else:
            self.last, self.same = at, 1

    def _repeat(self, at: tuple[int, int]) -> bool:
        """Taken before this request: every line until the position comes again (the `same`-th line at exactly the
        last stamp taken), or until a line later than every stamp taken (the position is gone from the file, which
        rotated); none after, whatever its stamp (the node's clock may have stepped back since)."""
        if self._resumed is None:
            return False
        last, same, latest = self._resumed
        if at > latest:
            self._resumed = None  # past everything taken: this and what follows is new
            return False
        if at == last:
            self._seen_again += 1
            if self._seen_again >= same:
                self._resumed, self._passed = None, True  # the position itself: what follows is new
        return True

    def new_stream(self, *, previous: bool = False, lookback: bool = True) -> dict[str, str]:
        """A request (re)starts, of the previous container's log (`previous`) or of the current one's: what to ask
        from (`sinceTime`, LOOKBACK_SECONDS before the position unless `lookback` is False, or `sinceSeconds` for a
        pod read from now that has written nothing yet); {} to read the container's log from its start."""
        with self._lock:
            # The previous container's request, just read, held the position: the current container's lines all
            # come after it.
            after_position = not previous and self._request_previous and self._passed
            self._request_previous, self._passed, self._seen_again = previous, False, 0
            self._resumed = None
            if self.last is not None and not after_position:
                self._resumed = (self.last, self.same, max(self.last, self.high or self.last))
            if self.last is not None:
                at = (max(0, self.last[0] - LOOKBACK_SECONDS), 0) if lookback else self.last
                return {"sinceTime": since_time(at)}
            if self._from_now is not None:
                return {"sinceSeconds": str(max(1, math.ceil(time.monotonic() - self._from_now)))}
            return {}

    def error(self, message: str) -> None:
        with self._lock:
            self.stats.read_errors += 1
            self.stats.last_error = message
        if (wake := self.wake) is not None:
            wake()

    def ok(self) -> None:
        with self._lock:
            self.stats.last_error = ""

    # -- the runner's side (its thread) ----------------------------------------------------------------------
    def poll(self) -> list[str]:
        with self._lock:
            lines, self.stamps = [held[0] for held in self._held], [held[2] for held in self._held]
            self._held, self._held_bytes = deque(), 0
            self._polled = (self.last, self.same, self.high)
        return lines

    def state(self) -> dict[str, Any]:
        with self._lock:
            last, same, high = self._polled
        if last is None:  # no line taken yet: where the next exporter reads from
            if self._from_now is None:
                return {"since": FROM_START}
            since = self._from_wall
            return {"since": rfc3339((int(since), int(since % 1 * 1e9)))}
        return {"last": rfc3339(last), "same": same, **({"high": rfc3339(high)} if high is not None else {})}

    def close(self) -> list[str]:
        return self.poll()
