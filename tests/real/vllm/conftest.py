"""The tiny model is built once per test session and shared by every real-vLLM test."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.real.gate import require
from tests.real.vllm import harness


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("OOMGUARD_REQUIRE_REALVLLM", harness.vllm_python, "real vLLM")
    return harness.ensure_tiny_model(tmp_path_factory.mktemp("model"))
