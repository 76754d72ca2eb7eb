"""The status view of a few snapshots (view_fixtures.py) against the views the exposition's text gave before the
view was built from the snapshot (golden_views/, written by that path: snapshot -> /metrics text -> parse -> view),
so that `/`, `/status.json` and `oomguard top` show what they showed: a host's GPUs with a MIG instance, its
engines' OOMs and restarts, a cluster's pods and the names they chose with control characters, markup and quotes,
a NaN figure, a run whose GPU source did not run, the cut to the fullest 64 and the order of ties.

Rewrite the files after an intended change of the view with: pytest tests/status/test_view_golden.py --update-golden
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from status import view_fixtures

from oomguard.exporter.status.view import build

GOLDEN = Path(__file__).parent / "golden_views"


@pytest.mark.parametrize("case", sorted(view_fixtures.CASES))
def test_the_view_of_a_snapshot_is_the_one_its_exposition_gave(case: str, update_golden: bool) -> None:
    view = build(
        view_fixtures.CASES[case](), history=view_fixtures.history(), thresholds=view_fixtures.thresholds_of(case)
    )
    document = json.dumps(view.to_json(), indent=1) + "\n"
    golden = GOLDEN / f"{case}.json"
    if update_golden:
        golden.write_text(document)
    assert json.loads(document) == json.loads(golden.read_text()), f"the view of {case} changed: diff it with {golden}"
