"""matplotlib is the `report` extra: the node agent installs without it, `diagnose --report` says what is missing."""

from __future__ import annotations

import sys
import tomllib

import pytest
from support import REPO

from oomguard.diagnose.report import MissingExtra, plot_png

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_matplotlib_is_an_extra_not_a_dependency() -> None:
    assert not [d for d in PROJECT["dependencies"] if d.lower().startswith("matplotlib")]
    assert [d for d in PROJECT["optional-dependencies"]["report"] if d.lower().startswith("matplotlib")]
    # The tests plot: the test extra has it too.
    assert [d for d in PROJECT["optional-dependencies"]["test"] if d.lower().startswith("matplotlib")]


def test_a_missing_matplotlib_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(MissingExtra, match=r"pip install 'oomguard\[report\]'"):
        plot_png(None)  # type: ignore[arg-type]
    # `diagnose --report` catches ValueError and prints it in one line (exit 2), not a traceback.
    assert issubclass(MissingExtra, ValueError)
