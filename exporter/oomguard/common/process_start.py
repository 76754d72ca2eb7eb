"""When a process started, from /proc: the one clock a restart is told by (a new life has a new start).

A leaf: read by the engines' process lookup (sources/processes.py), the settings reader, pod attribution and
the simulation's supervisor and engines alike.
"""

from __future__ import annotations

import os
import time


def stat_fields(pid: int) -> tuple[int, int]:
    """(start tick, resident pages): fields 22 and 24 of /proc/PID/stat, one read. OSError when it cannot be read
    (FileNotFoundError: the process is gone), ValueError when it holds no such fields."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rpartition(b")")[2].split()  # counted after the command name, which may hold spaces
    if len(fields) < 22:
        raise ValueError(f"/proc/{pid}/stat has {len(fields)} fields after the command name")
    return int(fields[19]), int(fields[21])


def start_ticks(pid: int) -> int | None:
    """Clock ticks after boot at which the process started (field 22 of /proc/PID/stat)."""
    try:
        return stat_fields(pid)[0]
    except (OSError, ValueError):
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
    started_ticks = start_ticks(pid)
    if started_ticks is None:
        return None
    if _boot_time is None:
        try:
            with open("/proc/uptime") as f:
                _boot_time = time.time() - float(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None
    return _boot_time + started_ticks / os.sysconf("SC_CLK_TCK")
