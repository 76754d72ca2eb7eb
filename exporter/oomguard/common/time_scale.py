"""`TimeScale`: the clock a scenario runs on, `factor` times faster than life (1: life itself).

`serve --simulate` and the drill run a scenario `factor` times faster: `factor` simulated seconds pass per real
second, the second the exporter's clock and Prometheus' timestamps count. What is *judged* runs on that clock: a
threshold, a window or a back-off written in the scenario's seconds lasts `real(seconds)` real ones, and a pace
written per simulated second is `rate(pace)` per real one. What is *measured* (a startup, a time to full, the
length of a climb) is in real seconds, and `simulated(seconds)` says it in the scenario's.

The one place that knows how a duration is scaled: the runtime builds one from the configuration and hands it to
every part that judges a duration (the scrapers, the trend's and the events' settings, the status page's
sparkline); the bundle renders its rules on the one of its configuration; diagnose reads a history on the one it
was recorded on. A leaf: it imports nothing of oomguard's.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TimeScale:
    factor: float = 1.0  # simulated seconds per real second; 1: real life

    def __post_init__(self) -> None:
        factor = self.factor
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not math.isfinite(factor) or factor <= 0:
            raise ValueError(f"a time scale is a number above 0, simulated seconds per real second (got {factor!r})")

    @property
    def compressed(self) -> bool:
        """Faster (or slower) than life: durations judged on it differ from the ones written."""
        return self.factor != 1

    def real(self, simulated_seconds: float, floor: float | None = None) -> float:
        """A duration of the scenario (a threshold, a window, a back-off), in real seconds; on a compressed
        clock never under `floor` real seconds (a window must still hold several samples, a back-off several
        reads: a real process's own costs do not shrink with the scenario). On life's clock it is the duration
        as written, floor or not: a deployment's settings are its own."""
        judged = simulated_seconds / self.factor
        return max(floor, judged) if floor is not None and self.compressed else judged

    def simulated(self, real_seconds: float) -> float:
        """A duration measured on the real clock (between two timestamps), in the scenario's seconds."""
        return real_seconds * self.factor

    def rate(self, per_simulated: float) -> float:
        """A pace written per unit of the scenario's time (a slope per simulated minute), per the same unit of
        real time: a leak of 1 % per simulated minute rises `factor` % per real minute."""
        return per_simulated * self.factor


REAL = TimeScale()  # life's clock: every duration as written


def factor_argument(text: str) -> float:
    """A `--time-scale` flag's value, as argparse's `type`: a factor the clock takes (the drill's, a simulated
    engine's), else argparse's own one-line error naming the flag and what to give, before anything starts."""
    try:
        return TimeScale(float(text)).factor
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a number above 0 is needed, simulated seconds per real second (got {text!r})"
        ) from None


__all__ = ["REAL", "TimeScale", "factor_argument"]
