"""How many of the cluster mode's log streams may be open at once, and who waits: the logs' share of the process's
descriptors (descriptors.py), so that 1,000 engine pods never take the descriptors `/metrics` and `/proc` need.

A follower asks for a stream before it opens one (`ask`) and gives the slot back when the stream ends (`Ticket.
release`). Over the budget, it is refused, counted, and queued: the slots that come free go to the followers
waiting, oldest first, and a follower whose stream ended asks again behind them, so every container's log takes its
turn with a stream. Meanwhile a follower waiting reads its log by short requests (no `follow`: the API sends what
there is and ends), at most `reads` at once (`read_turn`): nothing is lost, the lines come late by the wait between
two reads (sources/kubernetes/pod_logs.py). Said once at WARNING when the first is refused, and once when none waits
any more: never a line a refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator

from oomguard.common import descriptors
from oomguard.exporter.model import LogStreams

log = logging.getLogger(__name__)


class Ticket:
    """A follower's claim on a stream slot: granted at once, or when one comes free (its place in the queue)."""

    def __init__(self, budget: LogStreamBudget, waiting: asyncio.Future[None] | None) -> None:
        self._budget = budget
        self._waiting = waiting  # None: granted at once
        self._released = False

    @property
    def granted(self) -> bool:
        return self._waiting is None or (self._waiting.done() and not self._waiting.cancelled())

    async def wait(self, seconds: float) -> bool:
        """Until the slot is handed over or `seconds` have passed; whether it was."""
        if not self.granted:
            assert self._waiting is not None
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel that comes as the slot does
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await asyncio.shield(self._waiting)
        return self.granted

    def release(self, *, stopping: bool = False) -> None:
        """The stream ended (its slot to the next waiting), or the follower stops waiting (its place given up).
        `stopping`: the follower is cancelled (its pod gone, or the exporter stopping): no recovery is said for it
        (at a stop, every follower's slot goes round the queue until none waits)."""
        if self._released:
            return
        self._released = True
        if self.granted:
            self._budget._give_back(say=not stopping)
        else:
            assert self._waiting is not None
            self._waiting.cancel()
            self._budget._left_queue(say=not stopping)


class LogStreamBudget:
    def __init__(self, streams: int, reads: int, *, nofile: int | None = None) -> None:
        """`streams`: open at once; `reads`: short reads at once for the followers waiting; `nofile`: the descriptor
        limit they are a share of (for what is said)."""
        self.streams = max(1, streams)
        self.reads = max(1, reads)
        self.nofile = nofile
        self.open = 0  # slots held: streams open, or about to open
        self.refused_total = 0
        self._queue: deque[asyncio.Future[None]] = deque()
        self._waiting = 0  # live futures in the queue (cancelled ones are skipped when a slot is handed over)
        self._read_slots: asyncio.Semaphore | None = None  # made on the loop that uses it
        self._refused_since_said = 0
        self._said = False

    @classmethod
    def of_process(cls) -> LogStreamBudget:
        shares = descriptors.budget()
        return cls(shares.log_streams, shares.log_reads, nofile=shares.limit)

    @property
    def waiting(self) -> int:
        return self._waiting

    def counts(self) -> LogStreams:
        return LogStreams(open=self.open, limit=self.streams, waiting=self._waiting, refused_total=self.refused_total)

    def ask(self) -> Ticket:
        """A slot now if one is free and none waits before; else a refusal, counted, and a place in the queue."""
        if self.open < self.streams and not self._waiting:
            self.open += 1
            self._recovered()
            return Ticket(self, None)
        self.refused_total += 1
        self._refused_since_said += 1
        waiting: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(waiting)
        self._waiting += 1
        if not self._said:
            self._said = True
            of = f" (the logs' share of {self.nofile} file descriptors, RLIMIT_NOFILE)" if self.nofile else ""
            log.warning(
                "kubernetes: %d log streams open, the most allowed%s: the other containers' logs are read by turns "
                "of short requests until a stream is free, their lines later but none lost; counted in "
                "oomguard_log_streams_refused_total (raise the limit, or shard: docs/security.md, "
                "\"File descriptors\")",
                self.open, of,
            )  # fmt: skip
        return Ticket(self, waiting)

    @contextlib.asynccontextmanager
    async def read_turn(self) -> AsyncIterator[None]:
        """One of the `reads` short reads at once, in the order asked."""
        if self._read_slots is None:
            self._read_slots = asyncio.Semaphore(self.reads)
        async with self._read_slots:
            yield

    def _give_back(self, *, say: bool) -> None:
        while self._queue:
            waiting = self._queue.popleft()
            if not waiting.cancelled():
                self._waiting -= 1
                waiting.set_result(None)  # the slot handed over: `open` unchanged
                return
        self.open -= 1
        if say:
            self._recovered()

    def _left_queue(self, *, say: bool) -> None:
        self._waiting -= 1
        if say:
            self._recovered()

    def _recovered(self) -> None:
        """Said when a slot is free with none waiting: not when the last one waiting is handed a slot, which the
        follower whose stream ended asks again for at once (the turns go on)."""
        if self._said and not self._waiting:
            self._said = False
            log.warning(
                "kubernetes: every followed log has its stream again (%d streams open; %d refused meanwhile)",
                self.open, self._refused_since_said,
            )  # fmt: skip
            self._refused_since_said = 0
