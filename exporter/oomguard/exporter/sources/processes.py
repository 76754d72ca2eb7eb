"""The engine's own processes on this host: found by the port it listens on.

An engine such as vLLM runs several processes (API server, engine core, workers);
the API server listens, the others are its children. Their summed RSS is the
host-memory view (CPU deployments OOM too), and their pids tie NVML's
per-process GPU memory to the target. Blocking (/proc reads): runs in a thread.

Cost: listing every process on the host (the parent-to-children map) is done only for an
engine not seen yet, one whose family changed (a member exited, a pid was reused), and
every FAMILY_RESCAN_SECONDS; otherwise the known family is re-read pid by pid, one read of
/proc/PID/stat each (its start tick and its RSS), at most once per lookup. On a 2-core host
saturated by vLLM, the full listing on every scrape took seconds. A worker started later than
the first look is found within FAMILY_RESCAN_SECONDS.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable

import psutil

from oomguard.common.process_start import start_time, stat_fields
from oomguard.exporter.model import ProcessTree

log = logging.getLogger(__name__)

# A known engine's process family is re-read pid by pid; the whole of /proc is listed again only when
# its listener or a member changed, or this long after the last listing (to find workers started since).
FAMILY_RESCAN_SECONDS = 30.0


class ProcessFinder:
    def __init__(self) -> None:
        # port -> (pid, its start tick): checked on each use by one read of /proc/PID/stat, since
        # listing sockets (net_connections) reads all of /proc/net/tcp*: ~10 ms a call.
        self._listener_by_port: dict[int, tuple[int, int]] = {}
        self._last_listener: dict[int, ProcessTree] = {}
        # port -> (root pid, monotonic time of the /proc listing, {pid: start tick} of the root and its descendants)
        self._family: dict[int, tuple[int, float, dict[int, int]]] = {}

    def find_all(self, ports: Iterable[int]) -> dict[int, ProcessTree | None]:
        """Each port's listening process and its descendants (None where nothing listens).

        A known engine whose processes are all still there (same pids, same start ticks) is read
        pid by pid: a handful of /proc reads. Only a new or changed family (and each one every
        FAMILY_RESCAN_SECONDS) costs the pass over every process on the host, done once for all ports.
        """
        stats = _Stats()
        listeners = {port: self._cached_listener(port, stats) for port in ports}
        unknown = {port for port, pid in listeners.items() if pid is None}
        if unknown:
            listeners.update(self._scan_listeners(unknown, stats))
        known = {port: self._known_family(port, pid, stats) for port, pid in listeners.items() if pid is not None}
        children = _children_by_parent() if any(family is None for family in known.values()) else {}
        trees: dict[int, ProcessTree | None] = {}
        for port, pid in listeners.items():
            trees[port] = None
            if pid is None:
                continue
            try:
                trees[port] = self._tree(pid, port, children, stats, known.get(port))
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                self._listener_by_port.pop(port, None)
                self._family.pop(port, None)
            except psutil.AccessDenied:
                log.warning("cannot read process %d (listening on port %d): run as its user or as root", pid, port)
        return trees

    def restarted(self, port: int) -> bool:
        """True when a new process with the last listener's command line is running.

        A restarted engine does not listen while it loads its model, so it cannot be
        found by port; its command line is what it shares with its previous life.
        """
        last = self._last_listener.get(port)
        if last is None or not last.cmdline:
            return False
        for proc in psutil.process_iter(["cmdline"]):
            if proc.pid == last.root_pid or tuple(proc.info["cmdline"] or ()) != last.cmdline:
                continue
            started = start_time(proc.pid)
            if started is not None and started >= last.start_time_seconds:
                return True
        return False

    def _cached_listener(self, port: int, stats: _Stats) -> int | None:
        cached = self._listener_by_port.get(port)
        if cached is None:
            return None
        pid, ticks = cached
        if stats.start_ticks(pid) == ticks:  # the same process (a reused pid has another start tick)
            return pid
        del self._listener_by_port[port]
        return None

    def _scan_listeners(self, ports: set[int], stats: _Stats) -> dict[int, int]:
        try:
            connections = psutil.net_connections("inet")
        except psutil.AccessDenied:
            log.warning(
                "cannot list sockets to find the engines on ports %s: run as root or set local_process: no",
                sorted(ports),
            )
            return {}
        found: dict[int, int] = {}
        for conn in connections:
            port = conn.laddr.port if conn.laddr else None
            if conn.pid and port in ports and port not in found and conn.status == psutil.CONN_LISTEN:
                found[port] = conn.pid
                ticks = stats.start_ticks(conn.pid)
                if ticks is not None:
                    self._listener_by_port[port] = (conn.pid, ticks)
        return found

    def _known_family(self, port: int, root: int, stats: _Stats) -> list[int] | None:
        """The descendants of `root` from the last listing of /proc, if none of them changed since."""
        family = self._family.get(port)
        if family is None or family[0] != root or time.monotonic() - family[1] > FAMILY_RESCAN_SECONDS:
            return None
        if any(stats.start_ticks(pid) != ticks for pid, ticks in family[2].items()):
            return None  # a member exited (or its pid was reused): list /proc again
        return [pid for pid in family[2] if pid != root]

    def _tree(
        self, pid: int, port: int, children: dict[int, list[int]], stats: _Stats, known: list[int] | None = None
    ) -> ProcessTree:
        try:
            rss = stats.resident_bytes(pid)
        except FileNotFoundError:
            raise psutil.NoSuchProcess(pid) from None
        except PermissionError:
            raise psutil.AccessDenied(pid) from None
        pids = {pid}
        stack = list(known if known is not None else children.get(pid, ()))
        while stack:
            child = stack.pop()
            if child in pids:
                continue
            try:
                rss += stats.resident_bytes(child)
            except OSError:
                continue  # a worker that exited between the listing and the read
            pids.add(child)
            if known is None:
                stack.extend(children.get(child, ()))
        if known is None:
            ticks = {p: stats.start_ticks(p) for p in pids}
            self._family[port] = (pid, time.monotonic(), {p: t for p, t in ticks.items() if t is not None})
        last = self._last_listener.get(port)
        if known is not None and last is not None and last.root_pid == pid:
            # The same process (its start tick checked by the family above): its command line and start time as
            # read at the last listing of /proc, FAMILY_RESCAN_SECONDS ago at most, rather than three more reads.
            cmdline, started = last.cmdline, last.start_time_seconds
        else:
            root = psutil.Process(pid)
            try:
                cmdline = tuple(root.cmdline())
            except psutil.AccessDenied:
                cmdline = ()
            started = start_time(pid) or root.create_time()
        tree = ProcessTree(
            root_pid=pid,
            pids=frozenset(pids),
            resident_bytes=rss,
            start_time_seconds=started,
            cmdline=cmdline,
        )
        self._last_listener[port] = tree
        return tree


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class _Stats:
    """/proc/PID/stat read once per pid for one lookup: its start tick (field 22: which life) and its RSS (field
    24, in pages, as `ps` shows it). Several ports of one process, and the root checked as listener and as family
    member, cost one read, where a statm read for the RSS was one more per process. Newer kernels keep the count
    per CPU and sum it for statm (psutil) but not here: the two differ by the pages not yet folded in, tens of kB
    on this host, at most one batch per CPU (32 pages; twice the CPUs on hosts of more than 16)."""

    def __init__(self) -> None:
        self._read: dict[int, tuple[int, int] | OSError] = {}

    def _fields(self, pid: int) -> tuple[int, int]:
        got = self._read.get(pid)
        if got is None:
            try:
                got = stat_fields(pid)
            except OSError as exc:
                got = exc
            except ValueError as exc:  # not a stat line: as good as gone
                got = FileNotFoundError(str(exc))
            self._read[pid] = got
        if isinstance(got, OSError):
            raise got
        return got

    def start_ticks(self, pid: int) -> int | None:
        try:
            return self._fields(pid)[0]
        except OSError:
            return None

    def resident_bytes(self, pid: int) -> float:
        """OSError (FileNotFoundError: exited; PermissionError) when the process cannot be read."""
        return float(self._fields(pid)[1] * _PAGE_SIZE)


def _children_by_parent() -> dict[int, list[int]]:
    """Parent pid -> child pids, from every /proc/PID/stat: one pass for all targets."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
            ppid = int(stat.rpartition(b")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # exited while we listed /proc
        children.setdefault(ppid, []).append(int(entry.name))
    return children
