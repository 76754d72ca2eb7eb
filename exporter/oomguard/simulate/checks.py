"""The exporter's configuration read with the simulation's checks too: its `simulation:` scenario's name (one of
scenarios.py's, one that says its engine, or an old name). `serve`, `check-config`, the drill and the tests read a
configuration here; the exporter itself knows no scenario (exporter/config_loader.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from oomguard.exporter.config import SCENARIO, SCENARIO_ON_ENGINE, Config, PartChecks
from oomguard.exporter.config_loader import load_config as load_exporter_config
from oomguard.simulate.scenarios import check_scenario, on_engine

CHECKS: PartChecks = {SCENARIO: check_scenario, SCENARIO_ON_ENGINE: on_engine}


def load_config(
    path: Path | None, overrides: dict[str, Any] | None = None, origins: Mapping[str, str] | None = None
) -> Config:
    """exporter/config_loader.py's `load_config` with the simulation's checks."""
    return load_exporter_config(path, overrides, origins, checks=CHECKS)
