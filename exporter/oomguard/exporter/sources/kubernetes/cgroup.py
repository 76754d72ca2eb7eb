"""NVML's pids -> the pod and container they run in, from /proc/<pid>/cgroup, without the API.

The cgroup's path names them (kubelet_cgroups.py). Blocking: run in a thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from oomguard.common.kubelet_cgroups import pod_of


def attribute(pids: Iterable[int], proc_dir: str = "/proc") -> dict[int, tuple[str, str]]:
    """pid -> (pod UID, container ID) for those of `pids` that run in a pod (gone ones are left out)."""
    out: dict[int, tuple[str, str]] = {}
    for pid in pids:
        try:
            text = (Path(proc_dir) / str(pid) / "cgroup").read_text()
        except OSError:
            continue
        if (found := pod_of(text)) is not None:
            out[pid] = found
    return out
