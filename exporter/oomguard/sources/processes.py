"""The engine's own processes on this host: found by the port it listens on.

An engine such as vLLM runs several processes (API server, engine core, workers);
the API server listens, the others are its children. Their summed RSS is the
host-memory view (CPU deployments OOM too), and their pids tie NVML's
per-process GPU memory to the target. Blocking (/proc reads): runs in a thread.
"""

from __future__ import annotations

import logging
import os
import time

import psutil

from oomguard.snapshot import ProcessTree

log = logging.getLogger(__name__)


class ProcessFinder:
    def __init__(self) -> None:
        # port -> (pid, its start tick): checked on each use by one read of /proc/PID/stat, since
        # listing sockets (net_connections) reads all of /proc/net/tcp*: ~10 ms a call.
        self._listener_by_port: dict[int, tuple[int, int]] = {}
        self._last_listener: dict[int, ProcessTree] = {}

    def find(self, port: int) -> ProcessTree | None:
        pid = self._cached_listener(port) or self._scan_listener(port)
        if pid is None:
            return None
        try:
            return self._tree(pid, port)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self._listener_by_port.pop(port, None)
            return None

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

    def _cached_listener(self, port: int) -> int | None:
        cached = self._listener_by_port.get(port)
        if cached is None:
            return None
        pid, ticks = cached
        if _start_ticks(pid) == ticks:  # the same process (a reused pid has another start tick)
            return pid
        del self._listener_by_port[port]
        return None

    def _scan_listener(self, port: int) -> int | None:
        try:
            connections = psutil.net_connections("inet")
        except psutil.AccessDenied:
            log.warning("cannot list sockets to find the engine on port %d: run as root or set local_process: no", port)
            return None
        for conn in connections:
            if conn.pid and _listens(conn, port):
                ticks = _start_ticks(conn.pid)
                if ticks is not None:
                    self._listener_by_port[port] = (conn.pid, ticks)
                return conn.pid
        return None

    def _tree(self, pid: int, port: int) -> ProcessTree:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
        rss = 0.0
        pids = set()
        for proc in members:
            try:
                rss += proc.memory_info().rss
                pids.add(proc.pid)
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue  # a worker that exited between the listing and the read
        try:
            cmdline = tuple(root.cmdline())
        except psutil.AccessDenied:
            cmdline = ()
        tree = ProcessTree(
            root_pid=pid,
            pids=frozenset(pids),
            resident_bytes=rss,
            start_time_seconds=start_time(pid) or root.create_time(),
            cmdline=cmdline,
        )
        self._last_listener[port] = tree
        return tree


def _start_ticks(pid: int) -> int | None:
    """Clock ticks after boot at which the process started (field 22 of /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        # Counted after the parenthesised command name, which may hold spaces.
        return int(stat.rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


_boot_time: float | None = None


def start_time(pid: int) -> float | None:
    """When a process started, Unix time, to a clock tick, and the same value at every call.

    psutil's create_time() adds the boot time, which /proc/stat gives in whole seconds: up to
    a second off, too coarse to measure a model's load time. Here the boot time comes from
    /proc/uptime, once: recomputed on each call it would jitter by the time between the two
    reads, and a start time that moves looks like a restart.
    """
    global _boot_time
    started_ticks = _start_ticks(pid)
    if started_ticks is None:
        return None
    if _boot_time is None:
        try:
            with open("/proc/uptime") as f:
                _boot_time = time.time() - float(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None
    return _boot_time + started_ticks / os.sysconf("SC_CLK_TCK")


def _listens(conn: psutil._common.sconn | psutil._common.pconn, port: int) -> bool:
    return conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port
