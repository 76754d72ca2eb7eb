"""Each engine's table of families read (its reader's `families_table`, printed in docs/metrics.md) names every
family its reader extracts: the table is written by hand beside the reader's constants and its `families`, and
this keeps them in step (a family read and not in the table is a figure the docs do not explain)."""

from __future__ import annotations

import re

import pytest

from oomguard.exporter.engines import ENGINES
from oomguard.exporter.exposition import METRICS

# A family as the table writes it: in backticks, alone or with a label matcher (`name{label="value"}`).
NAMED = re.compile(r"`([a-zA-Z_:][a-zA-Z0-9_:]*)(?:`|\{)")


@pytest.mark.parametrize("engine", list(ENGINES))
def test_every_family_read_is_in_the_engines_table(engine: str) -> None:
    plugin = ENGINES[engine]
    named = set(NAMED.findall(" ".join(row.families for row in plugin.reader.families_table)))
    missing = sorted(set(plugin.reader.families) - named)
    assert not missing, f"{engine}: families read but not in its families_table (docs/metrics.md): {missing}"


# An oomguard metric as the table writes it: whole, or after the row's first as `..._rest` (the engine's figures).
METRIC = re.compile(r"`(oomguard_\w+|\.\.\._\w+)")


@pytest.mark.parametrize("engine", list(ENGINES))
def test_every_metric_in_the_engines_table_is_exported(engine: str) -> None:
    """A row names the metric by hand: a figure renamed in model.ENGINE_FIGURES leaves no stale row behind."""
    exported = {spec.sample_name for spec in METRICS}
    named = {
        name.replace("..._", "oomguard_engine_", 1)
        for row in ENGINES[engine].reader.families_table
        for name in METRIC.findall(row.metrics)
    }
    assert named and not sorted(named - exported)
