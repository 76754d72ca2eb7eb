"""`oomguard diagnose`: the postmortem's diagnostic order as one command.

memory trend -> engine log for OOMs -> concurrency/memory config -> probe timing vs startup,
from the exporter's own raw series, with a verdict, its evidence and the settings to change.
The drill calls `diagnose_prometheus`; the CLI calls `main`.
"""

from __future__ import annotations

from oomguard.diagnose.core import Diagnosis, diagnose_data, diagnose_exporter, diagnose_prometheus
from oomguard.diagnose.query import DiagnoseError

__all__ = ["DiagnoseError", "Diagnosis", "diagnose_data", "diagnose_exporter", "diagnose_prometheus"]
