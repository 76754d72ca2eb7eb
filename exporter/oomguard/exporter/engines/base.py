"""What an engine plugin is: a reader of its /metrics and its table of families, its log lines, its simulator.

An engine lives in one package, `engines/<name>/`, whose `PLUGIN` is listed in
`engines/__init__.py`. Nothing else in oomguard names an engine.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from types import UnionType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Union, get_args, get_origin, get_type_hints

import yaml

from oomguard.common.promtext import Sample
from oomguard.exporter.engines.cmdline import Matcher, SettingsParser
from oomguard.exporter.model import (
    ABOVE_ZERO_TO_ONE,
    AT_LEAST_ZERO,
    ENGINE_FIGURES,
    VALUE_REJECT_REASONS,
    EngineFigure,
    EngineReading,
    ModelReading,
)

if TYPE_CHECKING:
    from oomguard.common.engine_client import EngineClient

# Fetches the engine's reservation (its share of each GPU's total memory) where its /metrics does not carry it:
# (client, base url, timeout in seconds) -> the ratio, or None when the engine does not publish it. Raises
# ReservationError (or engine_client.py's and asyncio's errors) on a failure, to be tried again later.
ReservationFetcher = Callable[["EngineClient", str, float], Awaitable[float | None]]


class ReservationError(Exception):
    """The engine's reservation could not be fetched this time."""


# Fetches the engine's KV cache use on each scrape, where its /metrics does not carry it (llama.cpp's /slots):
# (client, base url, timeout in seconds, body cap in bytes) -> the ratio, or None when the engine does not publish
# it (the endpoint off, a version without the fields). Raises KvUsageError (or engine_client.py's and asyncio's errors).
KvUsageFetcher = Callable[["EngineClient", str, float, int], Awaitable[float | None]]


class KvUsageError(Exception):
    """The engine's KV cache use could not be read this time: the scrape goes on without it."""


@dataclass(frozen=True, slots=True)
class FamilyRow:
    """One row of the "Engine families read" table of docs/metrics.md."""

    metrics: str  # the oomguard metric(s), as written in the table
    families: str  # the engine's families they come from


class EngineReader(Protocol):
    """Turns the families extracted from one /metrics body into the engine's reading."""

    metrics_path: ClassVar[str]
    health_path: ClassVar[str]
    families: ClassVar[frozenset[str]]  # the only families extracted from the body
    # docs/metrics.md's "Engine families read" table for the engine: each oomguard metric and where it comes from.
    families_table: ClassVar[tuple[FamilyRow, ...]]

    def read(self, samples: dict[str, list[Sample]]) -> EngineReading:
        """Interpret the extracted families; raise ExpositionError when the body is not this engine's."""
        ...


@dataclass(frozen=True, slots=True)
class Knob:
    """One of an engine's settings, as oomguard_engine_setting names it, and the flag that sets it."""

    setting: str
    flag: str


@dataclass(frozen=True, slots=True)
class Knobs:
    """The settings the diagnosis names (its concurrency cap, its reservation, tuned together) and the flags a
    simulation tells the engine its reservation and its GPUs with. None: the engine has no such knob."""

    concurrency: Knob | None = None
    reservation: Knob | None = None
    tensor_parallel_flag: str | None = None

    @property
    def told_flags(self) -> tuple[str, str] | None:
        """The flags a simulation tells the engine its reservation and its tensor-parallel size with (simulate/),
        where it takes both; None where it does not."""
        if self.reservation is None or self.tensor_parallel_flag is None:
            return None
        return self.reservation.flag, self.tensor_parallel_flag


# The time of day in a record header, as events/records.py reads it (with `year`, `month` and `day` beside it).
HEADER_CLOCK = r"(?P<hour>\d\d):(?P<minute>\d\d):(?P<second>\d\d)(?:\.(?P<fraction>\d+))?"


@dataclass(frozen=True, slots=True)
class LogGrammar:
    """How an engine writes its own log records, so that only they count (events/records.py reads lines with it).

    A line is: an optional process tag (vLLM's "(EngineCore pid=7) "), then one of the engine's record headers (its
    time, level and logger or source file), then the message; or, without a header, a raw line its processes wrote
    to stderr (a Python traceback). Each regex is matched at the start of what is left of the line; `source`, a
    named group of a header, is what a pattern's `source:` is matched against."""

    tag: str = ""  # a process tag at the line's start ("" for none); its text keys the process's traceback
    headers: tuple[str, ...] = ()  # the record headers, tried in order; each ends where the message begins
    # Records that carry outside text (a request log, an access log, a request's span): never counted, whatever
    # they hold. Matched at the start of the message...
    outside: tuple[str, ...] = ()
    # ...or of the header's `source`.
    outside_sources: tuple[str, ...] = ()
    # What a record's message may hold before "Traceback (most recent call last):" (SGLang's "Scheduler hit an
    # exception: "): a traceback begins only at the start of a message or after this.
    traceback_lead: str = ""


@dataclass(frozen=True, slots=True)
class EnginePlugin:
    name: str  # the config's `engine:`
    title: str  # as people write it: "vLLM"
    reader: type[EngineReader]
    package: str  # the plugin's package, where its patterns.yaml lives
    log_grammar: LogGrammar  # how its own log records look: only they count (docs/security.md, "API users")
    simulator: str | None  # module run as `python -m` to simulate the engine, None when there is none
    aggregation_note: str  # how the engine's rank labels are aggregated away
    # Called by the scraper once per engine life (engines/<name>/settings.py), None when /metrics says it all.
    reservation: ReservationFetcher | None = None
    # Called by the scraper on each scrape, beside /metrics, None when /metrics has the KV cache use.
    kv_usage: KvUsageFetcher | None = None
    # The figures (model.FIGURES) every version of the engine gives once it serves: one missing from an up
    # target's reading is a name the reader no longer finds (an upgrade renamed it), and its alerts cannot fire.
    figures: tuple[str, ...] = ("requests_waiting", "requests_running")
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
    knobs: Knobs = Knobs()

    def log_patterns(self) -> list[dict[str, Any]]:
        """The engine's own log patterns (entries of kind, regex, and where they match), from its patterns.yaml."""
        text = resources.files(self.package).joinpath("patterns.yaml").read_text("utf-8")
        return list(yaml.safe_load(text) or [])


def total(samples: Iterable[Sample]) -> float | None:
    values = [s.value for s in samples]
    return sum(values) if values else None


def mean(samples: Iterable[Sample]) -> float | None:
    values = [s.value for s in samples]
    return sum(values) / len(values) if values else None


# -- the values checked, for every engine ----------------------------------------------------------------------
# Every family an engine reader keeps is a count, a size, a ratio, a setting or a timestamp: none is negative, and
# none is NaN or infinite. The readers see only the samples that pass; their readings then pass `_check_reading`,
# which holds each figure to its declared bounds (model.ENGINE_FIGURES: a ratio 0 to 1, a share of the GPUs above 0);
# the fields it checks are those each reading's class declares in its `CHECKED`, drawn from that table. The
# scraper calls `read_checked` for every engine (docs/engines.md, "Values checked").


def checked_fields(reading: type, *, own: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The reading's values checked here, as its class declares them (its `CHECKED`), in the model's order; `own`
    are number fields checked on their own. A number field declared neither way would go unchecked, and a declared
    name that is no number field of the reading (a figure of model.ENGINE_FIGURES whose `field` is misspelt or not
    added to the reading) would never be read: TypeError, naming them."""
    hints = get_type_hints(reading)
    names = {f.name for f in fields(reading)}
    numbers = {name for name in names if _is_number(hints[name])}
    declared = set(reading.CHECKED)
    undeclared = sorted(numbers - declared - set(own))
    missing = sorted(declared - names)
    unknown = sorted(declared & names - numbers)
    if undeclared or missing or unknown:
        raise TypeError(
            f"{reading.__name__}.CHECKED must name every number field the checks read (a figure of"
            f" model.ENGINE_FIGURES each): undeclared {undeclared}, no field of {reading.__name__} {missing},"
            f" not a number field {unknown}"
        )
    return tuple(f.name for f in fields(reading) if f.name in declared)


def _is_number(hint: object) -> bool:
    """float or int, alone or in a union (`float | None`, `Optional[float]`)."""
    if get_origin(hint) in (Union, UnionType):
        return any(_is_number(arg) for arg in get_args(hint))
    return hint in (float, int)


_DECLARED = {figure.field: figure for figure in ENGINE_FIGURES}
_MODEL_FIGURES = tuple(_DECLARED[name] for name in checked_fields(ModelReading))
_ENGINE_FIGURES = tuple(_DECLARED[name] for name in checked_fields(EngineReading))
_FIGURE_READ_AS = {figure.figure_read_as: figure for figure in ENGINE_FIGURES if figure.figure_read_as}


@dataclass(slots=True)
class Rejected:
    """The values dropped from one reading, by reason (VALUE_REJECT_REASONS), and the first few, for the log."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def add(self, reason: str, what: str, value: float) -> None:
        assert reason in VALUE_REJECT_REASONS, reason
        self.counts[reason] += 1
        if len(self.examples) < 3:
            self.examples.append(f"{what} {value!r} ({reason})")

    def __bool__(self) -> bool:
        return bool(self.counts)


def checked_value(value: float | None, what: str, rejected: Rejected, *, ratio: bool = False) -> float | None:
    """The value, or None (counted) when it is not finite, negative, or a ratio above 1."""
    if value is None:
        return None
    if math.isnan(value) or math.isinf(value):
        rejected.add("non_finite", what, value)
        return None
    if value < 0:
        rejected.add("negative", what, value)
        return None
    if ratio and value > 1:
        rejected.add("out_of_range", what, value)
        return None
    return value


def read_checked(reader: EngineReader, samples: dict[str, list[Sample]], rejected: Rejected) -> EngineReading:
    """The engine's reading of the samples that pass, checked in its turn; what was dropped is added to `rejected`.
    A family whose every sample is dropped stays present, empty: the reader tells its absence from a bad value."""
    kept = {name: [s for s in found if checked_value(s.value, name, rejected) is not None]
            for name, found in samples.items()}  # fmt: skip
    return _check_reading(reader.read(kept), rejected)


def _checked_figure(figure: EngineFigure, value: float | None, rejected: Rejected) -> float | None:
    """The figure's value, or None (counted) when it is out of the figure's declared bounds."""
    value = checked_value(value, figure.field, rejected, ratio=figure.bounds != AT_LEAST_ZERO)
    if value == 0 and figure.bounds == ABOVE_ZERO_TO_ONE:  # no share of a GPU: a budget of 0 bytes
        rejected.add("out_of_range", figure.field, value)
        return None
    return value


def _check_reading(reading: EngineReading, rejected: Rejected) -> EngineReading:
    """The reading with the values that are no reading dropped: a sum that overflowed, a ratio out of 0-1, a
    setting read from a label (vLLM's gpu_memory_utilization="7")."""
    models = tuple(_check_model(m, rejected) for m in reading.models)
    changes: dict[str, object] = {
        figure.field: _checked_figure(figure, getattr(reading, figure.field), rejected) for figure in _ENGINE_FIGURES
    }
    memory = tuple((c, b) for c, b in reading.memory_bytes if checked_value(b, c, rejected) is not None)
    if not rejected:
        return reading  # the usual case: no copy
    return replace(reading, models=models, memory_bytes=memory, **changes)


def _check_model(model: ModelReading, rejected: Rejected) -> ModelReading:
    changes = {
        figure.field: _checked_figure(figure, value, rejected)
        for figure in _MODEL_FIGURES
        if (value := getattr(model, figure.field)) is not None
    }
    return replace(model, **changes) if any(changes[n] is None for n in changes) else model


def figures_read(figures: Iterable[str], reading: EngineReading) -> dict[str, bool]:
    """Which of the engine's figures (model.FIGURES) this reading has (any of its models, for the per-model ones)."""

    def has(name: str) -> bool:
        figure = _FIGURE_READ_AS[name]
        if figure.per_model:
            return any(getattr(m, figure.field) is not None for m in reading.models)
        return getattr(reading, figure.field) is not None

    return {name: has(name) for name in figures}
