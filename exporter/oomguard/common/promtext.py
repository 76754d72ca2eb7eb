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


# Far above a real engine's: the families read hold 10 to 12 samples per vLLM model, about 12 per SGLang rank
# (48 with dp 2, tp 2 and priorities: 64 ranks stay under 1,000); model names and paths are under 200 characters.
SAMPLE_LIMIT = 5000
LABEL_VALUE_LENGTH_LIMIT = 1024
# vLLM's cache_config_info, the widest series read, has 37 labels (0.32): a series with more is not an engine's,
# and is refused before its labels are parsed (one line of a million labels took 2 s and 158 MB to parse).
LABEL_LIMIT = 128


class LimitExceeded(ExpositionError):
    """A body over one of the target's limits (as Prometheus's sample_limit, label_value_length_limit)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """A target's bounds on what is kept of its body: samples of the families read, characters of a label value,
    labels of a sample. Their defaults are scrape.sample_limit, scrape.label_value_length_limit and
    scrape.label_limit's (docs/configuration.md)."""

    samples: int = SAMPLE_LIMIT
    label_value_length: int = LABEL_VALUE_LENGTH_LIMIT
    labels: int = LABEL_LIMIT


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


class FamilyExtractor:
    """Compiled once per set of names; `extract` is then called per body. With `limits`, a body over them raises
    LimitExceeded as soon as the sample over a limit is met (the rest is not read)."""

    def __init__(self, names: Iterable[str], limits: Limits | None = None) -> None:
        self.names = frozenset(names)
        self.limits = limits
        # `vllm:num_requests_waiting` is also served as `vllm_num_requests_waiting` (some prometheus_client versions,
        # OpenMetrics' underscore escaping, a relabelling proxy): both spellings read, under the engine's name.
        self._canonical = {n.replace(":", "_"): n for n in self.names if ":" in n}
        self._canonical = {alias: n for alias, n in self._canonical.items() if alias not in self.names}
        spellings = self.names | self._canonical.keys()
        # A newline, then one of the names, then optional {labels}, the value; a timestamp may follow and is ignored.
        # The literal newline first lets the regex engine skip from line to line (where `^` would be tried at every
        # character), and the names as a trie fail a line at its first differing character (where an alternation
        # tries every name in turn): 9x faster on a vLLM body (docs/performance.md, "Scrape cost").
        self._line = re.compile(rf"\n({_trie(spellings)})(?:\{{([^\n]*)\}})?[ \t]+(\S+)(?:[ \t]+\S+)?[ \t]*\r?$", re.M)

    def extract(self, body: str) -> dict[str, list[Sample]]:
        """The samples of the families, by name. ExpositionError on a malformed sample or a series written twice
        (the same name and labels: a broken or hostile body, never summed)."""
        found: dict[str, list[Sample]] = {}
        seen: dict[tuple[str, frozenset[tuple[str, str]]], str] = {}  # each series -> the spelling it came in
        limits = self.limits
        for match in self._line.finditer("\n" + body):  # the first line as every other: after a newline
            spelled, label_text, value_text = match.groups()
            name = self._canonical.get(spelled, spelled)
            if limits is not None and label_text and label_text.count('="') > limits.labels:  # before parsing them
                raise LimitExceeded(
                    f"{name} has more than {limits.labels} labels, over the label limit: raise label_limit (the "
                    "target's, or scrape.label_limit) if this engine really writes such series"
                )
            labels = _labels_of(label_text) if label_text else {}
            if limits is not None:
                _check_limits(name, labels, label_text, len(seen), limits)
            key = (name, frozenset(labels.items()))
            if key in seen:
                if seen[key] != spelled:
                    continue  # the same series in both spellings (a proxy that adds one): read once, the first
                raise ExpositionError(f"the series {name}{_show(labels)} is written more than once")
            seen[key] = spelled
            found.setdefault(name, []).append(Sample(name, labels, _parse_value(value_text, name)))
        return found


def _trie(words: Iterable[str]) -> str:
    """A regular expression that matches any of `words` (none empty), its branches sharing their prefixes:
    {"ab", "ac", "a"} -> "a(?:(?:b|c))?" in effect. Longer words are tried first, so a word that is the prefix
    of another still lets the pattern that follows decide."""
    root: dict[str, dict] = {}
    for word in words:
        node = root
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}  # a word ends here

    def build(node: dict[str, dict]) -> str:
        branches = [re.escape(char) + build(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return build(root)


def _check_limits(name: str, labels: dict[str, str], label_text: str | None, count: int, limits: Limits) -> None:
    if count >= limits.samples:
        raise LimitExceeded(
            f"more than {limits.samples} samples in the families oomguard reads, over the sample limit: raise "
            "sample_limit (the target's, or scrape.sample_limit) if this engine really writes that many"
        )
    if label_text is not None and len(label_text) > limits.label_value_length:  # else no value can be longer
        for key, value in labels.items():
            if len(value) > limits.label_value_length:
                raise LimitExceeded(
                    f"{name} has a label {key[:60]} of {len(value)} characters, over the label value length limit of "
                    f"{limits.label_value_length}: raise label_value_length_limit (the target's, or "
                    "scrape.label_value_length_limit) if this engine really writes such values"
                )


def _show(labels: dict[str, str]) -> str:
    """Labels as written, each value cut short: for a message."""
    shown = ",".join(f'{k[:40]}="{v[:40]}"' for k, v in sorted(labels.items())[:8])
    return f"{{{shown}}}" if labels else ""


def _parse_value(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ExpositionError(f"sample {name} has a value that is not a number: {text[:40]!r}") from None
    return value


# Parsed label sets by their text: an engine writes the same series at every scrape (vLLM's cache_config_info, 37
# labels, is the costliest). The text is the target's (tenant-controlled): the cache is bounded in entries and in
# characters, shared by all targets, emptied when full; a copy is handed out, so no caller shares one.
_PARSED: dict[str, dict[str, str]] = {}
_PARSED_MAX = 8192
PARSED_CACHE_MAX_CHARS = 4 * 1024 * 1024
_parsed_chars = 0


def _labels_of(text: str) -> dict[str, str]:
    global _parsed_chars
    cached = _PARSED.get(text)
    if cached is not None:
        return dict(cached)
    labels = _parse_labels(text)
    size = 2 * len(text)  # the key, and the keys and values parsed out of it
    if len(_PARSED) >= _PARSED_MAX or _parsed_chars + size > PARSED_CACHE_MAX_CHARS:
        _PARSED.clear()
        _parsed_chars = 0
    if size <= PARSED_CACHE_MAX_CHARS // 64:
        _PARSED[text] = labels
        _parsed_chars += size
    return dict(labels)


def parsed_cache_chars() -> int:
    """What the cache of parsed label sets holds, as it counts it (at most PARSED_CACHE_MAX_CHARS)."""
    return _parsed_chars


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
