"""A container's probes -> the time before the kubelet may first kill it, for a start that is slow.

The startup probe runs first, and the liveness probe only once it has passed: with one, the startup
probe's budget is the time a load has. Each budget is initialDelaySeconds + failureThreshold x
periodSeconds, with Kubernetes' defaults where a field is absent (0, 3, 10).
"""

from __future__ import annotations

from typing import Any

DEFAULT_PERIOD_SECONDS = 10
DEFAULT_FAILURE_THRESHOLD = 3


def grace_seconds(container: dict[str, Any]) -> float | None:
    """Seconds from the container's start to the first kill a failing probe can cause; None without one."""
    probe = container.get("startupProbe")
    if probe is None:
        probe = container.get("livenessProbe")
    if probe is None:
        return None
    delay = probe.get("initialDelaySeconds") or 0
    threshold = probe.get("failureThreshold") or DEFAULT_FAILURE_THRESHOLD
    period = probe.get("periodSeconds") or DEFAULT_PERIOD_SECONDS
    return float(delay + threshold * period)
