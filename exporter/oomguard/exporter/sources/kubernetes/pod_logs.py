"""Following an engine container's log through the API (`pods/log`): the cluster mode's log source.

One stream per engine container (`follow=true&timestamps=true`), on the event loop; its lines go to the target's
`ApiLogReader` (events/api_log.py), which drops what a resumed stream repeats. The stream ends when the container
stops, when the kubelet cuts it (after hours), or when the connection drops: it is asked again from an hour before
the last line read (`sinceTime`: the kubelet skips the lines stamped before it, and a node's clock may step back;
events/api_log.py). Before each stream the previous container's log is read from there too
(`previous=true`): a container that died while no stream was open (its last lines, a crash's traceback among
them, are only there) is read once, before its successor; where there was no restart its lines are all repeats.
The pod's status is not needed for this, and may lag the new container's first lines anyway. Only the last
container before the current one is kept by the kubelet: two restarts while the API is away lose the first
one's end (its OOMKilled status is still counted, events/kubernetes.py). While the API refuses (no RBAC on
pods/log: 403) or is away, the failure is the source's read error and the request is tried again after a wait
that doubles; a container that has not started yet (400: its image pulling, an init container running) is only
waited for, the same way.

Descriptors: a stream takes a slot of the client's budget (sources/kubernetes/log_budget.py: the logs' share of
RLIMIT_NOFILE, descriptors.py) before it opens, with the previous container's read before it, and gives it back when
it ends. A follower refused one waits for a slot and, meanwhile, reads its log by turns: every TURN_SECONDS, one
short request without `follow` (the API sends what there is from the position and ends it), the previous
container's first, each within the budget's few short reads at once. The same position and resume as a stream's,
so nothing is lost and nothing counted twice: the lines come up to TURN_SECONDS (and the queue of turns) late; a
turn looks back the hour only after a turn that brought no new line (a node's clock that stepped back makes a log
look quiet), so that a busy log is not sent an hour again every 10 s. This
was chosen over only waiting for a slot: the slots come free when streams end (a container stopped, or renewed after
STREAM_MAX_SECONDS), so a follower only waiting would read nothing for half an hour, and a container restarted twice
meanwhile would lose its first life's end (the kubelet keeps one previous container).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from oomguard.exporter.sources.kubernetes.api import ApiClient, ApiError
from oomguard.exporter.sources.kubernetes.log_budget import Ticket

log = logging.getLogger(__name__)
MAX_LINE_BYTES = 64 * 1024  # the head of a longer line is kept (a log pattern reads a line's start)
# A stream is ended and asked again after this long: a connection that died without a word (no FIN, no data: a
# quiet engine's stream looks the same) is not followed for ever. A new stream costs one request; nothing is lost.
STREAM_MAX_SECONDS = 1800.0
RETRY_FIRST_SECONDS = 0.5
# A follower without a stream reads its log this often (two short requests); with N waiting and R reads at once, a
# turn comes every max(TURN_SECONDS, about N x a request's time / R).
TURN_SECONDS = 10.0
TURN_MAX_SECONDS = 60.0  # a short read that takes longer is cut there (a huge log): it goes on at the next turn


class LogSink(Protocol):
    """Where the lines go: events/api_log.py's `ApiLogReader`, made by the event runner's door (PodEvents)."""

    def offer(self, line: str) -> bool: ...

    def new_stream(self, *, previous: bool = False, lookback: bool = True) -> dict[str, str]: ...

    def ok(self) -> None: ...

    def error(self, message: str) -> None: ...


class PodLogFollower:
    def __init__(
        self,
        client: ApiClient,
        reader: LogSink,
        *,
        namespace: str,
        pod: str,
        container: str,
        retry_max_seconds: float,
        stream_max_seconds: float = STREAM_MAX_SECONDS,
        turn_seconds: float | None = None,
    ) -> None:
        """`turn_seconds`: how often a follower without a stream reads its log (TURN_SECONDS, read when it starts)."""
        self.client = client
        self.stream_max_seconds = stream_max_seconds
        self.turn_seconds = TURN_SECONDS if turn_seconds is None else turn_seconds
        self.reader = reader
        self.path = f"/api/v1/namespaces/{namespace}/pods/{pod}/log"
        self.container = container
        self.retry_max_seconds = retry_max_seconds
        self.streams = 0  # streams opened (for the tests: a resume is seen)
        self.turns = 0  # short reads made while waiting for a stream
        self._said_forbidden = False
        self._quiet_turn = True  # the last turn brought no new line: the next looks back the hour

    async def run(self) -> None:
        retry = RETRY_FIRST_SECONDS
        while True:
            # A slot before the stream opens (or, refused, turns of short reads until one is handed over), given
            # back when it ends: not held while waiting to ask again.
            ticket = self.client.log_budget.ask()
            failed: ApiError | None = None
            try:
                if not ticket.granted:
                    await self._take_turns(ticket)
                await self._catch_up()
                again = await self._follow()
            except ApiError as exc:
                failed = exc
            except asyncio.CancelledError:
                ticket.release(stopping=True)
                raise
            finally:
                ticket.release()
            if failed is not None:
                self._failed(failed)
                await asyncio.sleep(retry)
                retry = min(retry * 2, self.retry_max_seconds)
            elif again:
                retry = RETRY_FIRST_SECONDS
            else:
                # A container that stopped and is not running again yet, or not started: after a wait.
                retry = min(retry * 2, self.retry_max_seconds)
                await asyncio.sleep(retry)

    def _failed(self, exc: ApiError) -> None:
        """Counted and said by the event source (its read errors, its error logged when it changes); the fix of a
        refusal said here, once."""
        self.reader.error(str(exc))
        if exc.status == 403 and not self._said_forbidden:
            self._said_forbidden = True
            log.error("kubernetes: %s refused (403): the service account needs get on pods/log", self.path)

    async def _take_turns(self, ticket: Ticket) -> None:
        """Until the ticket is granted: the log read by a short request every turn_seconds, within the budget's
        short reads at once; a failure is the source's read error, as a stream's."""
        while True:
            async with self.client.log_budget.read_turn():
                if ticket.granted:
                    return
                self.turns += 1
                lookback, self._quiet_turn = self._quiet_turn, True
                try:
                    taken = await self._catch_up(TURN_MAX_SECONDS, lookback=lookback)
                    taken += await self._read(TURN_MAX_SECONDS, lookback=lookback)
                    self._quiet_turn = taken == 0
                except TimeoutError:
                    self.reader.error(f"GET {self.path}: no end within {TURN_MAX_SECONDS:g}s")
                except ApiError as exc:
                    if exc.status != 400:  # 400: the container has not started yet: nothing to read
                        self._failed(exc)
            if await ticket.wait(self.turn_seconds):
                return

    async def _catch_up(self, seconds: float | None = None, *, lookback: bool = True) -> int:
        """The previous container's lines after the position: a container that ended while no stream was open; how
        many were new."""
        seconds = self.stream_max_seconds if seconds is None else seconds
        try:
            return await self._read(seconds, lookback=lookback, previous="true")
        except TimeoutError:
            self.reader.error(f"GET {self.path} (previous): no end within {seconds:g}s")
        except ApiError as exc:
            if exc.status != 400:  # 400: no previous container (none restarted yet): nothing to read
                raise
        return 0

    async def _follow(self) -> bool:
        """One stream, until it ends; whether to ask again at once: it brought new lines (it ended as streams
        end), or it was ended on purpose after STREAM_MAX_SECONDS."""
        self.streams += 1
        try:
            return await self._read(self.stream_max_seconds, follow="true") > 0
        except TimeoutError:
            return True
        except ApiError as exc:
            if exc.status != 400:
                raise
            # 400: the container has not started yet (its image pulling, an init container running): nothing to
            # read, and nothing wrong; asked again after the wait.
            log.debug("kubernetes: %s: %s", self.path, exc)
            return False

    async def _read(self, seconds: float, *, lookback: bool = True, **query: str) -> int:
        """One request from the position (`sinceTime`, an hour before it unless not `lookback`; `sinceSeconds`),
        within `seconds`; the lines that were not repeats."""
        since = self.reader.new_stream(previous=query.get("previous") == "true", lookback=lookback)
        params = {"container": self.container, "timestamps": "true", **query, **since}
        taken = 0
        async with asyncio.timeout(seconds):
            async for line in self.client.log_lines(self.path, params, MAX_LINE_BYTES):
                self.reader.ok()
                taken += self.reader.offer(line)
        return taken
