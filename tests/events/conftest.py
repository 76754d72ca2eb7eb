"""Fixtures of the event tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from kmsg_stand_in import OneRecordPerRead

from oomguard.exporter.events import kernel


@pytest.fixture
def kmsg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A regular file standing in for /dev/kmsg: records appended to it are read one by one."""
    monkeypatch.setattr(kernel, "os", OneRecordPerRead())
    return tmp_path / "kmsg"
