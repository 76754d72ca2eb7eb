"""Shared fixtures: real vLLM bodies, the fake NVML, small HTTP targets, promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
VLLM_BODIES = FIXTURES / "vllm"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite golden files from the current output")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


def vllm_body(name: str) -> str:
    return (VLLM_BODIES / name).read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool not found: run `make test` (it installs Debian's prometheus package) "
            "or `apt-get install prometheus`"
        )
    return path


def promtool_check_metrics(promtool: str, exposition: bytes) -> str:
    """Run `promtool check metrics`; returns its output (problems are printed there)."""
    result = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, timeout=30)
    return (result.stdout + result.stderr).decode() + (
        "" if result.returncode == 0 else f"\n(exit {result.returncode})"
    )
