"""The clock a history was recorded on: real life, or a drill's compressed one (`common/time_scale.py`).

A drill (`oomguard drill`) replays a scenario `factor` times faster than life: `factor` simulated seconds pass
per real second, the second Prometheus stamps its samples with. Diagnose reads those timestamps as they are
(the window, `--at`, evidence times stay Unix times), judges every duration against its threshold turned into
real seconds (`TimeScale.real`), and reports durations in the scenario's own time (`TimeScale.simulated`): the
startup, the length and pace of a climb, the timeline's T+N. Settings given in seconds (the probe delay) are
simulated seconds.
"""

from __future__ import annotations

from oomguard.common.time_scale import REAL, TimeScale
from oomguard.diagnose.query import DiagnoseError


def clock_of(scale: float) -> TimeScale:
    """The clock of a history recorded `scale` times faster than life (`--time-scale`, or the bundle's); a scale
    that is no clock is refused saying what to give."""
    try:
        return TimeScale(scale)
    except ValueError:
        raise DiagnoseError(
            f"--time-scale {scale!r}: give the drill's time scale, a number above 0 (1 outside a drill)"
        ) from None


__all__ = ["REAL", "TimeScale", "clock_of"]
