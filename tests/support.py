"""Helpers shared by the tests: paths, real vLLM bodies, exposition reading, promtool."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
VLLM_BODIES = FIXTURES / "vllm"


def vllm_body(name: str) -> str:
    return (VLLM_BODIES / name).read_text(encoding="utf-8")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, keyed by name and sorted labels; an empty label is no label, as in
    Prometheus (a configured target's empty namespace, pod and container)."""
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if v))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, tuple(sorted((k, v) for k, v in labels.items() if v)))]


def promtool_check_metrics(promtool: str, exposition: bytes) -> str:
    """Run `promtool check metrics`; returns its output (problems are printed there)."""
    result = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, timeout=30)
    output = (result.stdout + result.stderr).decode()
    return output + ("" if result.returncode == 0 else f"\n(exit {result.returncode})")


def fixture_body(engine: str, name: str) -> str:
    """A /metrics body reproduced from an engine's source (tests/fixtures/<engine>/, each cites its source)."""
    return (FIXTURES / engine / name).read_text(encoding="utf-8")


async def until(condition: Callable[[], object], seconds: float, what: str) -> None:
    """Wait on a condition with a deadline (never a bare sleep): fail naming `what` when it does not hold in time."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {seconds}s: {what}")
        await asyncio.sleep(0.02)


def until_sync(condition: Callable[[], object], seconds: float, what: str) -> None:
    """`until` for a test without an event loop."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {seconds}s: {what}")
        time.sleep(0.01)
