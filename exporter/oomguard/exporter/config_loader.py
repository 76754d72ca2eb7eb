"""The exporter's configuration file, read and checked whole: its shape (config.py), then each part's own section
with that part's knowledge (the engine plugins their names and simulators, the event catalogue its patterns). A part
outside the exporter adds its checks through `checks`: the simulation its scenarios' names (simulate/checks.py,
whose `load_config` is what `serve`, `check-config` and the drill read a configuration with).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from oomguard.exporter.config import ENGINE, PATTERN, SIMULATED_ENGINE, Config, PartChecks, parse_config
from oomguard.exporter.engines import check_engine, check_simulated_engine
from oomguard.exporter.events.catalogue import check_patterns

CHECKS: PartChecks = {
    ENGINE: check_engine,
    SIMULATED_ENGINE: check_simulated_engine,
    PATTERN: lambda entry: check_patterns([entry]),
}


def load_config(
    path: Path | None,
    overrides: dict[str, Any] | None = None,
    origins: Mapping[str, str] | None = None,
    *,
    checks: PartChecks | None = None,
) -> Config:
    """Read `path` (if any), apply `overrides` (dotted keys), validate everything; a ConfigError names the key
    and the fix, and for an override in `origins` (dotted key -> `$VARIABLE=value` or `--flag value`) what set it.
    `checks`: the other parts' checks, beside the exporter's own (without the simulation's, a `simulation:` section
    is checked for its shape only)."""
    return parse_config(path, overrides, checks={**CHECKS, **(checks or {})}, origins=origins)
