"""The clock a history was recorded on: real life, or a drill's compressed one.

A drill (`oomguard drill`) replays a scenario `scale` times faster than life: `scale` simulated seconds pass
per real second, the second Prometheus stamps its samples with. Diagnose reads those timestamps as they are
(the window, `--at`, evidence times stay Unix times), judges every duration against its threshold turned into
real seconds (`real`), and reports durations in the scenario's own time (`simulated`): the startup, the length
and pace of a climb, the timeline's T+N. Settings given in seconds (the probe delay) are simulated seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from oomguard.diagnose.query import DiagnoseError


@dataclass(frozen=True)
class Clock:
    scale: float = 1.0  # simulated seconds per real second; 1: real life

    def __post_init__(self) -> None:
        if not (isinstance(self.scale, int | float) and math.isfinite(self.scale) and self.scale > 0):
            raise DiagnoseError(
                f"--time-scale {self.scale!r}: give the drill's time scale, a number above 0 (1 outside a drill)"
            )

    @property
    def compressed(self) -> bool:
        return self.scale != 1

    def real(self, simulated_seconds: float) -> float:
        """A duration of the scenario, in the seconds Prometheus' timestamps count."""
        return simulated_seconds / self.scale

    def simulated(self, real_seconds: float) -> float:
        """A duration between Prometheus' timestamps (or measured by the exporter), in the scenario's seconds."""
        return real_seconds * self.scale


REAL = Clock()
