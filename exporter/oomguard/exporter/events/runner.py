"""Reads every event source in the background and keeps the counts, across exporter restarts.

The sources are what the configuration asks for (registry.py): per target its log
files (globs), its journald unit, its Kubernetes pod logs, each through its own
incident detector, and its cgroup's OOM kills; for the host, kernel OOM kills. All
answer to one protocol (source.py) and are polled alike. Read positions, open
incidents, counts and last-event times are saved in `state_dir` after each poll that
changed them (written to a temporary file, then renamed), so a restarted exporter
neither loses nor recounts an event.

The state file: {"positions": {KEY: ...}, "incidents": {KEY: ...}, "counts": {TARGET:
{"total": {KIND: N}, "last": {KIND: T}}}, "gpu_counts": {KIND: {GPU: {"total": {CODE: N},
"last": T}}}}, KEY being "target|source" (target "" for the host), GPU a GPU's index and
CODE an XID's number, both as text. Its layout is kept as it is: an upgraded exporter resumes from an old one's.
It is checked whole when read (`read_state`): a file that is not a regular file, is over
MAX_STATE_BYTES, is not JSON, or has a wrong shape or type anywhere is set aside as
*.corrupt, counted, and the exporter starts afresh; nothing of it is half-trusted.
"""

from __future__ import annotations

import binascii
import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from oomguard.common.excerpt import excerpt
from oomguard.common.kinds import CGROUP_OOM_KILL, KERNEL_OOM_KILL, STARTUP, XID
from oomguard.exporter.config import Config
from oomguard.exporter.events.followed_file import STATE_VERSION, FollowedFile
from oomguard.exporter.events.kill_owners import KillOwners
from oomguard.exporter.events.log_clock import is_clock
from oomguard.exporter.events.records import MAX_PROCESSES
from oomguard.exporter.events.registry import COUNTS, GPU_COUNTS, SavedState, build_sources
from oomguard.exporter.events.scan import kind
from oomguard.exporter.events.source import INCIDENTS, POSITIONS, EventSource
from oomguard.exporter.events.xid import NAME as XID_SOURCE
from oomguard.exporter.model import Counts, Event, EventSourceHealth

log = logging.getLogger(__name__)
STATE_FILE = "events-state.json"
TEMPORARY = ".events-state."  # the prefix of the file written before it is renamed over STATE_FILE
# Read no more than this (docs/events.md): a partial line kept per followed file is at most 1 MiB (1.4 in base64).
MAX_STATE_BYTES = 64 * 1024 * 1024
MAX_COUNT = 2**53  # the largest count a float64 sample holds exactly
# A source that wakes the runner when something comes (its `wake` hook, set here: the cluster mode's pod logs and API
# events, fed on the event loop) is polled when woken, and otherwise less often the longer it stays quiet: its
# interval doubles after each poll that brought nothing, up to this. What a quiet poll still does (an open incident
# closed after its quiet spell, log_clock.py's catching up) comes at most this late; a line never does (it wakes).
# A thousand quiet pods then cost a few hundred polls a second instead of four thousand (docs/performance.md).
QUIET_MAX_SECONDS = 8.0
_INDEX = re.compile(r"-?[0-9]{1,9}")  # a GPU's index or an XID's number, as text (ASCII digits only)


@dataclasses.dataclass(frozen=True)
class EventsView:
    """What the event runner had after a poll; never changed once made (EventRunner.view)."""

    counts: dict[str, Counts]
    health: tuple[EventSourceHealth, ...]
    xid: dict[tuple[int, int], int] = dataclasses.field(default_factory=dict)  # (gpu, XID) -> events
    xid_last: dict[int, float] = dataclasses.field(default_factory=dict)  # gpu -> its last XID's time
    xid_read_errors: int | None = None  # None: no XID source (no NVML, or events.xid off)


class EventRunner:
    def __init__(
        self,
        config: Config,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] | None = None,
        nvml: Any = None,
    ) -> None:
        """`clock` stamps events; `monotonic` is what the intervals a source judges run on (its quiet spells), by
        default time.monotonic, or `clock` where that is not time.time (a test's clock stands for both).
        `nvml`: the NVML library (pynvml, or the simulation's) whose XID events are a source; None for none."""
        self.clock = clock
        self.monotonic = monotonic or (time.monotonic if clock is time.time else clock)
        self.poll_interval = config.events.poll_interval_seconds
        self.state_path = Path(config.state_dir) / STATE_FILE if config.state_dir else None
        self.has_state = self.state_path is not None
        self.state_read_errors = 0  # a state file found unreadable at start (set aside as *.corrupt)
        saved = self._load()
        self.saved = SavedState(saved)  # for the sources added later (discovered pods)
        self.counts: dict[str, Counts] = {
            name: Counts(dict(c.get("total", {})), dict(c.get("last", {}))) for name, c in saved.get(COUNTS, {}).items()
        }
        self.xid, self.xid_last = _gpu_counts(saved.get(GPU_COUNTS, {}).get(XID, {}))
        self.sources: list[EventSource] = build_sources(config, self.saved, nvml)
        self._woken: set[EventSource] = set()  # sources whose `wake` came since their last poll (from the loop)
        self._give_clock(self.sources)
        self.state_write_errors = 0
        self._failures = [0] * len(self.sources)  # polls that raised (a bug): counted as read errors
        self._states = [source.state() for source in self.sources]  # as last saved or seen
        # Each source's schedule: whether it wakes the runner, its next poll (monotonic) and its interval.
        self._wakes = [self._wakes_runner(s) for s in self.sources]
        self._due = [0.0] * len(self.sources)
        self._every = [0.0] * len(self.sources)
        self._healths: list[EventSourceHealth] = []  # each source's as last polled: a quiet one's is not asked again
        self._next_due = -math.inf  # when a poll next has a source to poll (due())
        self.starts: list[tuple[str, float, int | None]] = []  # (target, when, pid) of each start read: take_starts
        # Whose processes and pods a kernel OOM kill may be: the runtime updates it from the target set.
        self.kill_owners = KillOwners()
        # A poll runs in a worker thread; discovered pods' sources come and go (set_sources) between polls.
        self._lock = threading.RLock()
        self._publish()

    # -- what a scrape reads -------------------------------------------------------------------
    @property
    def view(self) -> EventsView:
        """The counts and the sources' health as of the last poll (or change of sources): made under the lock
        and replaced whole, so a reader on the event loop takes no lock (a poll holds it for as long as its reads
        take: seconds on a busy host) and never iterates a dict a poll is changing."""
        return self._view

    def _publish(self, *, again: bool = True) -> None:
        """`again`: every source's health asked again (else as the last poll left it)."""
        if again:
            self._healths = self._health()
        health = tuple(self._healths)
        xid_errors = [h.read_errors for h in health if h.source == XID_SOURCE]
        self._view = EventsView(
            {name: c.copy() for name, c in self.counts.items()}, health, dict(self.xid), dict(self.xid_last),
            xid_errors[0] if xid_errors else None,
        )  # fmt: skip

    # -- one poll: blocking (file reads, journalctl), run in a worker thread ---------------
    def poll(self) -> None:
        with self._lock:
            if self._poll():
                self._publish(again=False)

    def due(self) -> bool:
        """Whether a poll now would poll a source: one that does not wake the runner (polled every time), one woken,
        or one due. Read without the lock, on the event loop: a source added meanwhile is due at once."""
        return bool(self._woken) or self.monotonic() >= self._next_due

    def set_sources(self, target: str, sources: list[EventSource]) -> None:
        """Make `sources` the sources of `target` (a discovered pod; [] when it is gone): those it had and that
        are not among them are closed, and what they held counted (blocking: a close reads the rest)."""
        with self._lock:
            kept = [i for i, s in enumerate(self.sources) if s.target != target or s in sources]
            for i, source in enumerate(self.sources):
                if i not in kept:
                    self._hook_wake(source, hooked=False)
                    try:
                        self._count(source, source.close())
                    except Exception:
                        log.exception("event source %s of %r failed to close", source.name, target)
            new = [s for s in sources if s not in self.sources]
            self._give_clock(new)
            self._woken -= {self.sources[i] for i in range(len(self.sources)) if i not in kept}
            self.sources = [self.sources[i] for i in kept] + new
            self._failures = [self._failures[i] for i in kept] + [0] * len(new)
            self._states = [self._states[i] for i in kept] + [s.state() for s in new]
            self._wakes = [self._wakes[i] for i in kept] + [self._wakes_runner(s) for s in new]
            self._due = [self._due[i] for i in kept] + [0.0] * len(new)
            self._every = [self._every[i] for i in kept] + [0.0] * len(new)
            self._next_due = self._earliest_due()
            self._save()
            self._publish()

    def state_of(self, target: str, source: str) -> dict[str, Any] | None:
        """The state of `target`'s source `source` as last saved or seen (None: no such source): what a close left,
        for the sharded cluster mode's hand-over of a node (sources/kubernetes/handover.py)."""
        with self._lock:
            for s, state in zip(self.sources, self._states, strict=True):
                if s.target == target and s.name == source:
                    return state
        return None

    def _give_clock(self, sources: list[EventSource]) -> None:
        for source in sources:
            if hasattr(source, "monotonic"):
                source.monotonic = self.monotonic  # type: ignore[attr-defined]
            self._hook_wake(source)

    @staticmethod
    def _wakes_runner(source: EventSource) -> bool:
        """Whether the source (or its line reader) has a `wake` hook: then it is polled when woken or due."""
        return any(hasattr(holder, "wake") for holder in (source, getattr(source, "reader", None)))

    def _hook_wake(self, source: EventSource, *, hooked: bool = True) -> None:
        """`hooked`: False for a source let go (its follower may still offer a last line: it wakes nobody)."""
        wake = partial(self._woken.add, source) if hooked else None  # from the loop's thread: one set.add, no lock
        for holder in (source, getattr(source, "reader", None)):
            if hasattr(holder, "wake"):
                holder.wake = wake

    def _poll(self) -> bool:
        """One poll of the sources due; whether the view changed (counts, a source's health)."""
        changed = publish = False
        wide: set[str] = set()  # the exporter-wide readers whose health changed
        now = self.monotonic()
        for i, source in enumerate(self.sources):
            woken = False
            if self._wakes[i]:
                woken = source in self._woken
                if not woken and now < self._due[i]:
                    continue  # quiet, and not due yet: not polled, its health as it was
                self._woken.discard(source)
            try:
                events = source.poll(self.clock())
                state = source.state()
            except Exception:  # a source's bug must not stop the others
                self._failures[i] += 1
                log.exception("event source %s of %r failed", source.name, source.target or "host")
                events, state = [], self._states[i]
            self._count(source, events)
            active = bool(events) or state != self._states[i]
            changed |= active
            publish |= bool(events)
            self._states[i] = state
            if self._wakes[i]:
                quieter = min(max(self._every[i] * 2, self.poll_interval), QUIET_MAX_SECONDS)
                self._every[i] = 0.0 if active or woken else quieter
                self._due[i] = now + self._every[i]
            health = self._health_of(i)
            if health != self._healths[i]:
                publish, self._healths[i] = True, health
                if health.exporter_wide:
                    wide.add(health.exporter_wide)
        if wide:  # a reader every pod's source shares (the API's Events): its figures are theirs too
            self._healths = [self._health_of(j) if h.exporter_wide in wide else h for j, h in enumerate(self._healths)]
        if changed:
            self._save()
        if self._woken:  # none but those woken during this poll, unless a source let go woke it as it went
            self._woken.intersection_update(self.sources)
        self._next_due = self._earliest_due()
        return publish

    def _earliest_due(self) -> float:
        """When the next poll has a source to poll: at once while any does not wake the runner."""
        if not all(self._wakes):
            return -math.inf
        return min(self._due, default=math.inf)

    def _count(self, source: EventSource, events: list[Event]) -> None:
        for event in events:
            if event.kind == STARTUP:  # a new life, for the restart tracker: not an event to count
                self.starts.append((source.target, event.timestamp, event.pid))
                continue
            if event.gpu is not None and event.code is not None:  # a GPU's (an XID): by GPU and code
                key = (event.gpu, event.code)
                self.xid[key] = self.xid.get(key, 0) + event.count
                self.xid_last[event.gpu] = max(self.xid_last.get(event.gpu, 0.0), event.timestamp)
                continue
            self.counts.setdefault(source.target, Counts()).add(event.kind, event.count, event.timestamp)
            log.warning("event: %s %s x%d", source.target or "host", event.kind, event.count)
            if event.kind == KERNEL_OOM_KILL:
                self._count_for_owner(event)

    def _count_for_owner(self, event: Event) -> None:
        """A kernel OOM kill of a target's process or pod is also the target's, counted as its cgroup's kills are;
        but not for a target with a cgroup source: that counter has counted it already."""
        owner = self.kill_owners.owner_of(event.pid, event.cgroup)
        if owner is None or any(s.target == owner and CGROUP_OOM_KILL in s.kinds for s in self.sources):
            return
        self.counts.setdefault(owner, Counts()).add(CGROUP_OOM_KILL, event.count, event.timestamp)
        log.warning(
            "event: %s %s x%d (the kernel log's kill of pid %s)", owner, CGROUP_OOM_KILL, event.count, event.pid
        )

    def take_starts(self) -> list[tuple[str, float, int | None]]:
        """(target, when, pid or None) of each engine start read in the logs since the last call."""
        starts, self.starts = self.starts, []
        return starts

    def health(self) -> list[EventSourceHealth]:
        with self._lock:
            return self._health()

    def _health(self) -> list[EventSourceHealth]:
        return [self._health_of(i) for i in range(len(self.sources))]

    def _health_of(self, i: int) -> EventSourceHealth:
        h, failures = self.sources[i].health(), self._failures[i]
        return dataclasses.replace(h, read_errors=h.read_errors + failures) if failures else h

    # -- state file ---------------------------------------------------------------------------
    def _load(self) -> dict[str, Any]:
        if self.state_path is None:
            return {}
        self._clear_temporaries()
        if not self.state_path.exists():
            return {}
        try:
            return read_state(self.state_path)
        except (OSError, ValueError, RecursionError) as exc:
            # Unreadable state: start at the end of every log (no recount), and say so. The file is kept
            # aside, not overwritten by the next save, and the metric tells the counts started afresh.
            self.state_read_errors += 1
            aside = self.state_path.with_name(self.state_path.name + ".corrupt")
            try:
                os.replace(self.state_path, aside)
                kept = f"kept as {aside}"
            except OSError as move:
                kept = f"and it could not be kept aside ({move})"
            log.error(
                "cannot read %s (%s), %s: counts start afresh, events before now are not recounted",
                self.state_path, excerpt(str(exc) or type(exc).__name__), kept,
            )  # fmt: skip
            return {}

    def _clear_temporaries(self) -> None:
        """Remove what writes cut short (the exporter killed between the temporary file and its rename) left."""
        assert self.state_path is not None
        with contextlib.suppress(OSError):
            for leftover in self.state_path.parent.glob(f"{TEMPORARY}*"):
                with contextlib.suppress(OSError):
                    leftover.unlink()

    def _save(self) -> None:
        if self.state_path is None:
            return
        state: dict[str, dict[str, Any]] = {POSITIONS: {}, INCIDENTS: {}}
        for source, saved in zip(self.sources, self._states, strict=True):
            for section, value in saved.items():
                state.setdefault(section, {})[f"{source.target}|{source.name}"] = value
        state[COUNTS] = {name: {"total": c.total, "last": c.last} for name, c in self.counts.items()}
        if self.xid:
            gpus: dict[str, dict[str, Any]] = {}
            for (gpu, code), n in self.xid.items():
                gpus.setdefault(str(gpu), {"total": {}, "last": self.xid_last.get(gpu, 0.0)})["total"][str(code)] = n
            state[GPU_COUNTS] = {XID: gpus}
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.state_path.parent, prefix=TEMPORARY)
            with os.fdopen(fd, "w") as out:
                json.dump(state, out)
            os.replace(tmp, self.state_path)
        except OSError as exc:
            self.state_write_errors += 1
            if self.state_write_errors == 1:
                log.error("cannot write %s (%s): fix events.state_dir, or a restart will recount", self.state_path, exc)
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(tmp)

    def close(self) -> None:
        """Close every source, count what they still held, and save the state."""
        with self._lock:
            self._close()
            self._publish()

    def _close(self) -> None:
        for i, source in enumerate(self.sources):
            try:
                self._count(source, source.close())
                self._states[i] = source.state()
            except Exception:
                log.exception("event source %s of %r failed to close", source.name, source.target or "host")
        self._save()


# -- the state file, checked whole ----------------------------------------------------------------
class BadState(ValueError):
    """The state file is not what this exporter writes: set aside whole."""


# Positions the sources take as they are: source name prefix -> field -> the JSON types it may hold (or null).
SCALAR_POSITIONS: dict[str, dict[str, tuple[type, ...]]] = {
    "cgroup:": {"oom_kill": (int,)},
    "kernel:": {"last_seq": (int,), "boot_id": (str,), "kills": (list,)},  # each kill checked by KillDedupe
    "journald:": {"cursor": (str,)},
    "k8s-api:": {"last_termination": (str,), "uid": (str,)},
}


def read_state(path: Path) -> dict[str, Any]:
    """The state file, read and checked: raises BadState (or OSError) when it cannot be trusted whole."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))  # a fifo must not block the start
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadState(f"{kind(st.st_mode)}, not a regular file")
        if st.st_size > MAX_STATE_BYTES:
            raise BadState(f"{st.st_size} bytes, over the {MAX_STATE_BYTES} read at most (docs/events.md)")
        data = _read_capped(fd)  # and if it grows meanwhile, no further either
    finally:
        os.close(fd)
    # NaN, Infinity and 1e999 (a float too large): no count, time or offset is one.
    saved = json.loads(data, parse_constant=_refuse_constant, parse_float=_finite_float)
    check_state(saved)
    return saved


def _read_capped(fd: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while chunk := os.read(fd, min(1024 * 1024, MAX_STATE_BYTES + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_STATE_BYTES:
            raise BadState(f"over {MAX_STATE_BYTES} bytes, the most read (docs/events.md)")
    return b"".join(chunks)


def _refuse_constant(name: str) -> Any:
    raise BadState(f"{name} where a number is expected")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadState(f"{excerpt(text)} is too large a number")
    return value


def check_state(saved: Any) -> None:
    """Raise BadState naming the first entry of a wrong shape or type."""
    _object(saved, "the file")
    for section in (POSITIONS, INCIDENTS):
        for key, entry in _object(saved.get(section, {}), section).items():
            if entry is None:
                continue
            _object(entry, f"{section}[{key!r}]")
            if section == POSITIONS:
                _check_position(key, entry)
            else:
                _check_incident(key, entry)
    for target, counts in _object(saved.get(COUNTS, {}), COUNTS).items():
        where = f"counts[{target!r}]"
        _object(counts, where)
        for kind_, n in _object(counts.get("total", {}), f"{where}.total").items():
            if not (type(n) is int and 0 <= n <= MAX_COUNT):
                raise BadState(f"{where}.total[{kind_!r}] is {n!r}, not a whole number from 0 to {MAX_COUNT}")
        for kind_, t in _object(counts.get("last", {}), f"{where}.last").items():
            if not _time(t):
                raise BadState(f"{where}.last[{kind_!r}] is {t!r}, not a time in seconds")
    for kind_, gpus in _object(saved.get(GPU_COUNTS, {}), GPU_COUNTS).items():
        for gpu, counts in _object(gpus, f"{GPU_COUNTS}[{kind_!r}]").items():
            where = f"{GPU_COUNTS}[{kind_!r}][{gpu!r}]"
            if not _index(gpu):
                raise BadState(f"{where}: {gpu!r} is not a GPU's index")
            for code, n in _object(_object(counts, where).get("total", {}), f"{where}.total").items():
                if not _index(code) or not (type(n) is int and 0 <= n <= MAX_COUNT):
                    raise BadState(f"{where}.total[{code!r}] is {n!r}: not a code and a whole number to {MAX_COUNT}")
            if not _time(counts.get("last", 0)):
                raise BadState(f"{where}.last is {counts.get('last')!r}, not a time in seconds")


def _index(text: str) -> bool:
    """A GPU's index or an XID's number as the state file keeps it: a whole number as text (-1: a GPU unknown)."""
    return _INDEX.fullmatch(text) is not None


def _gpu_counts(gpus: dict[str, Any]) -> tuple[dict[tuple[int, int], int], dict[int, float]]:
    """The saved counts of one kind of GPU event (checked by check_state): by (gpu, code), and each GPU's last."""
    counts = {(int(gpu), int(code)): n for gpu, c in gpus.items() for code, n in c.get("total", {}).items()}
    return counts, {int(gpu): float(c["last"]) for gpu, c in gpus.items() if c.get("last")}


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadState(f"{where} is {type(value).__name__}, not a JSON object")
    return value


def _check_position(key: str, entry: dict[str, Any]) -> None:
    if "|file:" in key or "|k8s:" in key:  # a log file follower's: each file as the follower reads it back
        files = entry.get("files", [])
        if entry.get("version") != STATE_VERSION or not isinstance(files, list):
            raise BadState(f"positions[{key!r}] is not a log follower's state of version {STATE_VERSION}")
        for i, file in enumerate(files):
            try:
                FollowedFile.from_state(file, 1)
            except (TypeError, ValueError, KeyError, AttributeError, OverflowError, binascii.Error) as exc:
                raise BadState(f"positions[{key!r}].files[{i}]: {exc!r}") from None
    for prefix, fields in SCALAR_POSITIONS.items():
        if f"|{prefix}" in key:
            for name, types in fields.items():
                value = entry.get(name)
                if value is not None and (type(value) not in types or (type(value) is int and value < 0)):
                    raise BadState(f"positions[{key!r}].{name} is {value!r}")


def _check_incident(key: str, entry: dict[str, Any]) -> None:
    """An incident detector's: {"open": null or [started, last line, [kind, ...]], "dead_until_startup": null or T,
    "tracebacks": {process tag: header} (absent: none), "clock": its log's clock (log_clock.py; absent: none)}."""
    incident, dead, tracebacks = entry.get("open"), entry.get("dead_until_startup"), entry.get("tracebacks", {})
    clock = entry.get("clock", {})
    ok = dead is None or _time(dead)
    ok = ok and is_clock(clock)
    ok = ok and isinstance(tracebacks, dict) and len(tracebacks) <= MAX_PROCESSES
    ok = ok and all(isinstance(t, str) and isinstance(v, str) for t, v in tracebacks.items())
    if incident is not None:
        ok = ok and isinstance(incident, list) and len(incident) == 3 and _time(incident[0]) and _time(incident[1])
        ok = ok and isinstance(incident[2], list) and all(isinstance(k, str) for k in incident[2])
    if not ok:
        raise BadState(f"incidents[{key!r}] is not an incident detector's state")


def _time(value: Any) -> bool:
    """A time in seconds: a finite number, 0 or more."""
    return type(value) in (int, float) and _finite(value) and value >= 0


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False
