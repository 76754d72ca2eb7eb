"""How the kubelet names the cgroups of pods and containers: a cgroup path -> the pod's UID and the container's ID.

The kubelet puts each container in a cgroup whose path holds the pod's UID and the container's ID:
systemd driver `.../kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope`, cgroupfs driver
`/kubepods/burstable/pod<uid>/<id>` (crio-, docker- prefixes alike). A leaf: read by pod attribution
(sources/kubernetes/cgroup.py, NVML's pids to pods) and by the kernel log's kills (events/kill_owners.py).
"""

from __future__ import annotations

import re

_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER = re.compile(r"(?:^|[-/])([0-9a-f]{64})(?:\.scope)?$")


def pod_of(cgroup: str) -> tuple[str, str] | None:
    """(pod UID, container ID) of a /proc/<pid>/cgroup text; None for a process outside pods."""
    # cgroup v2's single line ("0::/...") where there is one, else any v1 hierarchy's.
    lines = sorted(cgroup.splitlines(), key=lambda line: not line.startswith("0::"))
    for line in lines:
        path = line.split(":", 2)[-1]
        pod = _POD.search(path)
        if pod is None:
            continue
        container = _CONTAINER.search(path)
        return pod.group(1).replace("_", "-"), container.group(1) if container else ""
    return None
