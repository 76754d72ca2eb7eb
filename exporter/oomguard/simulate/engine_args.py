"""The command line every simulated engine takes: what the supervisor (supervisor.py) passes to each simulator."""

from __future__ import annotations

import argparse
import os

from oomguard.common.time_scale import factor_argument
from oomguard.simulate.scenarios import GIB, SCENARIOS


def simulator_parser(description: str | None, told: tuple[str, str] | None = None) -> argparse.ArgumentParser:
    """`told`: the engine's reservation and tensor-parallel flags (its plugin's `knobs.told_flags`), or None."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="sim-llama-3-8b")
    parser.add_argument("--time-scale", type=factor_argument, default=1.0, help="simulated seconds per real second")
    # In the environment, not the command line: an orchestrator relaunches with the same command line.
    parser.add_argument(
        "--life", type=int, default=int(os.environ.get("OOMGUARD_SIM_LIFE", "0")),
        help="how many times the engine was restarted before [$OOMGUARD_SIM_LIFE]",
    )  # fmt: skip
    parser.add_argument("--gpu-total-bytes", type=int, default=80 * GIB)
    # The engine's own reservation and tensor-parallel flags, as an orchestrator passes them (Simulation.told_args):
    # taken and not used (the scenario's figures are served); there for the exporter, which reads them from the
    # command line (its settings, the reservation while the engine loads).
    if told is not None:
        reservation, tensor_parallel = told
        parser.add_argument(reservation, type=float, default=None)
        parser.add_argument(tensor_parallel, type=int, default=None)
    parser.add_argument(
        "--foreign", type=float, default=float(os.environ.get("OOMGUARD_SIM_FOREIGN", "0")),
        help="share of GPU 0 another process holds at this launch [$OOMGUARD_SIM_FOREIGN]",
    )  # fmt: skip
    return parser
