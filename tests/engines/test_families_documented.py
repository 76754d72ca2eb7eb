"""Each engine's table of families read (its plugin's `families_table`, printed in docs/metrics.md) names every
family its reader extracts: the table is written by hand beside the reader's constants, and this keeps them in
step (a family read and not in the table is a figure the docs do not explain)."""

from __future__ import annotations

import re

import pytest

from oomguard.exporter.engines import ENGINES

# A family as the table writes it: in backticks, alone or with a label matcher (`name{label="value"}`).
NAMED = re.compile(r"`([a-zA-Z_:][a-zA-Z0-9_:]*)(?:`|\{)")


@pytest.mark.parametrize("engine", list(ENGINES))
def test_every_family_read_is_in_the_engines_table(engine: str) -> None:
    plugin = ENGINES[engine]
    named = set(NAMED.findall(" ".join(row.families for row in plugin.families_table)))
    missing = sorted(set(plugin.reader.families) - named)
    assert not missing, f"{engine}: families read but not in its families_table (docs/metrics.md): {missing}"
