"""A history as the replay takes it: steps in time order, each one reading of the fleet's GPUs and engines.

Both inputs (a file, `files.py`; a Prometheus, `source.py`) give `Step`s, one at a time: a history of a month is
never held whole. `Coverage` counts what each GPU had along the way (what was judged, what never could be), and
`Problems` what was dropped, so that the report says it rather than hiding it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime

from oomguard.backtest import BacktestError
from oomguard.common.excerpt import excerpt

# The figures an engine may give (all optional), as the file's columns and the mapping's keys name them.
ENGINE_FIGURES = ("kv_cache_usage", "waiting", "running", "preemptions_total", "gpu_memory_utilization")
# Those that are a share (0-1): a value above 1 is no reading (as the exporter's engine readers reject it).
RATIO_FIGURES = ("kv_cache_usage", "gpu_memory_utilization")
# An engine's settings as started (oomguard_engine_setting), which ConcurrencyOverKvCache reads.
ENGINE_SETTINGS = ("max_num_seqs",)
TARGET_STATES = ("up", "loading", "down")
# The figures an engine gives only while it serves (its /metrics answers once loaded).
LIVE_FIGURES = ("kv_cache_usage", "waiting", "running", "preemptions_total")
# vLLM's sleep state as a history may give it: its `vllm:engine_sleep_state` label, or the sleep level (0 awake, 1
# weights offloaded, 2 everything discarded).
SLEEP_STATE_NAMES = {"awake": "awake", "0": "awake", "weights_offloaded": "weights_offloaded",
                     "1": "weights_offloaded", "discard_all": "discard_all", "2": "discard_all"}  # fmt: skip


@dataclass(slots=True)
class GpuRow:
    """One GPU at one time: its figures in bytes (None where the history has none), and the engine using it."""

    node: str
    gpu: str  # its index ("3"), a MIG instance ("3/1") or any other name the history gives it (a UUID)
    used: float | None = None
    total: float | None = None
    free: float | None = None
    reserved: float | None = None  # the driver's and firmware's (NVML v2, DCGM_FI_DEV_FB_RESERVED), not an engine's
    # The engines using it, none known: []. Several share a GPU (two vLLMs at 0.45 each): each is its own row of a
    # file (the same time and GPU) or its own series in Prometheus (dcgm-exporter labels a shared GPU with each pod).
    targets: list[str] = field(default_factory=list)
    # What each engine's own processes hold on it (NVML's per-process list), by target: where the history cannot
    # tell (dcgm-exporter), everything on the GPU beyond the reservations counts as its engines'.
    engine_used: dict[str, float] = field(default_factory=dict)

    def add_target(self, target: str, engine_used: float | None = None) -> None:
        if target and target not in self.targets:
            self.targets.append(target)
        if target and engine_used is not None:
            self.engine_used[target] = engine_used


@dataclass(slots=True)
class EngineRow:
    """One engine (a target) at one time: its figures, each None where the history has none."""

    target: str
    engine: str = "vllm"
    state: str = ""  # up, loading, down; "" : not told (replay.py infers a load, else up where it gives figures)
    sleep_state: str = ""  # vLLM's sleep mode (model.SLEEP_STATES); "" : not told
    kv_cache_usage: float | None = None
    waiting: float | None = None
    running: float | None = None
    preemptions_total: float | None = None
    gpu_memory_utilization: float | None = None
    max_num_seqs: float | None = None  # its concurrency cap (SGLang's max_running_requests), as started

    def has_figures(self) -> bool:
        return any(getattr(self, name) is not None for name in ENGINE_FIGURES)

    def serving(self) -> bool:
        """Figures only a serving engine's /metrics gives (its reservation alone may come from its command line)."""
        return any(getattr(self, name) is not None for name in LIVE_FIGURES)


@dataclass(slots=True)
class Step:
    """One reading of the fleet: every GPU and engine the history has at time `t` (Unix seconds)."""

    t: float
    gpus: list[GpuRow] = field(default_factory=list)
    engines: dict[str, EngineRow] = field(default_factory=dict)


@dataclass
class Problems:
    """What the input dropped, and why: said in the report."""

    out_of_order: int = 0  # rows whose time went back (a clock stepped back): dropped, as Prometheus drops them
    first_out_of_order: str = ""
    duplicates: int = 0  # a GPU twice in one step for the same engine (or none): the last one kept
    disagreeing: int = 0  # a shared GPU's rows of one time with other memory figures: the first one's kept
    rejected: dict[str, int] = field(default_factory=dict)  # column -> values that were no reading (NaN, < 0, > 1)
    ignored_columns: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)

    def reject(self, column: str) -> None:
        self.rejected[column] = self.rejected.get(column, 0) + 1

    def lines(self) -> list[str]:
        out = []
        if self.out_of_order:
            out.append(
                f"{self.out_of_order:,} {_rows(self.out_of_order)} dropped: their time went back (a clock step?), "
                f"first {self.first_out_of_order}"
            )
        if self.duplicates:
            out.append(
                f"{self.duplicates:,} {_rows(self.duplicates)} named a GPU already read at the same time for the same "
                "engine: the last one kept"
            )
        if self.disagreeing:
            out.append(
                f"{self.disagreeing:,} {_rows(self.disagreeing)} of a GPU shared by several engines gave other memory "
                "figures than the GPU's first row of the same time: the first row's kept"
            )
        for column, n in sorted(self.rejected.items()):
            out.append(
                f"{n:,} values of {column} were no reading (NaN, infinite, negative or a ratio above 1): skipped"
            )
        if self.ignored_columns:
            out.append(f"columns not read: {', '.join(self.ignored_columns)}")
        return out + self.notes


def _rows(n: int) -> str:
    return "row" if n == 1 else "rows"


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, what: str) -> float:
    """Prometheus-style durations (90s, 30m, 1h30m); a bare number is seconds."""
    text = str(text).strip()
    try:
        value = float(text)
    except ValueError:
        parts = _DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise BacktestError(
                f"{what} {excerpt(text)!r}: not a duration; write it like 30s, 15m, 1h or 3600"
            ) from None
        value = sum(float(n) * _UNITS[u] for n, u in parts)
    if not math.isfinite(value) or value < 0:
        raise BacktestError(f"{what} {excerpt(text)!r}: not a duration; write it like 30s, 15m, 1h or 3600")
    return value


# Unix seconds above this are taken for milliseconds (1e11 s is the year 5138).
MILLISECONDS_ABOVE = 1e11
# A time after the year 9999 is no time (9.9e299 made a file name too long, 1e15 ms a window of 32,000 years).
LATEST = 253_402_300_799.0  # 9999-12-31T23:59:59Z


def parse_time(text: str | float | int, what: str) -> float:
    """Unix seconds (milliseconds above 1e11), or RFC 3339 with its offset (2024-05-01T12:00:00Z)."""
    if isinstance(text, bool):
        raise BacktestError(f"{what}: {text!r} is not a time; give Unix seconds or RFC 3339 (2024-05-01T12:00:00Z)")
    if isinstance(text, int | float):
        value = float(text)
    else:
        raw = text.strip()
        try:
            value = float(raw)
        except ValueError:
            return _rfc3339(raw, what)
    if not math.isfinite(value) or value <= 0:
        raise BacktestError(f"{what}: {excerpt(str(text))!r} is not a time; give Unix seconds or RFC 3339")
    value = value / 1000 if value > MILLISECONDS_ABOVE else value
    if value > LATEST:
        raise BacktestError(
            f"{what}: {excerpt(str(text))!r} is after the year 9999, no time; give Unix seconds (milliseconds above "
            "1e11) or RFC 3339"
        )
    return value


def _rfc3339(raw: str, what: str) -> float:
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BacktestError(
            f"{what}: {excerpt(raw)!r} is not a time; give Unix seconds or RFC 3339 (2024-05-01T12:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        raise BacktestError(
            f"{what}: {excerpt(raw)!r} has no UTC offset; add one (Z for UTC, or +02:00): a time without one "
            "means a different instant on every machine"
        )
    return moment.timestamp()


def number(value: object) -> float | None:
    """A figure: a finite number at or above 0, else None (the caller counts it as rejected when it was given)."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v >= 0 else None
