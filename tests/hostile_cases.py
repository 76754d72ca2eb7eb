"""The table of a tests/hostile/ module: its cases, printed in docs/faults.md ("Hostile input") and kept equal to it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from support import REPO


@dataclass(frozen=True)
class Case:
    area: str
    case: str  # the hostile input
    defence: str  # what the exporter does now
    test: str  # the test of the module that sends, plants or writes it


def table(cases: Iterable[Case]) -> str:
    rows = ["| area | hostile input | defence | test |", "|---|---|---|---|"]
    rows += [f"| {c.area} | {c.case} | {c.defence} | `{c.test}` |" for c in cases]
    return "\n".join(rows) + "\n"


def assert_documented(cases: list[Case], module: Mapping[str, Any]) -> None:
    """docs/faults.md holds the module's table as it is, and each case names a test of the module."""
    assert table(cases) in (REPO / "docs" / "faults.md").read_text(), (
        f"docs/faults.md: paste table(CASES) of {module['__name__']} under its heading"
    )
    missing = [c.test for c in cases if not callable(module.get(c.test))]
    assert not missing, f"cases without their test: {missing}"
