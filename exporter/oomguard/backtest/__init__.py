"""`oomguard backtest`: would the shipped alerts have paged before the OOMs a team already had, how early, and how
often for nothing (docs/backtest.md).

A history of GPU memory (and, where there are any, the engines' figures) is read from a file or a Prometheus
(`files.py`, `source.py`), replayed through the exporter's own join and trend classes at the history's own
timestamps (`replay.py`), written as the series the rules read into a throwaway TSDB and evaluated there by a
real Prometheus with the bundle's own rules (`tsdb.py`, `rules.py`); `report.py` says, per OOM, what fired and its
lead, and the pages and tickets outside any incident; `sweep.py` tries the memory thresholds over a small grid.
"""

from __future__ import annotations


class BacktestError(Exception):
    """The backtest could not run; the message names the problem and the fix (exit status 2)."""
