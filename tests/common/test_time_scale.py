"""The simulation's clock: a duration judged on it, the inverse for one measured, a pace, and what it refuses."""

from __future__ import annotations

import argparse
import dataclasses
import math

import pytest

from oomguard.common.time_scale import REAL, TimeScale, factor_argument


def test_a_compressed_clock_judges_a_scenarios_durations_in_fewer_real_seconds() -> None:
    fast = TimeScale(10)
    assert fast.compressed and not REAL.compressed
    assert fast.real(120.0) == 12.0  # a two-minute window lasts 12 real seconds at 10x
    assert fast.simulated(12.0) == 120.0  # and 12 real seconds measured are two minutes of the scenario
    for seconds in (0.5, 7.0, 900.0):
        assert fast.simulated(fast.real(seconds)) == pytest.approx(seconds)


def test_a_floor_holds_on_a_compressed_clock_only() -> None:
    # A quiet spell of 5 s at 10x would be 0.5 s, one read of the sources: its floor keeps it at two reads.
    assert TimeScale(10).real(5.0, floor=1.0) == 1.0
    assert TimeScale(10).real(60.0, floor=1.0) == 6.0  # above its floor: scaled as it is
    # On life's clock a deployment's own setting stands, even under the floor a compressed clock would keep.
    assert REAL.real(0.5, floor=1.0) == 0.5
    assert TimeScale(1.0).real(5.0, floor=30.0) == 5.0


def test_a_pace_per_simulated_minute_is_the_slope_a_real_clock_measures() -> None:
    """A leak rising `pace` per simulated minute, stamped with real time (as Prometheus and the trend's samples
    are), rises `rate(pace)` per real minute: a slope threshold judged on real stamps must be scaled so."""
    clock, pace = TimeScale(30), 0.0006  # 0.06 % of the GPU per simulated minute
    real_minutes = 2.0
    risen = pace * clock.simulated(real_minutes * 60) / 60
    assert risen / real_minutes == pytest.approx(clock.rate(pace))
    assert REAL.rate(pace) == pace


@pytest.mark.parametrize("factor", [0, -30, math.nan, math.inf, True, "10", None])
def test_a_scale_that_is_no_clock_is_refused(factor: object) -> None:
    with pytest.raises(ValueError, match="a number above 0"):
        TimeScale(factor)  # type: ignore[arg-type]


def test_one_clock_is_a_value_handed_around_unchanged() -> None:
    clock = TimeScale(30)
    with pytest.raises(dataclasses.FrozenInstanceError):
        clock.factor = 1  # type: ignore[misc]
    assert clock == TimeScale(30.0) and hash(clock) == hash(TimeScale(30.0))
    assert REAL == TimeScale() == TimeScale(1)


@pytest.mark.parametrize("text", ["0", "-30", "inf", "nan", "-inf", "fast", ""])
def test_a_flag_that_gives_no_clock_is_refused_as_argparse_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"a number above 0 is needed, .* \(got "):
        factor_argument(text)


@pytest.mark.parametrize(("text", "factor"), [("30", 30.0), ("0.5", 0.5), ("1e3", 1000.0)])
def test_a_flag_that_gives_a_clock_is_its_factor(text: str, factor: float) -> None:
    assert factor_argument(text) == factor and isinstance(factor_argument(text), float)
