"""Helpers shared by the tests: paths, real vLLM bodies, exposition reading, promtool, waits, a clock to set."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from prometheus_client.parser import text_string_to_metric_families

from oomguard.common.promtext import FamilyExtractor
from oomguard.exporter.engines import ENGINES
from oomguard.exporter.events.catalogue import load_catalogue
from oomguard.exporter.events.detector import IncidentDetector
from oomguard.exporter.model import EngineReading

if TYPE_CHECKING:
    from oomguard.exporter.events.runner import EventRunner

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
    """The value of one series of a Prometheus text body (KeyError when absent): the tests' one reader of
    exposition, for the exporter's answers and the real engines' bodies alike."""
    return samples(text)[(name, tuple(sorted((k, v) for k, v in labels.items() if v)))]


def values(text: str, name: str) -> list[float]:
    """The values of every series of metric `name`, in the body's order."""
    return [s.value for family in text_string_to_metric_families(text) for s in family.samples if s.name == name]


def promtool_check_metrics(promtool: str, exposition: bytes) -> str:
    """Run `promtool check metrics`; returns its output (problems are printed there)."""
    result = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, timeout=30)
    output = (result.stdout + result.stderr).decode()
    return output + ("" if result.returncode == 0 else f"\n(exit {result.returncode})")


def engine_reading(engine: str, body: str) -> EngineReading:
    """A /metrics body as the engine's reader reads it: its families extracted, then read."""
    reader = ENGINES[engine].reader()
    return reader.read(FamilyExtractor(reader.families).extract(body))


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


def engine_detector(engine: str) -> IncidentDetector:
    """The incident detector a target of this engine gets: the engine's catalogue and its log line prefix."""
    return IncidentDetector(load_catalogue(engine), grammar=ENGINES[engine].log_grammar)


def log_kinds(engine: str, lines: list[str]) -> list[str]:
    """The kinds of the incidents these lines make for this engine, once their quiet spell is over."""
    detector = engine_detector(engine)
    for line in lines:
        detector.feed(line, 0.0)
    return [e.kind for e in detector.tick(60.0)]


class Clock:
    """A clock the test sets: what the code under test is given as its monotonic clock answers `now`."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def settle(runner: EventRunner, clock: Clock) -> None:
    """Polled, then past the quiet time (10 s on `clock`) and polled again: open incidents are closed and counted."""
    runner.poll()
    clock.now += 10
    runner.poll()


def append_lines(path: Path, lines: list[str]) -> None:
    """The lines appended to the file, each ended by a newline, as a writer of a log appends them."""
    with path.open("a") as f:
        f.write("".join(line + "\n" for line in lines))
