"""A history kept in a file: CSV with a header, or JSON lines; gzip-compressed too (`.gz`). docs/backtest.md, "File".

One row is one GPU at one time: `time`, `gpu` (and `node`), `used_bytes` with `total_bytes` or `free_bytes` (or the
same in MiB, `used_mib`...), optionally `reserved_bytes`, the engine using it (`target`) and that engine's figures
(`kv_cache_usage`, `waiting`, `running`, `preemptions_total`, `gpu_memory_utilization`, `engine`, `state`,
`sleep_state`). Rows of the same time are one reading of the fleet (a GPU shared by several engines: a row each);
times must not go back (a row whose time does, a clock step, is
dropped and counted, as Prometheus drops an out-of-order sample).

The file is streamed: read a row at a time, never whole, within MAX_FILE_BYTES (of text, after decompression; a
gzip's text within GZIP_RATIO times its compressed bytes beyond GZIP_FLOOR_BYTES) and MAX_LINE_BYTES a line; the
distinct GPUs and engines within the replay's MAX_GPUS and MAX_TARGETS, counted as they are read; its span within
source.MAX_STEPS steps, as --prometheus bounds its window. An error names the file, the line and the fix.
"""

from __future__ import annotations

import csv
import difflib
import gzip
import io
import json
import os
import statistics
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from oomguard.backtest import BacktestError
from oomguard.backtest.history import (
    ENGINE_FIGURES,
    ENGINE_SETTINGS,
    RATIO_FIGURES,
    SLEEP_STATE_NAMES,
    TARGET_STATES,
    EngineRow,
    GpuRow,
    Problems,
    Step,
    number,
    parse_time,
)
from oomguard.backtest.replay import MAX_GPUS, MAX_TARGETS
from oomguard.backtest.source import MAX_STEPS
from oomguard.common.excerpt import excerpt

# A month of 64 GPUs every 15 s in CSV is about 1 GB: twice that is refused (split the file, or use --prometheus).
MAX_FILE_BYTES = 2 * 1024**3
MAX_LINE_BYTES = 64 * 1024
# GPUs (and engines) in one step: a fleet's reading at one time. More is a file whose times are not times.
MAX_ROWS_A_STEP = 16_384
MIB = 1024**2
# A history compresses 10 to 35 times (measured: CSV 11 to 15, idle GPUs in JSON lines 31, empty columns 35); gzip
# at most about 1,000 times. Text beyond the floor and more than GZIP_RATIO times the compressed bytes read is a
# bomb: 2.3 GB of text in 5.6 MB of gzip was read up to MAX_FILE_BYTES, some 3 MB a second.
GZIP_FLOOR_BYTES, GZIP_RATIO = 4 * MIB, 100
# Intervals between the first steps of which the median is the history's step (run.peek's 64 steps).
STEP_INTERVALS = 63
LARGE_BYTES, LARGE_GZIP_BYTES = 4 * MIB, MIB

# Column -> (field, multiplier); the names a column may have, lower case.
_MEMORY = {
    f"{figure}_{unit}": (figure, factor)
    for figure in ("used", "total", "free", "reserved", "engine_used")
    for unit, factor in (("bytes", 1.0), ("mib", float(MIB)))
}
_ALIASES = {
    "time": "time", "timestamp": "time", "t": "time",
    "node": "node", "hostname": "node", "host": "node",
    "gpu": "gpu", "gpu_index": "gpu", "index": "gpu", "uuid": "gpu",
    "target": "target", "engine": "engine", "state": "state", "sleep_state": "sleep_state",
}  # fmt: skip
KNOWN_COLUMNS = (*_ALIASES, *_MEMORY, *ENGINE_FIGURES, *ENGINE_SETTINGS)


def _fix(path: Path, line: int, message: str) -> BacktestError:
    return BacktestError(f"{path} line {line}: {message}")


class _Counted(io.RawIOBase):
    """Bytes read so far, refused past MAX_FILE_BYTES (a compressed file's size says nothing of its text's), and a
    gzip's past GZIP_RATIO times the compressed bytes read (`packed`: the file under the gzip)."""

    def __init__(self, raw: IO[bytes], path: Path, limit: int, packed: IO[bytes] | None = None) -> None:
        self.raw, self.path, self.limit, self.count, self.packed = raw, path, limit, 0, packed

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self.raw.readinto(buffer)  # type: ignore[attr-defined]
        self.count += n or 0
        if self.count > self.limit:
            raise BacktestError(
                f"{self.path}: more than {self.limit:,} bytes of text (the limit of a history file): split it by time, "
                "or read the history from Prometheus (--prometheus)"
            )
        if self.packed is not None and self.count > GZIP_FLOOR_BYTES:
            packed = self.packed.tell()
            if self.count > GZIP_RATIO * packed:
                raise BacktestError(
                    f"{self.path}: its gzip decompresses to more than {GZIP_RATIO} times the compressed bytes read "
                    f"({self.count:,} bytes of text from {packed:,}), where a history compresses 10 to 35 times: a "
                    "gzip bomb? If it is a history, give it decompressed"
                )
        return n


def _open(path: Path, limit: int, read: list[IO[bytes]] | None = None) -> IO[str]:
    """`read`: the file's own bytes (a gzip's compressed ones) are put in it, for the share read so far."""
    try:
        size = os.stat(path).st_size
        if not path.is_file():
            raise BacktestError(f"{path}: not a file; give the history file (CSV or JSON lines)")
        if not path.name.endswith(".gz") and size > limit:
            raise BacktestError(
                f"{path}: {size:,} bytes, over the limit of a history file ({limit:,}): split it by time, or read the "
                "history from Prometheus (--prometheus)"
            )
        raw: IO[bytes] = open(path, "rb")  # noqa: SIM115 (closed by the caller's `with`)
    except OSError as exc:
        raise BacktestError(f"{path}: cannot read the history: {exc.strerror}") from None
    if read is not None:
        read.append(raw)
    packed = None
    if path.name.endswith(".gz"):
        packed, raw = raw, gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[assignment]
    counted = io.BufferedReader(_Counted(raw, path, limit, packed))
    return io.TextIOWrapper(counted, encoding="utf-8", newline="")


def _lines(handle: IO[str], path: Path) -> Iterator[tuple[int, str]]:
    number_ = 0
    while True:
        try:
            line = handle.readline(MAX_LINE_BYTES + 1)
        except UnicodeDecodeError as exc:
            raise _fix(path, number_ + 1, f"not UTF-8 text ({exc.reason}); save the file as UTF-8") from None
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise BacktestError(f"{path}: cannot read the history: {exc}") from None
        if not line:
            return
        number_ += 1
        if len(line) > MAX_LINE_BYTES and not line.endswith("\n"):
            raise _fix(path, number_, f"longer than {MAX_LINE_BYTES:,} characters: is this a history file?")
        yield number_, line


class FileHistory:
    """The steps of a history file, streamed; `problems` fills as it is read."""

    def __init__(self, path: Path, *, max_bytes: int = MAX_FILE_BYTES, evaluation_interval: float = 30.0) -> None:
        """`evaluation_interval`: the rules' grid over the history's span (the span is bounded on it where it is
        finer than the history's step)."""
        self.path = path
        self.max_bytes = max_bytes
        self.evaluation_interval = evaluation_interval
        self.problems = Problems()
        self._plans: dict[tuple[str, ...], _Plan] = {}
        self.format = "jsonl" if _is_jsonl(path) else "csv"
        try:
            size = os.stat(path).st_size
        except OSError:
            size = 0
        self.size = size
        self._read: list[IO[bytes]] = []  # the file being read (its bytes, compressed or not)
        # Long enough to replay on several processes (parallel.py): some 60,000 rows and more.
        self.large = size >= (LARGE_GZIP_BYTES if path.name.endswith(".gz") else LARGE_BYTES)

    def __iter__(self) -> Iterator[Step]:
        self._read.clear()
        with _open(self.path, self.max_bytes, self._read) as handle:
            rows = self._json_rows(handle) if self.format == "jsonl" else self._csv_rows(handle)
            yield from self._steps(rows)

    def read_share(self, _: Step) -> float | None:
        """How much of the file is read (of a gzip: of its compressed bytes), 0-1; the readers' buffers a little
        ahead of the steps."""
        if not self._read or self.size <= 0:
            return None
        try:
            return min(1.0, self._read[-1].tell() / self.size)
        except (OSError, ValueError):  # closed: read to its end
            return None

    # -- rows -------------------------------------------------------------------------------------
    def _csv_rows(self, handle: IO[str]) -> Iterator[tuple[int, dict[str, str]]]:
        at = [0]  # the line the reader is at

        def lines() -> Iterator[str]:
            for number_, line in _lines(handle, self.path):
                at[0] = number_
                if line.strip() and not line.lstrip().startswith("#"):
                    yield line

        reader = csv.reader(lines())
        header: list[str] | None = None
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                raise _fix(self.path, at[0], f"not CSV: {exc}") from None
            number_ = at[0]
            if header is None:
                header = self._header([c.strip().lower() for c in cells], number_)
                continue
            if len(cells) != len(header):
                raise _fix(
                    self.path, number_, f"{len(cells)} cells where the header has {len(header)} columns; "
                    "every row has a cell for each column (empty where there is no value)"
                )  # fmt: skip
            yield number_, dict(zip(header, cells, strict=True))
        if header is None:
            raise BacktestError(f"{self.path}: no rows; a history file starts with a header line: {_EXAMPLE_HEADER}")

    def _json_rows(self, handle: IO[str]) -> Iterator[tuple[int, dict[str, Any]]]:
        checked = False
        for number_, line in _lines(handle, self.path):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                raise _fix(self.path, number_, "not a JSON object; JSON lines have one object a line") from None
            if not isinstance(row, dict):
                raise _fix(self.path, number_, "not a JSON object; JSON lines have one object a line")
            row = {str(k).lower(): v for k, v in row.items()}
            if not checked:
                self._header(list(row), number_)
                checked = True
            yield number_, row
        if not checked:
            raise BacktestError(f"{self.path}: no rows; each line is one GPU at one time, e.g. {_EXAMPLE_JSON}")

    def _header(self, names: list[str], line: int) -> list[str]:
        known = set(KNOWN_COLUMNS)
        ignored = tuple(n for n in names if n not in known)
        self.problems.ignored_columns = tuple(excerpt(n, 40) for n in ignored[:20])
        canonical = {_ALIASES.get(n, n) for n in names}
        missing = [c for c in ("time", "gpu") if c not in canonical]
        figures = {_MEMORY[n][0] for n in names if n in _MEMORY}
        if "used" not in figures and not {"total", "free"} <= figures:
            missing.append("used_bytes (or used_mib)")
        if not ({"total", "free"} & figures):
            missing.append("total_bytes or free_bytes (or in MiB)")
        if missing:
            hints = []
            for n in ignored:
                close = difflib.get_close_matches(n, KNOWN_COLUMNS, n=1)
                if close:
                    name = close[0].replace("_mib", "_bytes")  # bytes first: the unit the exporter writes
                    hints.append(f"{excerpt(n, 40)!r} -> {name!r}?")
            hint = f" ({', '.join(hints)})" if hints else ""
            raise _fix(
                self.path, line, f"no {', no '.join(missing)} column{hint}; the columns are: {_EXAMPLE_HEADER} "
                "(docs/backtest.md, \"File\")"
            )  # fmt: skip
        return names

    # -- steps ------------------------------------------------------------------------------------
    def _steps(self, rows: Iterator[tuple[int, dict[str, Any]]]) -> Iterator[Step]:
        step: Step | None = None
        seen: dict[tuple[str, str], int] = {}
        window = _Window(self.path, self.evaluation_interval)
        gpus: set[tuple[str, str]] = set()  # every GPU and engine read so far: held within the replay's caps
        engines: set[str] = set()
        for number_, row in rows:
            t = self._time(row, number_)
            if step is not None and t < step.t:
                self.problems.out_of_order += 1
                if not self.problems.first_out_of_order:
                    self.problems.first_out_of_order = f"line {number_}: {t:.3f} after {step.t:.3f}"
                continue
            if step is None or t != step.t:
                if step is not None:
                    yield step
                window.add(t, number_)
                step, seen = Step(t), {}
            gpu, engine = self._row(row, number_)
            self._within_caps(gpu, engine, gpus, engines, number_)
            if gpu is not None:
                self._add_gpu(step, seen, gpu, number_)
            if engine is not None:
                held = step.engines.get(engine.target)
                if held is None or not held.has_figures():
                    step.engines[engine.target] = engine
        if step is not None:
            yield step

    def _within_caps(
        self, gpu: GpuRow | None, engine: EngineRow | None, gpus: set[tuple[str, str]], engines: set[str], line: int
    ) -> None:
        """The row's GPU and engine counted among those read so far; the file's error past the replay's caps."""
        if gpu is not None and (gpu.node, gpu.gpu) not in gpus:
            if len(gpus) >= MAX_GPUS:
                raise _fix(self.path, line, f"more than {MAX_GPUS:,} GPUs in the history: backtest a part of "
                                            "the fleet at a time (a file of its nodes)")  # fmt: skip
            gpus.add((gpu.node, gpu.gpu))
        if engine is not None and engine.target not in engines:
            if len(engines) >= MAX_TARGETS:
                raise _fix(self.path, line, f"more than {MAX_TARGETS:,} engines in the history: backtest a "
                                            "part of the fleet at a time (a file of its nodes)")  # fmt: skip
            engines.add(engine.target)

    def _add_gpu(self, step: Step, seen: dict[tuple[str, str], int], gpu: GpuRow, line: int) -> None:
        """A GPU's row into its step: a new GPU, another engine of a shared GPU, or a duplicate (the last kept)."""
        key = (gpu.node, gpu.gpu)
        if key not in seen:
            if len(step.gpus) >= MAX_ROWS_A_STEP:
                raise _fix(self.path, line, f"more than {MAX_ROWS_A_STEP:,} GPUs at one time: is `time` a time?")
            seen[key] = len(step.gpus)
            step.gpus.append(gpu)
            return
        held = step.gpus[seen[key]]
        if gpu.targets and gpu.targets[0] not in held.targets and held.targets:
            # Another engine on the same GPU (a shared GPU: a row each): the GPU's figures are one.
            target = gpu.targets[0]
            held.add_target(target, gpu.engine_used.get(target))
            if (gpu.used, gpu.total, gpu.free) != (held.used, held.total, held.free):
                self.problems.disagreeing += 1
        else:
            self.problems.duplicates += 1
            # The last row's kept, with the other engines of a shared GPU (their own rows) still on it.
            for other in held.targets:
                if other not in gpu.targets:
                    gpu.add_target(other, held.engine_used.get(other))
            step.gpus[seen[key]] = gpu

    def _plan(self, row: dict[str, Any]) -> _Plan:
        """Which of the row's columns hold what: found once per set of columns (a CSV's header; a JSON line's keys)."""
        keys = tuple(row)
        plan = self._plans.get(keys)
        if plan is None:
            if len(self._plans) > 64:  # JSON lines of ever new keys: found again, never held without bound
                self._plans.clear()
            plan = self._plans[keys] = _Plan(keys)
        return plan

    def _time(self, row: dict[str, Any], line: int) -> float:
        value = next((row[k] for k in self._plan(row).time if row[k] not in (None, "")), None)
        if value is None:
            raise _fix(self.path, line, "no time; every row has its time (Unix seconds or RFC 3339)")
        try:
            return parse_time(value, "time")
        except BacktestError as exc:
            raise _fix(self.path, line, str(exc)) from None

    def _row(self, row: dict[str, Any], line: int) -> tuple[GpuRow | None, EngineRow | None]:
        plan = self._plan(row)
        gpu_name = _text(next((row[k] for k in plan.gpu if row[k] not in (None, "")), None))
        if not gpu_name:
            raise _fix(self.path, line, "no gpu; every row names its GPU (its index, or its UUID)")
        node = _text(next((row[k] for k in plan.node if row[k] not in (None, "")), None))
        gpu = GpuRow(node=node if len(node) <= 120 else excerpt(node, 120),
                     gpu=gpu_name if len(gpu_name) <= 120 else excerpt(gpu_name, 120))  # fmt: skip
        engine_used = self._memory(row, plan, gpu, line)
        figures = self._figures(row, plan, line)
        target = _text(row["target"]) if plan.target else ""
        target = target if len(target) <= 120 else excerpt(target, 120)
        state = self._state(row, plan, line)
        sleep = self._sleep_state(row, plan, line)
        engine = None
        if figures or target or state:
            target = target or (f"{node}/{gpu_name}" if node else f"gpu{gpu_name}")
            gpu.add_target(target, engine_used)
            name = (_text(row["engine"]) if plan.engine else "") or "vllm"
            engine = EngineRow(target=target, engine=name, state=state, sleep_state=sleep, **figures)
        return gpu, engine

    def _memory(self, row: dict[str, Any], plan: _Plan, gpu: GpuRow, line: int) -> float | None:
        """The row's memory figures set on its GPU, in bytes; the engine's own use returned (None where absent)."""
        engine_used = None
        for column, figure, factor in plan.memory:
            raw = row[column]
            if raw is None or raw == "":
                continue
            value = number(raw)
            if value is None:
                self._bad(column, raw, line)
                continue
            if figure == "engine_used":
                engine_used = value * factor
            else:
                setattr(gpu, figure, value * factor)
        return engine_used

    def _figures(self, row: dict[str, Any], plan: _Plan, line: int) -> dict[str, float]:
        """The engine's figures of the row, each a reading (a ratio at most 1)."""
        figures: dict[str, float] = {}
        for name in plan.figures:
            raw = row[name]
            if raw is None or raw == "":
                continue
            value = number(raw)
            if value is None or (name in RATIO_FIGURES and value > 1):
                self._bad(name, raw, line)
                continue
            figures[name] = value
        return figures

    def _state(self, row: dict[str, Any], plan: _Plan, line: int) -> str:
        state = _text(row["state"]).lower() if plan.state else ""
        if state and state not in TARGET_STATES:
            raise _fix(self.path, line, f"state {excerpt(state, 40)!r}: one of {', '.join(TARGET_STATES)}, or empty")
        return state

    def _sleep_state(self, row: dict[str, Any], plan: _Plan, line: int) -> str:
        sleep = _text(row["sleep_state"]).lower() if plan.sleep else ""
        if sleep:
            if sleep not in SLEEP_STATE_NAMES:
                raise _fix(self.path, line, f"sleep_state {excerpt(sleep, 40)!r}: one of awake, weights_offloaded, "
                                            "discard_all (or the sleep level 0, 1, 2), or empty")  # fmt: skip
            sleep = SLEEP_STATE_NAMES[sleep]
        return sleep

    def _bad(self, column: str, raw: Any, line: int) -> None:
        """A value that is no number at all is the file's error; NaN, negative or a ratio above 1 is no reading."""
        try:
            float(raw)
        except (TypeError, ValueError):
            raise _fix(self.path, line, f"{column} {excerpt(str(raw), 40)!r} is not a number") from None
        self.problems.reject(column)


class _Window:
    """The history's span, bounded as --prometheus bounds its window (source.MAX_STEPS steps): the rules are
    evaluated over all of it, so one row years after the others would cost as if the years were read. The steps are
    the history's (the median interval of its first steps, as run.peek finds it), or the evaluation's where finer."""

    def __init__(self, path: Path, evaluation_interval: float) -> None:
        self.path, self.evaluation = path, evaluation_interval
        self.first: float | None = None
        self.last = 0.0
        self.intervals: list[float] = []
        self.grid = evaluation_interval

    def add(self, t: float, line: int) -> None:
        """A step at `t` (after the last), read at `line`."""
        if self.first is None:
            self.first = self.last = t
            return
        if len(self.intervals) < STEP_INTERVALS:
            self.intervals.append(t - self.last)
            self.grid = min(statistics.median(self.intervals), self.evaluation)
        self.last = t
        steps = (t - self.first) / self.grid
        if steps > MAX_STEPS:
            raise _fix(
                self.path, line, f"time {_when(t)} is {(t - self.first) / 86400:,.0f} days after the history's first "
                f"({_when(self.first)}): {steps:,.0f} steps of {self.grid:g} s, over {MAX_STEPS:,} (the most a "
                "backtest's window holds, as with --prometheus); is its time right? Otherwise split the history at the "
                "gap and backtest each part"
            )  # fmt: skip


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class _Plan:
    """A set of columns' roles: the names of each alias present, the memory columns with their unit, the figures."""

    __slots__ = ("engine", "figures", "gpu", "memory", "node", "sleep", "state", "target", "time")

    def __init__(self, keys: tuple[str, ...]) -> None:
        present = set(keys)
        self.time, self.gpu, self.node = (
            tuple(n for n, c in _ALIASES.items() if c == canonical and n in present)
            for canonical in ("time", "gpu", "node")
        )
        self.memory = tuple((n, figure, factor) for n, (figure, factor) in _MEMORY.items() if n in present)
        self.figures = tuple(n for n in (*ENGINE_FIGURES, *ENGINE_SETTINGS) if n in present)
        self.target, self.state, self.engine = ("target" in present, "state" in present, "engine" in present)
        self.sleep = "sleep_state" in present


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


def _is_jsonl(path: Path) -> bool:
    name = path.name.removesuffix(".gz").lower()
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return True
    if name.endswith((".csv", ".tsv", ".txt")):
        return False
    try:
        with _open(path, MAX_FILE_BYTES) as handle:
            head = handle.read(4096)
    except BacktestError:
        return False
    return head.lstrip().startswith("{")


_EXAMPLE_HEADER = "time,node,gpu,used_bytes,total_bytes[,reserved_bytes,target,kv_cache_usage,waiting,running,...]"
_EXAMPLE_JSON = (
    '{"time": "2024-05-01T12:00:00Z", "node": "gpu-1", "gpu": 0, "used_bytes": 7.2e10, "total_bytes": 8.5e10}'
)
