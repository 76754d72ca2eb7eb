"""What an engine plugin is: a reader of its /metrics, its log lines, its simulator, its table of families.

An engine lives in one package, `engines/<name>/`, whose `PLUGIN` is listed in
`engines/__init__.py`. Nothing else in oomguard names an engine.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import yaml

from oomguard.engines.cmdline import Matcher, SettingsParser
from oomguard.model import EngineReading
from oomguard.promtext import Sample

if TYPE_CHECKING:
    import aiohttp

# Fetches the engine's reservation (its share of each GPU's total memory) where its /metrics does not carry it:
# (session, base url, timeout in seconds) -> the ratio, or None when the engine does not publish it. Raises
# ReservationError (or aiohttp's and asyncio's errors) on a failure, to be tried again later.
ReservationFetcher = Callable[["aiohttp.ClientSession", str, float], Awaitable[float | None]]


class ReservationError(Exception):
    """The engine's reservation could not be fetched this time."""


# Fetches the engine's KV cache use on each scrape, where its /metrics does not carry it (llama.cpp's /slots):
# (session, base url, timeout in seconds, body cap in bytes) -> the ratio, or None when the engine does not publish
# it (the endpoint off, a version without the fields). Raises KvUsageError (or aiohttp's and asyncio's errors).
KvUsageFetcher = Callable[["aiohttp.ClientSession", str, float, int], Awaitable[float | None]]


class KvUsageError(Exception):
    """The engine's KV cache use could not be read this time: the scrape goes on without it."""


class EngineReader(Protocol):
    """Turns the families extracted from one /metrics body into the engine's reading."""

    metrics_path: ClassVar[str]
    health_path: ClassVar[str]
    families: ClassVar[frozenset[str]]  # the only families extracted from the body

    def read(self, samples: dict[str, list[Sample]]) -> EngineReading:
        """Interpret the extracted families; raise ExpositionError when the body is not this engine's."""
        ...


@dataclass(frozen=True, slots=True)
class FamilyRow:
    """One row of the "Engine families read" table of docs/metrics.md."""

    metrics: str  # the oomguard metric(s), as written in the table
    families: str  # the engine's families they come from


@dataclass(frozen=True, slots=True)
class EnginePlugin:
    name: str  # the config's `engine:`
    title: str  # as people write it: "vLLM"
    reader: type[EngineReader]
    package: str  # the plugin's package, where its patterns.yaml lives
    # Lines of a traceback after the engine's own prefix (vLLM: "(EngineCore pid=N) ERROR ... ] "):
    # they keep an open incident open. A regex matched at the start of a line, or "" for none.
    log_line_prefix: str
    simulator: str | None  # module run as `python -m` to simulate the engine, None when there is none
    families_table: tuple[FamilyRow, ...]
    aggregation_note: str  # how the engine's rank labels are aggregated away
    # Called by the scraper once per engine life (engines/<name>/settings.py), None when /metrics says it all.
    reservation: ReservationFetcher | None = None
    # Called by the scraper on each scrape, beside /metrics, None when /metrics has the KV cache use.
    kv_usage: KvUsageFetcher | None = None
    # Its local process (sources/local/): which command lines are this engine (engines/<name>/cmdline.py), the
    # settings read from one (None: none on its command line), the flags naming its port, the environment variable
    # naming it, and its port without either, and the Python distributions (any build of it) whose installed
    # version selects its defaults.
    matches: Matcher | None = None
    settings: SettingsParser | None = None
    port_flags: tuple[str, ...] = ("--port",)
    port_env: str | None = None
    default_port: int | None = None
    distributions: tuple[str, ...] = ()

    def log_patterns(self) -> list[dict[str, Any]]:
        """The engine's own log patterns (entries of kind and regex), from its patterns.yaml."""
        text = resources.files(self.package).joinpath("patterns.yaml").read_text("utf-8")
        return list(yaml.safe_load(text) or [])


def total(samples: Iterable[Sample]) -> float | None:
    values = [s.value for s in samples]
    return sum(values) if values else None


def mean(samples: Iterable[Sample]) -> float | None:
    values = [s.value for s in samples]
    return sum(values) / len(values) if values else None
