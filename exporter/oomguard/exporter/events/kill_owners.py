"""Which target a kernel OOM kill belongs to: the kernel log names the victim's pid and memory cgroup.

A kill is a target's when its victim was one of the target's processes on this host (as the
process lookup found them in the last `REMEMBER_SECONDS`: the victim is gone by the time its
record is read) or when its memory cgroup is the target's pod's (the pod's UID in the path, as
the kubelet names pod cgroups). The runner leaves out a target with a `cgroup:` of its own: its
cgroup's counter counts its kills already (cgroup.py), and one kill must not count twice for it.

The event loop updates the owners (`update`, from the scrapers and the process lookup); the
event poll's thread reads them (`owner_of`): a lock keeps the two apart.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from oomguard.common.kubelet_cgroups import pod_of

REMEMBER_SECONDS = 120.0  # a process seen this recently may be the victim of a kill read now


class KillOwners:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._pids: dict[str, dict[int, float]] = {}  # target -> pid -> when last seen
        self._pods: dict[str, str] = {}  # pod UID -> target

    def update(self, target: str, pids: Iterable[int] = (), pod_uid: str | None = None) -> None:
        """What is known of `target` now: its processes on this host, its pod's UID."""
        now = self._clock()
        with self._lock:
            seen = self._pids.setdefault(target, {})
            seen.update(dict.fromkeys(pids, now))
            for pid in [p for p, at in seen.items() if now - at > REMEMBER_SECONDS]:
                del seen[pid]
            if pod_uid:
                self._pods[pod_uid] = target

    def keep_only(self, targets: Iterable[str]) -> None:
        """Forget the targets that are gone (discovered pods and engines come and go)."""
        keep = set(targets)
        with self._lock:
            self._pids = {t: pids for t, pids in self._pids.items() if t in keep}
            self._pods = {uid: t for uid, t in self._pods.items() if t in keep}

    def owner_of(self, pid: int | None, memcg: str | None) -> str | None:
        """The target whose process `pid` was or whose pod's cgroup `memcg` is; None for none of them."""
        with self._lock:
            if pid is not None:
                for target, pids in self._pids.items():
                    if pid in pids:
                        return target
            if memcg and self._pods and (pod := pod_of(f"0::{memcg}")) is not None:
                return self._pods.get(pod[0])
        return None
