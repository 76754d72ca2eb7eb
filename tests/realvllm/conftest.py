"""The tiny model is built once per test session and shared by every real-vLLM test."""

from __future__ import annotations

import os
from pathlib import Path

# harness.py sits beside this file; found this way under any pytest import mode.
import harness
import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        harness.vllm_python()
    except RuntimeError as e:
        # `make test` installs vLLM and sets OOMGUARD_REQUIRE_REALVLLM: there a missing venv is a failure.
        if os.environ.get("OOMGUARD_REQUIRE_REALVLLM"):
            pytest.fail(str(e))
        pytest.skip(f"real vLLM tests skipped: {e}")
    return harness.ensure_tiny_model(tmp_path_factory.mktemp("model"))
