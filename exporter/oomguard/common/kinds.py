"""The kinds of event oomguard counts: one list, read by the detector, the exposition, the rules and dashboards.

A kind's name is the `kind` label of `oomguard_target_events_total` (and its host and GPU
twins); changing one breaks every user's queries, so they are spelled here only.
"""

from __future__ import annotations

from collections.abc import Iterable

CUDA_OOM = "cuda_oom"  # the engine's allocator ran out of memory while serving
STARTUP_MEMORY = "startup_memory"  # the engine could not allocate what it needs to start
ENGINE_DEATH = "engine_death"  # the engine died of a fatal error with no memory line
CGROUP_OOM_KILL = "cgroup_oom_kill"  # the kernel killed one of the engine's processes (its cgroup, or the kernel log)
KERNEL_OOM_KILL = "kernel_oom_kill"  # the kernel's OOM killer ran on the host
XID = "xid"  # a GPU XID error from NVML
# From the Kubernetes API, for a discovered pod (sources/kubernetes/):
CONTAINER_OOM_KILLED = "container_oom_killed"  # its container ended OOMKilled, or with exit code 137
PROBE_FAILURE = "probe_failure"  # an Unhealthy event: its liveness or startup probe failed
PROBE_KILL = "probe_kill"  # a Killing event: the kubelet restarts the container for a failed probe
# Not an event: a log line that marks a new life of the engine, closing the incident in progress.
STARTUP = "startup"

# From the engine's log, most telling first: an incident is counted as the first kind it saw.
LOG_EVENT_KINDS = (CUDA_OOM, STARTUP_MEMORY, ENGINE_DEATH)
# The kinds a log pattern may have (the catalogue's and the configuration's `kind:`).
PATTERN_KINDS = (*LOG_EVENT_KINDS, STARTUP)
# The engine ran out of memory: what "an OOM happened" means in the rules.
LOG_OOM_KINDS = (CUDA_OOM, STARTUP_MEMORY)
# What the API says of a discovered pod's engine container.
KUBERNETES_EVENT_KINDS = (CONTAINER_OOM_KILLED, PROBE_FAILURE, PROBE_KILL)
# Out of memory, whoever noticed: the engine's log, or the kernel on its cgroup (as the cgroup or the pod says).
TARGET_OOM_KINDS = (*LOG_OOM_KINDS, CGROUP_OOM_KILL, CONTAINER_OOM_KILLED)
# The kernel's OOM killer on the engine's processes, as its cgroup or its pod says (host memory, not GPU).
TARGET_KILL_KINDS = (CGROUP_OOM_KILL, CONTAINER_OOM_KILLED)
# Every kind a target can have.
TARGET_EVENT_KINDS = (*LOG_EVENT_KINDS, CGROUP_OOM_KILL, *KUBERNETES_EVENT_KINDS)
HOST_EVENT_KINDS = (KERNEL_OOM_KILL,)


def kind_regex(kinds: Iterable[str]) -> str:
    """A PromQL matcher value for these kinds: `kind=~"<this>"`."""
    return "|".join(kinds)


def kind_matcher(kinds: str | Iterable[str]) -> str:
    """The PromQL label matcher for these kinds: `kind="a"` for one, `kind=~"a|b"` for more."""
    names = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    return f'kind="{names[0]}"' if len(names) == 1 else f'kind=~"{kind_regex(names)}"'
