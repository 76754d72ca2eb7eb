"""Concurrency against the KV cache: does the engine admit more requests than its KV cache holds?

The postmortem's lesson: tune `gpu_memory_utilization` together with `max_num_seqs`, never one alone. An engine
whose concurrency cap is far above what its KV cache holds keeps its cache full under load: it preempts, and the
batches it runs grow activations outside the reserved pool; with the reservation at 0.9 or more there is no room
to grow the cache instead, so the cap is what must come down. The same check as the bundle's
ConcurrencyOverKvCache alert, on the same numbers: its min_running, min_kv_usage, quantile, margin_ratio and
reservation_threshold, read from the bundle configuration (thresholds.py).

The KV cache's capacity in requests of the observed size is running / KV use at each sample where enough requests
run and enough of the cache is in use to say something (a few short requests in an idle cache say nothing), taken
at a high quantile over the window: a robust "at most", neither one sample nor its single best moment. High
rather than median so that the check errs towards silence: the cap is flagged only when even the cache's good
moments are well below it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from oomguard.exporter.engines import ENGINES

# The bundle's concurrency_over_kv_cache (thresholds.py): min_running (fewer requests say little about the typical
# one), min_kv_usage (below it, block rounding dominates), quantile, margin_ratio (the cap above capacity x (1 + it)
# is flagged), reservation_threshold (from there the cache cannot grow).
MIN_SAMPLES = 10  # diagnose's own floor: a quantile of fewer points is one sample in disguise

# The engines' concurrency caps and reservations, as oomguard_engine_setting names them, with their flags: each
# engine's plugin names its own (engines/<name>/, `knobs`). llama.cpp's `parallel` is no cap of this kind: it
# splits ctx_size between its slots, which cannot over-admit.
_KNOBS = [plugin.knobs for plugin in ENGINES.values()]
CONCURRENCY_SETTINGS = tuple(k.concurrency.setting for k in _KNOBS if k.concurrency)
RESERVATION_SETTINGS = tuple(k.reservation.setting for k in _KNOBS if k.reservation)
FLAGS = {knob.setting: knob.flag for k in _KNOBS for knob in (k.concurrency, k.reservation) if knob}
# engine -> (its concurrency cap, its reservation): what to name when the setting series is absent.
ENGINE_KNOBS = {
    name: (plugin.knobs.concurrency.setting, plugin.knobs.reservation.setting if plugin.knobs.reservation else None)
    for name, plugin in ENGINES.items()
    if plugin.knobs.concurrency
}


@dataclass(frozen=True)
class Setting:
    name: str
    value: float
    origin: str  # "flag" or "default" (oomguard_engine_setting), or "--max-num-seqs" (diagnose's own flag)


@dataclass(frozen=True)
class Check:
    """The check's figures; `flagged` is the finding."""

    capacity: float | None  # requests of the observed size the KV cache held at most (the quantile over the window)
    samples: int  # samples the capacity was taken from
    cap: Setting | None  # the concurrency cap (max_num_seqs, ...) or None: unknown
    cap_name: str  # its name for this engine, known or not
    reservation: Setting | None  # gpu_memory_utilization / mem_fraction_static, or None: unknown
    preemptions: float
    margin: float  # the bundle's margin_ratio: flagged above capacity x (1 + margin)
    reservation_threshold: float  # the bundle's: from this reservation up the cache cannot grow

    @property
    def ratio(self) -> float | None:
        """The cap over the capacity: how many times what the cache holds the engine admits."""
        if self.cap is None or not self.capacity:
            return None
        return self.cap.value / self.capacity

    @property
    def over(self) -> bool:
        return self.ratio is not None and self.ratio > 1 + self.margin

    @property
    def reservation_high(self) -> bool:
        return self.reservation is not None and self.reservation.value >= self.reservation_threshold

    @property
    def flagged(self) -> bool:
        """Over the cache, judged on a window: one reading of an exporter shows the figures, and judges nothing."""
        return self.over and self.samples >= MIN_SAMPLES

    def json(self) -> dict:
        def setting(s: Setting | None) -> dict | None:
            return None if s is None else {"name": s.name, "value": s.value, "origin": s.origin}

        ratio = self.ratio
        return {
            "kv_cache_capacity_requests": None if self.capacity is None else round(self.capacity, 3),
            "samples": self.samples,
            "concurrency": setting(self.cap),
            "concurrency_setting": self.cap_name,
            "reservation": setting(self.reservation),
            "ratio": None if ratio is None else round(ratio, 3),
            "over_capacity": self.over,
            "flagged": self.flagged,
            "reservation_high": self.reservation_high,
            "preemptions": self.preemptions,
        }


def quantile(values: list[float], q: float) -> float:
    """Prometheus' quantile_over_time: linear interpolation between the closest ranks."""
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def capacity_points(
    running: list[tuple[float, float]], kv: list[tuple[float, float]], min_running: float, min_kv_usage: float
) -> list[tuple[float, float]]:
    """(time, running / KV use) where at least `min_running` requests run with at least `min_kv_usage` of the
    cache (the bundle's concurrency_over_kv_cache.min_running and .min_kv_usage)."""
    use = dict(kv)
    out = []
    for t, n in running:
        k = use.get(t)
        if k is not None and n >= min_running and min_kv_usage <= k <= 1.0:
            out.append((t, n / k))
    return out


def capacity(points: list[tuple[float, float]], history: bool, q: float) -> float | None:
    """The `q` quantile of the points (the bundle's concurrency_over_kv_cache.quantile); None below MIN_SAMPLES in a
    history (one reading of an exporter: its one point)."""
    if not points or (history and len(points) < MIN_SAMPLES):
        return None
    return quantile([v for _, v in points], q)


def pick(settings: dict[str, Setting], names: tuple[str, ...], preferred: str | None) -> Setting | None:
    """The engine's own knob where it has one, else the first of `names` the series name."""
    if preferred is not None and preferred in settings:
        return settings[preferred]
    return next((settings[n] for n in names if n in settings), None)
