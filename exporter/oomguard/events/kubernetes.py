"""What the Kubernetes API says of a discovered pod's engine container, as events of its target.

Fed by the discovery (sources/kubernetes/discovery.py) on the event loop, taken by the runner's poll
in its thread: a container that ended OOMKilled (or with exit code 137), and the pod's Events of a
failed liveness or startup probe (`Unhealthy`) and of the kill that follows (`Killing`). Its state is
the last termination counted, so that a restarted exporter does not count it again.
"""

from __future__ import annotations

import threading
from typing import Any

from oomguard.events.kinds import KUBERNETES_EVENT_KINDS
from oomguard.events.source import POSITIONS, source_health
from oomguard.model import Event, EventSourceHealth, ReadStats


class PodApiEvents:
    kinds: tuple[str, ...] = KUBERNETES_EVENT_KINDS

    def __init__(self, target: str, name: str, saved: dict[str, Any] | None = None) -> None:
        self.target = target
        self.name = name  # "k8s-api:NAMESPACE/POD"
        self.stats = ReadStats()  # lines_read: API events and terminations received
        last = saved.get("last_termination") if isinstance(saved, dict) else None
        self.last_termination: str | None = last if isinstance(last, str) else None  # a wrong type: none counted yet
        self._pending: list[Event] = []
        self._lock = threading.Lock()

    def push(self, event: Event) -> None:
        with self._lock:
            self._pending.append(event)
            self.stats.lines_read += 1

    def poll(self, now: float) -> list[Event]:
        with self._lock:
            events, self._pending = self._pending, []
        return events

    def health(self) -> EventSourceHealth:
        return source_health(self, self.stats)

    def state(self) -> dict[str, Any]:
        return {POSITIONS: {"last_termination": self.last_termination}} if self.last_termination else {}

    def close(self) -> list[Event]:
        return self.poll(0.0)
