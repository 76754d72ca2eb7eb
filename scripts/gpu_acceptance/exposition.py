"""The exporter's /metrics, read as Prometheus reads it (prometheus_client's own parser)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


class Exposition:
    def __init__(self, text: str, seconds: float, at: float) -> None:
        """`seconds`: how long the request took; `at`: when it was answered (time.time())."""
        self.text = text
        self.seconds = seconds
        self.at = at
        self.samples = [
            Sample(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]

    def find(self, name: str, **labels: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]

    def value(self, name: str, **labels: str) -> float | None:
        """The one sample's value; None when absent (or when the labels do not pick exactly one)."""
        found = self.find(name, **labels)
        return found[0].value if len(found) == 1 else None


def scrape(base_url: str, timeout: float = 10.0) -> Exposition:
    start = time.monotonic()
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout) as answer:
        text = answer.read().decode("utf-8")
    return Exposition(text, time.monotonic() - start, time.time())


def answers(url: str, timeout: float = 2.0) -> bool:
    """Whether `url` answers 200 (the exporter's /-/healthy while it starts)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False
