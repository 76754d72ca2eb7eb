"""A Pod object -> the target it makes: its address, its engine container, what its status says.

The engine container is the one declaring `port` (by name or number); a number no container declares
is taken as the first container's (ports are informational in Kubernetes). A pod without an IP yet, or
finished (Succeeded, Failed), makes no target.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from oomguard.sources.kubernetes.probes import grace_seconds

OOM_EXIT_CODE = 137  # SIGKILL: what an OOM kill leaves where the runtime does not say OOMKilled


@dataclass(frozen=True, slots=True)
class Termination:
    """The engine container's last end (`lastState.terminated`)."""

    container_id: str
    reason: str
    exit_code: int | None
    finished_at: float | None  # Unix time

    @property
    def oom_killed(self) -> bool:
        return self.reason == "OOMKilled" or self.exit_code == OOM_EXIT_CODE

    @property
    def key(self) -> str:
        """Tells one end from the next (a new container ID, or a new finish time)."""
        return f"{self.container_id}@{self.finished_at}"


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

    @property
    def target(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def url(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{self.port}"


def timestamp(value: str | None) -> float | None:
    """An API time (RFC 3339, `2026-01-02T03:04:05Z`) as Unix time."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _engine_container(containers: list[dict[str, Any]], port: str | int) -> tuple[dict[str, Any], int] | None:
    for container in containers:
        for declared in container.get("ports") or []:
            if declared.get("name") == port or declared.get("containerPort") == port:
                return container, int(declared["containerPort"])
    if isinstance(port, int) and containers:
        return containers[0], port
    return None


def pod_target(pod: dict[str, Any], port: str | int) -> PodTarget | None:
    """The target `pod` makes; None when it has no engine container, no IP yet, or has finished."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    found = _engine_container(spec.get("containers") or [], port)
    ip = status.get("podIP") or ""
    if found is None or not ip:
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
    )


def _bare_id(container_id: str) -> str:
    """`containerd://abc` -> `abc`, as the cgroup path names it."""
    return container_id.rpartition("://")[2]
