"""Pick a few families out of a Prometheus text exposition, fast.

A vLLM /metrics body is ~50 KB, mostly histograms we never read. The full parser
of prometheus_client is pure Python and walks every line; here one regular
expression anchored at line starts jumps straight to the samples we want.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\.)*)"\s*(?:,|$)')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE = re.compile(r"\\[\\\"n]")


class ExpositionError(ValueError):
    """A body that is not the Prometheus text format where we read it."""


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


class FamilyExtractor:
    """Compiled once per set of names; `extract` is then called per body."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)
        alternation = "|".join(re.escape(n) for n in sorted(self.names, key=len, reverse=True))
        # name, optional {labels}, value; a timestamp may follow and is ignored.
        self._line = re.compile(rf"^({alternation})(?:\{{([^\n]*)\}})?[ \t]+(\S+)(?:[ \t]+\S+)?[ \t]*\r?$", re.M)

    def extract(self, body: str) -> dict[str, list[Sample]]:
        found: dict[str, list[Sample]] = {}
        for match in self._line.finditer(body):
            name, label_text, value_text = match.groups()
            found.setdefault(name, []).append(
                Sample(name, _parse_labels(label_text) if label_text else {}, _parse_value(value_text, name))
            )
        return found


def _parse_value(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ExpositionError(f"sample {name} has a value that is not a number: {text[:40]!r}") from None
    return value


def _parse_labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    text = text.rstrip().rstrip(",")
    while pos < len(text):
        match = _LABEL.match(text, pos)
        if match is None:
            raise ExpositionError(f"malformed labels: {text[pos : pos + 60]!r}")
        key, raw = match.groups()
        labels[key] = _ESCAPE.sub(lambda m: _ESCAPES[m.group(0)], raw) if "\\" in raw else raw
        pos = match.end()
    return labels


def finite(value: float | None) -> float | None:
    """None for NaN/Inf: we never export NaN for a value we do not have."""
    if value is None or math.isnan(value) or math.isinf(value):
        return None
    return value
