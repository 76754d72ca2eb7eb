"""A simulated engine's command line (simulate/engine_args.py) and the clock it runs its scenario on."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from oomguard.common.time_scale import TimeScale
from oomguard.simulate.engine_args import simulator_parser
from oomguard.simulate.serve import SimulatedEngine

BAD = ["0", "-30", "inf", "nan", "fast"]
PER_SECOND = "simulated seconds per real second"


@pytest.mark.parametrize("bad", BAD)
def test_a_time_scale_that_is_no_clock_is_refused_by_argparse(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused where it is read, naming the flag: not a life whose every sleep is infinite, NaN or negative."""
    with pytest.raises(SystemExit) as exited:
        simulator_parser("sim").parse_args(["--scenario", "incident", "--port", "1", "--time-scale", bad])
    assert exited.value.code == 2
    said = capsys.readouterr().err.splitlines()[-1]
    assert said.endswith(f"error: argument --time-scale: a number above 0 is needed, {PER_SECOND} (got {bad!r})")


def test_a_simulator_started_with_no_clock_exits_2_with_one_line() -> None:
    """As the supervisor starts it, a child process: argparse's usage and its line, no traceback."""
    command = [sys.executable, "-m", "oomguard.simulate.engines.vllm", "--scenario", "incident", "--port", "1",
               "--time-scale", "0"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "argument --time-scale: a number above 0 is needed" in result.stderr.splitlines()[-1]


def test_the_engines_clock_is_its_time_scale() -> None:
    args = simulator_parser("sim").parse_args(["--scenario", "incident", "--port", "1", "--time-scale", "30"])
    assert args.time_scale == 30.0  # a float, as the orchestrator passed it
    engine = SimulatedEngine(args)
    assert engine.time_scale == TimeScale(30.0)
    engine.launched = time.time() - 2.0  # two real seconds in: a simulated minute
    assert engine.now() == pytest.approx(60.0, abs=1.0)
    # Without the flag: life's clock.
    default = SimulatedEngine(simulator_parser("sim").parse_args(["--scenario", "incident", "--port", "1"]))
    assert default.time_scale == TimeScale(1.0) and not default.time_scale.compressed


async def test_a_simulated_sleep_lasts_its_real_share() -> None:
    args = simulator_parser("sim").parse_args(["--scenario", "incident", "--port", "1", "--time-scale", "100"])
    engine = SimulatedEngine(args)
    began = time.monotonic()
    await engine.sleep(20.0)  # 20 simulated seconds at 100x: 0.2 real ones
    took = time.monotonic() - began
    assert 0.15 <= took < 1.5, took
    began = time.monotonic()
    await engine.sleep(-5.0)  # a deadline already past: no wait
    assert time.monotonic() - began < 0.1
