"""What every engine reader produces: the engine's own view of memory and load."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar, Protocol

from oomguard.promtext import Sample


@dataclass(frozen=True, slots=True)
class ModelReading:
    """One served model, summed or averaged over the engine's data-parallel ranks."""

    model_name: str
    kv_cache_usage_ratio: float | None = None
    requests_waiting: float | None = None
    requests_running: float | None = None
    preemptions_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None


@dataclass(frozen=True, slots=True)
class EngineReading:
    models: tuple[ModelReading, ...]
    # The share of each GPU's total memory the engine is configured to take.
    memory_utilization_ratio: float | None = None
    kv_cache_blocks: float | None = None
    kv_cache_block_size_tokens: float | None = None
    kv_cache_memory_bytes: float | None = None
    process_start_time_seconds: float | None = None


class Engine(Protocol):
    name: ClassVar[str]
    metrics_path: ClassVar[str]
    health_path: ClassVar[str]
    families: ClassVar[frozenset[str]]

    def read(self, samples: dict[str, list[Sample]]) -> EngineReading:
        """Interpret the extracted families; raise ExpositionError when the body is not this engine's."""
        ...


def total(samples: Iterable[Sample]) -> float | None:
    values = [s.value for s in samples]
    return sum(values) if values else None


def mean(samples: Iterable[Sample]) -> float | None:
    values = [s.value for s in samples]
    return sum(values) / len(values) if values else None
