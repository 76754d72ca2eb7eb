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
# /proc/uptime counts in hundredths: a boot time read again within this of the last is the same one. Beyond it the
# wall clock was stepped against the boot clock (NTP, a VM paused or migrated): taken again, or every start time
# computed from then on would be off by the step, and two processes (the simulator and the exporter) would disagree.
BOOT_TIME_RESYNC_SECONDS = 0.02


def boot_time() -> float | None:
    """When the host booted, Unix time: the same value at every call while the wall clock keeps pace with the boot
    clock, taken again when it was stepped."""
    global _boot_time
    try:
        with open("/proc/uptime") as f:
            fresh = time.time() - float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _boot_time
    if _boot_time is None or abs(fresh - _boot_time) > BOOT_TIME_RESYNC_SECONDS:
        _boot_time = fresh
    return _boot_time


def start_time(pid: int) -> float | None:
    """When a process started, Unix time, to a clock tick, and the same value at every call.

    psutil's create_time() adds the boot time, which /proc/stat gives in whole seconds: up to
    a second off, too coarse to measure a model's load time. Here the boot time comes from
    /proc/uptime, kept while it agrees within BOOT_TIME_RESYNC_SECONDS: recomputed into each
    value it would jitter by the time between the two reads (a start time that moves looks like
    a restart), kept for ever it would carry every later step of the wall clock into a
    startup's length.
    """
    started_ticks = start_ticks(pid)
    if started_ticks is None:
        return None
    booted = boot_time()
    if booted is None:
        return None
    return booted + started_ticks / os.sysconf("SC_CLK_TCK")
