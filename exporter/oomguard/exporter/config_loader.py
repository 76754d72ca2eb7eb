"""The exporter's configuration file, read and checked whole: its shape (config.py), then each part's own section
with that part's knowledge (the engine plugins their names, the simulation its scenarios and simulated engines,
the event catalogue its patterns). Everything that reads a configuration reads it here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from oomguard.exporter.config import (
    ENGINE,
    PATTERN,
    SCENARIO,
    SCENARIO_ON_ENGINE,
    SIMULATED_ENGINE,
    Config,
    PartChecks,
    parse_config,
)
from oomguard.exporter.engines import check_engine, check_simulated_engine
from oomguard.exporter.events.catalogue import check_patterns
from oomguard.simulate.scenarios import check_scenario, on_engine

CHECKS: PartChecks = {
    ENGINE: check_engine,
    SIMULATED_ENGINE: check_simulated_engine,
    SCENARIO: check_scenario,
    SCENARIO_ON_ENGINE: on_engine,
    PATTERN: lambda entry: check_patterns([entry]),
}


def load_config(
    path: Path | None, overrides: dict[str, Any] | None = None, origins: Mapping[str, str] | None = None
) -> Config:
    """Read `path` (if any), apply `overrides` (dotted keys), validate everything; a ConfigError names the key
    and the fix, and for an override in `origins` (dotted key -> `$VARIABLE=value` or `--flag value`) what set it."""
    return parse_config(path, overrides, checks=CHECKS, origins=origins)
