"""The text exposition, written straight from the specs and samples of one render.

Written by hand rather than through prometheus_client's generate_latest, which validates
and escapes every name on every sample: most of the render time for names declared once.
`metric_families` gives the same samples as prometheus_client objects, and a test holds
the two outputs byte-equal, but for one thing: a label value's control characters, line
separators and bidi controls, which prometheus_client writes raw, are written here as
visible escapes (`_escape`, and docs/security.md, "What a string reaches").
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from oomguard.common.visible import ACTING, escape
from oomguard.exporter.exposition.spec import POD_LABELS, MetricSpec

NO_POD = ("",) * len(POD_LABELS)  # a configured target's pod labels


def _escape(value: str) -> str:
    """The text format's escapes (backslash, quote, line feed), and the characters it has none for, which a label
    value from an engine or a pod may hold: CR, VT, FF, FS, NEL, U+2028 and U+2029 end a line for
    `str.splitlines()`, ESC and C1 drive a terminal that shows /metrics. Prometheus reads them raw, and would read
    `\\r` as a backslash and an r (promtool refuses it): each is written as its visible escape, a backslash
    (itself escaped) and its code, `\\\\u2028`, which Prometheus stores as the text `\\u2028`."""
    if value.isprintable() and "\\" not in value and '"' not in value:
        return value
    value = value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return ACTING.sub(lambda match: "\\" + escape(match[0]), value)


# "name{labels} " by metric, label values and (for a per-target metric) the target's pod labels, apart: the same
# series come back at every scrape, and a key of three parts costs no copy of the labels. Label values churn (pids,
# restarts, an engine's model names: tenant-controlled): the cache is bounded in entries and in bytes (each prefix
# and the label values its key holds), and emptied when either is full, never grown forever. A host's series take
# a few MB at most (docs/engines.md, "Values checked"); a prefix alone over PREFIX_MAX_BYTES is written, not kept.
# The cluster mode's 500 pods hold about 55,000 series (bench/bench_cluster.py): the entries allow for them, or the
# cache, emptied at every render, would be rebuilt at every scrape (a third of its CPU, before this was raised).
PrefixKey = tuple[MetricSpec, tuple[str, ...], tuple[str, ...] | None]
_PREFIXES: dict[PrefixKey, str] = {}
_PREFIXES_MAX = 200_000
PREFIX_CACHE_MAX_BYTES = 16 * 1024 * 1024
PREFIX_MAX_BYTES = 64 * 1024
_cached_bytes = 0


def _prefix(spec: MetricSpec, labels: tuple[str, ...], pod: tuple[str, ...] | None = None) -> str:
    global _cached_bytes
    key = (spec, labels, pod)
    if pod is not None:
        labels += pod
    if spec.label_order:
        pairs = ",".join(f'{label}="{_escape(labels[i])}"' for i, label in spec.label_order)
        prefix = f"{spec.sample_name}{{{pairs}}} "
    else:
        prefix = f"{spec.sample_name} "
    size = len(prefix) + sum(len(v) for v in labels)  # characters: bytes for the ASCII of names and most values
    if len(prefix) > PREFIX_MAX_BYTES:
        return prefix
    if len(_PREFIXES) >= _PREFIXES_MAX or _cached_bytes + size > PREFIX_CACHE_MAX_BYTES:
        _PREFIXES.clear()
        _cached_bytes = 0
    _PREFIXES[key] = prefix
    _cached_bytes += size
    return prefix


# A value's text by value, with its newline: the same values come back in most series (0 and 1 in a third and a
# quarter of them, the one-hot states and the up series) and at every scrape. 0.0 and -0.0 are one key but two
# texts: the key holds 0.0's, and a zero found under it is told apart by its sign. Emptied when full.
_ZERO = "0.0\n"
_VALUES: dict[float, str] = {0.0: _ZERO}
_VALUES_MAX = 4096


def _value_text(value: float) -> str:
    if value == 0:
        return "-0.0\n" if math.copysign(1.0, value) < 0 else _ZERO
    text = floatToGoString(value) + "\n"
    if len(_VALUES) >= _VALUES_MAX:
        _VALUES.clear()
        _VALUES[0.0] = _ZERO
    _VALUES[value] = text
    return text


def prefix_cache_bytes() -> int:
    """What the label-prefix cache holds, as it counts it (at most PREFIX_CACHE_MAX_BYTES)."""
    return _cached_bytes


class Exposition:
    """Fresh samples for one render, written in the order of `metrics`; `add` skips values we
    do not have (never NaN). `pods`: a discovered target's (namespace, pod, container), by target name.

    Each sample is written as it is added (its cached prefix and value text, in its metric's list), so that
    `render` only joins the lists: one pass over the samples, not two. `keep_samples` also keeps them as
    label values and numbers, for `metric_families` (prometheus_client's objects: the tests' reference writer)."""

    def __init__(
        self,
        metrics: tuple[MetricSpec, ...],
        declared: frozenset[MetricSpec],
        pods: Mapping[str, tuple[str, str, str]] | None = None,
        *,
        keep_samples: bool = False,
    ) -> None:
        self._metrics = metrics
        self._declared = declared  # set(metrics), made once by the caller
        self._pods = pods or {}
        self._lines: dict[MetricSpec, list[str]] = {}  # prefix, value text, prefix, value text...
        self._samples: dict[MetricSpec, list[tuple[tuple[str, ...], float]]] | None = {} if keep_samples else None

    def add(self, spec: MetricSpec, labels: tuple[str, ...], value: float | None) -> None:
        if value is None:
            return
        index = spec.target_index
        pod = self._pods.get(labels[index], NO_POD) if index >= 0 else None
        lines = self._lines.get(spec)
        if lines is None:
            assert spec in self._declared, f"{spec.name} is not in the exposition's list of metrics"
            lines = self._lines[spec] = []
        lines.append(_PREFIXES.get((spec, labels, pod)) or _prefix(spec, labels, pod))
        text = _VALUES.get(value)
        if text is None or (text is _ZERO and math.copysign(1.0, value) < 0):
            text = _value_text(value)
        lines.append(text)
        if self._samples is not None:
            self._samples.setdefault(spec, []).append((labels + pod if pod is not None else labels, value))

    def render(self) -> bytes:
        out: list[str] = []
        # Declaration order, so the exposition is stable whatever the order of sources.
        for spec in self._metrics:
            lines = self._lines.get(spec)
            if lines:
                out.append(spec.header)
                out.extend(lines)
        return "".join(out).encode()

    def metric_families(self) -> Iterator[Metric]:
        assert self._samples is not None, "made without keep_samples"
        for spec in self._metrics:
            samples = self._samples.get(spec)
            if not samples:
                continue
            cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            family = cls(spec.name, spec.help, labels=spec.labels, unit="")
            for labels, value in samples:
                family.add_metric(list(labels), value)
            yield family
