"""A Pod object -> the target it makes: its address, its engine container, what its status says.

The engine container is the one declaring `port` (by name or number); a number no container declares
is taken as the first container's (ports are informational in Kubernetes). A pod without an IP yet, or
finished (Succeeded, Failed), makes no target.

The engine's settings come from its container's `command` and `args` (and its `env` values), as a local
engine's come from its command line: among them the reservation it was told, which the joins use while the
engine loads and reports none (join.py). No `command`: the image's entrypoint runs the `args`. A shell's
`-c` script is split as the shell would split a plain command line. `valueFrom` variables are not read.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import Any

from oomguard.exporter.engines import ENGINES
from oomguard.exporter.engines.cmdline import Cmdline, Settings, program
from oomguard.exporter.events.kubernetes import timestamp
from oomguard.exporter.model import PodRef, Termination
from oomguard.exporter.sources.kubernetes.groups import PodGroup, group_of
from oomguard.exporter.sources.kubernetes.probes import grace_seconds

_SHELLS = ("sh", "bash", "dash", "ash", "zsh")


@dataclass(frozen=True, slots=True)
class PodTarget:
    namespace: str
    name: str
    uid: str
    ip: str
    port: int
    container: str  # the engine container's name
    container_id: str  # its current container's ID, without the runtime prefix ("" before it runs)
    restart_count: int
    last_termination: Termination | None
    probe_grace_seconds: float | None
    node: str = ""  # spec.nodeName: whose GPUs are its
    # The engine container's settings from its command, args and env (`container_settings`), by name.
    settings: Settings = field(default_factory=dict)
    group: PodGroup | None = None  # an engine spanning pods (groups.py): its group; None for an engine of its own

    @property
    def worker(self) -> bool:
        """A worker of an engine spanning pods: it serves nothing, its GPUs and its log count for its leader."""
        return self.group is not None and not self.group.leader

    @property
    def target(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def ref(self) -> PodRef:
        return PodRef(self.namespace, self.name, self.container, self.probe_grace_seconds, self.node)

    @property
    def url(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{self.port}"


def _engine_container(containers: list[dict[str, Any]], port: str | int) -> tuple[dict[str, Any], int] | None:
    for container in containers:
        for declared in container.get("ports") or []:
            if declared.get("name") == port or declared.get("containerPort") == port:
                return container, int(declared["containerPort"])
    if isinstance(port, int) and containers:
        return containers[0], port
    return None


def container_argv(container: dict[str, Any]) -> Cmdline:
    """The container's command line as its process gets it: its command and args (a stand-in program name for the
    image's entrypoint when it has no command); a shell's `-c` script split; () when that script cannot be."""
    command = [str(a) for a in container.get("command") or []]
    args = [str(a) for a in container.get("args") or []]
    argv = (*(command or ["entrypoint"]), *args)
    name, rest = program(argv)
    if os.path.basename(name) in _SHELLS and rest[:1] == ("-c",):
        try:
            return tuple(shlex.split(rest[1])) if len(rest) > 1 else ()
        except ValueError:
            return ()  # an unbalanced quote: no flags we can trust
    return argv


def container_settings(container: dict[str, Any], engine: str) -> Settings:
    """The engine's settings from its container spec (its version unknown: only the defaults of every version)."""
    plugin = ENGINES.get(engine)
    argv = container_argv(container)
    if plugin is None or plugin.settings is None or not argv:
        return {}
    env = {str(e["name"]): str(e["value"]) for e in container.get("env") or []
           if isinstance(e, dict) and "name" in e and "value" in e}  # fmt: skip
    return plugin.settings(argv, None, env)


def pod_target(pod: dict[str, Any], port: str | int, engine: str | None = None) -> PodTarget | None:
    """The target `pod` makes; None when it has no engine container, no IP yet, or has finished. `engine`: whose
    settings its container's command line gives (none without)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    group = group_of(pod)
    containers = spec.get("containers") or []
    ip = status.get("podIP") or ""
    if group is not None and not group.leader:
        # A worker serves nothing: its container is the one holding GPUs, and it needs no address.
        found = _gpu_container(containers)
    else:
        found = _engine_container(containers, port)
        if not ip:
            return None
    if found is None:
        return None
    container, number = found
    state = next((s for s in status.get("containerStatuses") or [] if s.get("name") == container.get("name")), {})
    ended = (state.get("lastState") or {}).get("terminated")
    last = None
    if ended:
        last = Termination(
            container_id=_bare_id(ended.get("containerID", "")),
            reason=ended.get("reason", ""),
            exit_code=ended.get("exitCode"),
            finished_at=timestamp(ended.get("finishedAt")),
        )
    return PodTarget(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        ip=ip,
        port=number,
        container=container.get("name", ""),
        container_id=_bare_id(state.get("containerID", "")),
        restart_count=int(state.get("restartCount") or 0),
        last_termination=last,
        probe_grace_seconds=grace_seconds(container),
        node=spec.get("nodeName") or "",
        settings=container_settings(container, engine) if engine else {},
        group=group,
    )


def _gpu_container(containers: list[dict[str, Any]]) -> tuple[dict[str, Any], int] | None:
    """A worker's container: the first that asks for an NVIDIA GPU, else the first (port 0: it serves nothing)."""
    for container in containers:
        resources = container.get("resources") or {}
        if any("nvidia.com/gpu" in (resources.get(kind) or {}) for kind in ("limits", "requests")):
            return container, 0
    return (containers[0], 0) if containers else None


def _bare_id(container_id: str) -> str:
    """`containerd://abc` -> `abc`, as the cgroup path names it."""
    return container_id.rpartition("://")[2]
