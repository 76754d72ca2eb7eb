"""The log patterns of one target: the generic ones, its engine's, and the configuration's.

`events/patterns.yaml` holds what every engine's log may say (PyTorch's and CUDA's own
words); each engine plugin adds its lines (`engines/<name>/patterns.yaml`); the
configuration adds more (`events.patterns`). Each entry: `kind` (one of kinds.PATTERN_KINDS), `regex`
(Python syntax), `at` (where it is matched, records.py: `record`, the default, at the start of the message of one
of the engine's own records; `exception`, at the start of the last line of a Python traceback) and, for a
record, `source` (a regex the record's logger or source file must match whole). Nothing is searched anywhere in a
line: a line that carries an API user's text never counts (docs/security.md, "API users").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from oomguard.common.kinds import PATTERN_KINDS
from oomguard.exporter.engines import ENGINES
from oomguard.exporter.events.records import EXCEPTION, RECORD

AT = (RECORD, EXCEPTION)  # where a pattern may be matched (records.py)


@dataclass(frozen=True, slots=True)
class Pattern:
    kind: str
    regex: re.Pattern[str]
    at: str = RECORD
    source: re.Pattern[str] | None = None  # a record's logger or source file, matched whole; None: any


def _compile(entry: Mapping[str, Any]) -> Pattern:
    kind, regex, at, source = entry.get("kind"), entry.get("regex"), entry.get("at", RECORD), entry.get("source")
    if kind not in PATTERN_KINDS:
        raise ValueError(f"pattern {regex!r}: kind {kind!r} is not one of {', '.join(PATTERN_KINDS)}")
    if at not in AT:
        raise ValueError(f"pattern {regex!r}: at {at!r} is not one of {', '.join(AT)}")
    if source is not None and at != RECORD:
        raise ValueError(f"pattern {regex!r}: a source applies to at: record only (an exception has none)")
    try:
        return Pattern(kind, re.compile(regex), at, None if source is None else re.compile(source))  # type: ignore[arg-type]
    except (re.error, TypeError, OverflowError, RecursionError) as exc:  # a{4294967296}; ((((... 1000 deep
        raise ValueError(f"pattern {regex!r} ({kind}) is not a valid regular expression: {exc}") from None


def check_patterns(entries: Iterable[Mapping[str, Any]]) -> None:
    """Raise ValueError naming the first entry whose kind is unknown or whose regex does not compile."""
    for entry in entries:
        _compile(entry)


@cache
def _shipped(engine: str | None) -> tuple[Pattern, ...]:
    text = resources.files("oomguard.exporter.events").joinpath("patterns.yaml").read_text("utf-8")
    entries = list(yaml.safe_load(text) or [])
    if engine is not None:
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; known engines: {', '.join(ENGINES)}")
        entries += ENGINES[engine].log_patterns()
    return tuple(_compile(entry) for entry in entries)


def load_catalogue(engine: str | None = None, extra: list[dict[str, str]] | None = None) -> list[Pattern]:
    """The generic patterns, `engine`'s (None: none), then `extra`; a bad regex or kind raises ValueError naming it."""
    return [*_shipped(engine), *(_compile(entry) for entry in extra or ())]
