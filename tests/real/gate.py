"""The one gate of the real-engine tests: they run where the engine is installed. `make test` installs each and
sets its variable (OOMGUARD_REQUIRE_REALVLLM, OOMGUARD_REQUIRE_REALLAMACPP): there a missing engine fails them;
elsewhere they are skipped, the reason printed."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest


def require(variable: str, installed: Callable[[], object], what: str) -> None:
    """Call `installed` (raising RuntimeError naming what is missing and how to install it)."""
    try:
        installed()
    except RuntimeError as e:
        if os.environ.get(variable):
            pytest.fail(str(e))
        pytest.skip(f"{what} tests skipped: {e}")
