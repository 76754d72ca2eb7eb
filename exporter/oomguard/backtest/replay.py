"""The history through the exporter's own code, at the history's own timestamps.

Each step becomes what the live exporter would have read at that time: an `GpuReadings` of the GPUs and a
`TargetReading` of each engine (its figures as an `EngineReading`, the GPUs it uses told as a pod's, the way the
cluster mode joins dcgm-exporter's GPUs with pods). Then the live classes run on it, nothing of theirs redone here:

- the trend: `Sampler` (trend/sampler.py) with its clock and sleep injected, `offload=False` (the replay mode it
  has for this), ticking at the history's timestamps; it calls `TrendObserver.observe` (trend/observe.py: which
  series to sample, loading engines left out, a fresh series once one is up) with stand-ins for NVML and the
  process lookup that answer the step's readings, and feeds `TrendTracker.record`;
- the joins: `join_targets` and `join_gpus` (join.py), as a scrape's collection calls them;
- the series: `exposition.families` on the step's `Snapshot`, the text the exporter would have served, of which
  the families the evaluated rules read are kept (`SeriesFilter`) and written with the step's time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import statistics
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import psutil

from oomguard.backtest import BacktestError
from oomguard.backtest.history import EngineRow, GpuRow, Step
from oomguard.backtest.loading import LoadInference
from oomguard.exporter import exposition
from oomguard.exporter.exposition import engine, events, gpu, health, joined, trend
from oomguard.exporter.exposition.encoder import Exposition
from oomguard.exporter.exposition.spec import MetricSpec
from oomguard.exporter.join import join_gpus, join_targets, reservation
from oomguard.exporter.model import (
    GPU_SOURCES,
    EngineReading,
    EngineSetting,
    GpuKey,
    GpuProcess,
    GpuReading,
    GpuReadings,
    MigInstance,
    ModelReading,
    PodRef,
    ProcessTree,
    Snapshot,
    SourceResult,
    TargetReading,
    TargetView,
    TrendSettings,
)
from oomguard.exporter.trend import sampler as sampler_module
from oomguard.exporter.trend.observe import TrendObserver
from oomguard.exporter.trend.sampler import Sampler, TrendTracker

# The namespace of the pods the replay tells each engine's GPUs by (model.PodRef): the engines are the history's,
# named by their `target`; this is no namespace of theirs.
NAMESPACE = "backtest"
# A GPU named by anything but an index (a UUID) is given one from here on, per node (its name is kept for the report).
NAMED_GPU_INDEX = 10_000
# The label every replayed series carries, which the rules are evaluated with as their selector (rules.py). No
# `instance`: the GPUs and engines are told apart by their own labels, and a label absent is as good as one empty
# in the rules' by() and on() (the bytes of every line promtool parses twice).
JOB = "backtest"
SELECTOR = f'job="{JOB}"'
# The pids the engines' own bytes are listed under: above any real pid (pid_max is at most 2**22).
FIRST_PID = 2**22 + 1
# How many intervals between steps are kept to find the history's step (their median).
INTERVALS_KEPT = 10_000
# GPUs and engines seen over the whole history: each is a few hundred bytes of the replay's own and a handful of
# series in the trend; past these the history is not one fleet's.
MAX_GPUS = 16_384
MAX_TARGETS = 16_384


@dataclass
class GpuCoverage:
    """What one GPU had along the history."""

    node: str
    name: str  # as the history names it
    label: str  # its `gpu` label in the replayed series
    first: float = 0.0
    last: float = 0.0
    steps: int = 0
    measured: int = 0  # steps with both used and total: judged
    headroom: int = 0  # of those, with an engine's reservation known: judged on the headroom, not the total
    judged_seconds: float = 0.0  # time between measured steps, each interval at most the lookback
    missing: set[str] = field(default_factory=set)  # what it lacked where not measured: used, total
    targets: set[str] = field(default_factory=set)
    _last_measured: float | None = None


@dataclass
class ReplaySummary:
    start: float
    end: float
    steps: int
    step_seconds: float  # the median interval between steps
    gpus: dict[GpuKey, GpuCoverage]  # by (node, label)
    targets: dict[str, set[GpuKey]]  # each engine's GPUs, over the history
    samples: int  # samples written
    trend_errors: int
    loads_inferred: int = 0  # loads inferred where the history has no state (loading.py)
    engines_inferred: set[str] = field(default_factory=set)  # the engines they were inferred for


class SeriesFilter:
    """Which series of the exporter's exposition are written: the families the rules read, and where a rule reads
    a family with equality matchers (`state="climbing"`), only the series they select."""

    def __init__(self, wanted: dict[str, list[dict[str, str]]]) -> None:
        """`wanted`: family (sample) name -> the equality matchers of each of its selectors ([] or a {} among
        them: every series)."""
        self.wanted = wanted
        self.specs: dict[MetricSpec, tuple[tuple[tuple[int, str], ...], ...] | None] = {}
        for spec in exposition.METRICS:
            selectors = wanted.get(spec.sample_name)
            if selectors is None:
                continue
            if not selectors or not all(selectors):
                self.specs[spec] = None  # every series
                continue
            # Each selector's matchers as (position in the labels, value); a label the family lacks never matches.
            self.specs[spec] = tuple(
                tuple((spec.labels.index(k), v) for k, v in sel.items())
                if set(sel) <= set(spec.labels)
                else ((-1, ""),)
                for sel in selectors
            )
        self.modules = tuple(m for m in _SECTIONS if any(spec in self.specs for spec in m.METRICS))


_SECTIONS = (gpu, engine, joined, trend, events, health)


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


class _Lines(Exposition):
    """The exporter's exposition, written as timestamped lines of the wanted series only (`SeriesFilter`): the
    section writers call `add` as they do for a scrape; the others' samples are not written at all. The pod labels
    the exposition adds to a target's series are left out (the replay's pods are its own device, `NAMESPACE`), and so
    is a label left empty (Prometheus reads it as absent all the same)."""

    _PREFIXES_MAX = 100_000

    def __init__(
        self, series: SeriesFilter, base: str, prefixes: dict[tuple[MetricSpec, tuple[str, ...]], str | None]
    ) -> None:
        super().__init__(exposition.METRICS, _DECLARED)
        self._specs = series.specs
        self._base = base
        self._prefixes = prefixes  # (spec, labels) -> the line's head, or None: a series no rule selects
        self.lines: list[str] = []

    def add(self, spec: MetricSpec, labels: tuple[str, ...], value: float | None) -> None:
        if value is None or spec not in self._specs:
            return
        key = (spec, labels)
        prefix = self._prefixes.get(key, _UNSEEN)
        if prefix is _UNSEEN:
            prefix = self._prefix(spec, labels)
            if len(self._prefixes) >= self._PREFIXES_MAX:
                self._prefixes.clear()
            self._prefixes[key] = prefix
        if prefix is not None:
            self.lines.append(prefix + repr(float(value)))

    def _prefix(self, spec: MetricSpec, labels: tuple[str, ...]) -> str | None:
        selectors = self._specs[spec]
        if selectors is not None and not any(all(i >= 0 and labels[i] == v for i, v in sel) for sel in selectors):
            return None
        # The labels the section writer gave (a target's pod labels come after them): those with a value.
        pairs = "".join(
            f',{name}="{_escape(labels[i])}"' for i, name in spec.label_order if i < len(labels) and labels[i]
        )
        return f"{spec.sample_name}{{{self._base}{pairs}}} "


_UNSEEN = object()


def series_lines(snapshot: Snapshot, series: SeriesFilter, base: str, prefixes: dict) -> list[str]:
    """`exposition.families`' section writers on the snapshot, in its order, those of no wanted family skipped."""
    out = _Lines(series, base, prefixes)
    modules = series.modules
    if health in modules:
        health.add_exporter(out, snapshot)
    if gpu in modules and snapshot.gpus is not None and any(s in snapshot.sources for s in GPU_SOURCES):
        gpu.add(out, snapshot.gpus)
    for target in snapshot.targets:
        if health in modules:
            health.add_target(out, target)
        if engine in modules:
            engine.add(out, target)
        if joined in modules:
            joined.add(out, target, snapshot.memory.get(target.name))
    if joined in modules:
        for _, gpu_memory in sorted(snapshot.gpu_memory.items()):
            joined.add_gpu(out, gpu_memory)
    if trend in modules:
        trend.add(out, snapshot)
    if events in modules:
        events.add(out, snapshot)
    return out.lines


_DECLARED = frozenset(exposition.METRICS)


class _InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """asyncio.to_thread's executor for the replay: the function runs at once, on the caller's thread (a thread hop
    per step would cost more than the step; the live exporter hops to keep its event loop free, the replay has none
    to keep)."""

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting coroutine, as a thread's would be
            future.set_exception(exc)
        return future


class _Host:
    """psutil as trend/sampler.py's `observations` reads it, for the replay: the host's memory read once, not at every
    step (a /proc read a tick, a tenth of a step's cost; it sizes the targets' host-memory series, which a history
    has none of: no target of the replay has local processes)."""

    def __init__(self) -> None:
        self._memory = psutil.virtual_memory()

    def virtual_memory(self) -> Any:
        return self._memory


class _End(Exception):
    pass


class _StepGpus:
    """The GPU source's stand-in (sources/gpu_source.py): the step's GPUs, read as NVML's."""

    name = "nvml"

    def __init__(self) -> None:
        self.reading: GpuReadings | None = None

    async def read(self) -> GpuReadings | None:
        return self.reading

    def close(self) -> None:
        """Nothing held."""


class _NoProcesses:
    """The process lookup's stand-in: a history has no pids (the engines' GPUs are told by pod, as in the cluster
    mode)."""

    async def get(self, max_age: float = 0.0) -> dict[int, ProcessTree]:
        return {}


class Replay:
    """Feeds steps through the live classes; `emit(t, samples)` gets each step's series as exposition lines."""

    def __init__(
        self,
        settings: TrendSettings,
        series: SeriesFilter,
        emit: Callable[[float, list[str]], None],
        *,
        lookback: float,
        gpu_memory_utilization: float | None = None,
    ) -> None:
        """`lookback`: the most an interval between two readings of a GPU counts as judged time (a longer one is a
        gap: the backtest's Prometheus reads a series that long after its last sample, tsdb.py).
        `gpu_memory_utilization`: the reservation every engine is told where the history does not give its own
        (its command line's, as the exporter reads a local engine's settings); None: only the history's."""
        self.settings = settings
        self.series = series
        self._prefixes: dict[tuple[MetricSpec, tuple[str, ...]], str] = {}
        self.emit = emit
        self.default_utilization = gpu_memory_utilization
        self.tracker = TrendTracker(settings)
        self._gpus = _StepGpus()
        self._views: list[TargetView] = []
        self.observer = TrendObserver(self._gpus, _NoProcesses(), lambda: self._views, self.tracker)  # type: ignore[arg-type]
        self._index: dict[GpuKey, tuple[int, int | None]] = {}
        self._named: dict[str, int] = {}  # node -> next index for a GPU named otherwise
        self._pids: dict[str, int] = {}  # an engine -> the pid its bytes are listed under (GpuRow.engine_used)
        self.coverage: dict[GpuKey, GpuCoverage] = {}
        self.targets: dict[str, set[GpuKey]] = {}
        self._intervals: list[float] = []
        self._labels = f'job="{JOB}"'
        self.samples = 0
        self.steps = 0
        self.start = self.end = 0.0
        self.lookback = lookback
        self.loads = LoadInference(lookback)
        self._reported: dict[str, float] = {}  # each engine's reservation as it last reported it

    # -- one step -------------------------------------------------------------------------------------
    def _gpu_index(self, node: str, name: str) -> tuple[int, int | None]:
        key = (node, name)
        found = self._index.get(key)
        if found is not None:
            return found
        if len(self._index) >= MAX_GPUS:
            raise BacktestError(f"more than {MAX_GPUS:,} GPUs in the history: backtest a part of the fleet at a time")
        parent, slash, instance = name.partition("/")
        if parent.isdigit() and int(parent) < NAMED_GPU_INDEX and (not slash or instance.isdigit()):
            found = (int(parent), int(instance) if slash else None)
        else:
            index = self._named.get(node, NAMED_GPU_INDEX)
            self._named[node] = index + 1
            found = (index, None)
        self._index[key] = found
        return found

    def _reading(self, row: GpuRow) -> GpuReading:
        index, instance = self._gpu_index(row.node, row.gpu)
        used, total, free, reserved = row.used, row.total, row.free, row.reserved
        # dcgm-exporter's arithmetic (sources/dcgm_body.py): the total is used + free + reserved where not given.
        if total is None and used is not None and free is not None:
            total = used + free + (reserved or 0.0)
        if used is None and total is not None and free is not None:
            used = max(0.0, total - free - (reserved or 0.0))
        if total is not None and total <= 0:
            total = None
        processes = None
        if row.engine_used:
            # NVML's per-process list as the node agent reads it: each engine's process with its bytes; the rest of
            # the GPU's use is everyone else's.
            processes = tuple(GpuProcess(self._pid(target), target, used) for target, used in row.engine_used.items())
        return GpuReading(
            index=index,
            up=True,
            total_bytes=total,
            used_bytes=used,
            free_bytes=free,
            reserved_bytes=reserved,
            processes=processes,
            node=row.node,
            pods=tuple((NAMESPACE, target) for target in row.targets),
            mig=MigInstance("", instance) if instance is not None else None,
        )

    def _pid(self, target: str) -> int:
        pid = self._pids.get(target)
        if pid is None:
            pid = self._pids[target] = FIRST_PID + len(self._pids)
        return pid

    def _target(self, engine: EngineRow, nodes: list[str], own: bool = False) -> TargetReading:
        figures = engine.has_figures()
        state = engine.state or ("up" if figures else "down")
        if engine.gpu_memory_utilization is not None:
            self._reported[engine.target] = engine.gpu_memory_utilization
        reading = None
        settings = {}
        told = engine.gpu_memory_utilization if state == "loading" else None
        if told is None and state == "loading" and engine.target in self.loads.inferred:
            told = self._reported.get(engine.target)  # its command line's, as it reported it the life before
        if told is None:
            told = self.default_utilization
        if told is not None:
            # As the exporter reads a local engine's command line (its reservation while it loads, with no /metrics).
            settings["gpu_memory_utilization"] = EngineSetting(told, "flag")
        if engine.max_num_seqs is not None:
            settings["max_num_seqs"] = EngineSetting(engine.max_num_seqs, "flag")
        if (figures or engine.sleep_state) and state != "loading":  # a loading engine refuses /metrics
            model = ModelReading(
                model_name="",
                kv_cache_usage_ratio=engine.kv_cache_usage,
                requests_waiting=engine.waiting,
                requests_running=engine.running,
                preemptions_total=engine.preemptions_total,
            )
            reading = EngineReading(models=(model,), memory_utilization_ratio=engine.gpu_memory_utilization,
                                    sleep_state=engine.sleep_state or None)  # fmt: skip
        node = nodes[0] if nodes else ""
        members = tuple(PodRef(NAMESPACE, engine.target, "", node=other) for other in nodes[1:])
        pod = PodRef(NAMESPACE, engine.target, "", node=node, members=members)
        return TargetReading(
            name=engine.target,
            engine=engine.engine,
            url="",
            gpus=(),
            up=state == "up",
            state=state,
            scrape_duration_seconds=0.0,
            engine_reading=reading,
            # Its process, where the history says its own bytes (join.py then tells them from everyone else's).
            process=ProcessTree(self._pid(engine.target), frozenset({self._pid(engine.target)}), 0.0, 0.0)
            if own
            else None,
            pod=pod,
            settings=settings,
        )

    def _prepare(self, step: Step) -> tuple[GpuReadings, tuple[TargetReading, ...]]:
        gpus = tuple(self._reading(row) for row in step.gpus)
        engines = dict(step.engines)
        nodes_of: dict[str, list[str]] = {}
        own = {target for row in step.gpus for target in row.engine_used}
        for row in step.gpus:
            for target in row.targets:
                nodes = nodes_of.setdefault(target, [])
                if row.node not in nodes:
                    nodes.append(row.node)
                engines.setdefault(target, EngineRow(target))
        if self.default_utilization is not None:
            # A GPU with no engine named on it is given one, so that the reservation told holds for it too.
            bare = [(row, gpu) for row, gpu in zip(step.gpus, gpus, strict=True) if not row.targets]
            if bare:
                gpus = tuple(
                    replace(gpu, pods=((NAMESPACE, _bare_name(row)),)) if not row.targets else gpu
                    for row, gpu in zip(step.gpus, gpus, strict=True)
                )
                for row, _ in bare:
                    name = _bare_name(row)
                    engines.setdefault(name, EngineRow(name, state="up"))
                    nodes_of.setdefault(name, [row.node])
        if len(self.targets) + len(engines) > MAX_TARGETS and any(n not in self.targets for n in engines):
            raise BacktestError(f"more than {MAX_TARGETS:,} engines in the history: backtest a part of it at a time")
        engines = self.loads.infer(step, engines)
        targets = tuple(self._target(engine, nodes_of.get(name, []), name in own) for name, engine in engines.items())
        return GpuReadings(up=True, gpus=gpus), targets

    def _account(self, t: float, nvml: GpuReadings, targets: tuple[TargetReading, ...], snapshot: Snapshot) -> None:
        for reading in nvml.gpus:
            key = reading.key
            cover = self.coverage.get(key)
            if cover is None:
                name = next(n for (node, n), found in self._index.items() if node == key[0] and _label(found) == key[1])
                cover = self.coverage[key] = GpuCoverage(key[0], name, key[1], first=t)
            cover.last = t
            cover.steps += 1
            if reading.measured:
                cover.measured += 1
                if key in snapshot.gpu_memory:
                    cover.headroom += 1
                if cover._last_measured is not None:
                    cover.judged_seconds += min(t - cover._last_measured, self.lookback)
                cover._last_measured = t
            else:
                if reading.used_bytes is None:
                    cover.missing.add("used")
                if not reading.total_bytes:
                    cover.missing.add("total (or free)")
                cover._last_measured = None
        for target in targets:
            memory = snapshot.memory.get(target.name)
            if memory is not None:
                self.targets.setdefault(target.name, set()).update(memory.gpus)
                for key in memory.gpus:
                    if key in self.coverage:
                        self.coverage[key].targets.add(target.name)

    # -- the run --------------------------------------------------------------------------------------
    def run(self, steps: Iterable[Step]) -> ReplaySummary:
        """Every step of `steps`, in order."""
        loop = asyncio.new_event_loop()
        loop.set_default_executor(_InlineExecutor(max_workers=1))
        live_psutil = sampler_module.psutil
        sampler_module.psutil = _Host()  # type: ignore[assignment]
        try:
            return loop.run_until_complete(self._run(iter(steps)))
        finally:
            sampler_module.psutil = live_psutil
            loop.close()

    async def _run(self, steps: Iterator[Step]) -> ReplaySummary:
        first = next(steps, None)
        if first is None:
            raise BacktestError("the history has no readings in the window: check its times (or --start and --end)")
        self.start = first.t
        current = [first]
        prepared = [self._prepare(first)]
        self._set(first, prepared[0])

        def clock() -> float:
            return current[0].t

        async def sleep(_: float) -> None:
            step = current[0]
            nvml, targets = prepared[0]
            self._publish(step.t, nvml, targets)
            following = next(steps, None)
            if following is None:
                raise _End
            if len(self._intervals) < INTERVALS_KEPT:
                self._intervals.append(following.t - step.t)
            current[0] = following
            prepared[0] = self._prepare(following)
            self._set(following, prepared[0])

        sampler = Sampler(self.tracker, self.observer.observe, clock=clock, sleep=sleep, offload=False)
        with contextlib.suppress(_End):
            await sampler.run()
        step_seconds = statistics.median(self._intervals) if self._intervals else 0.0
        return ReplaySummary(
            start=self.start,
            end=self.end,
            steps=self.steps,
            step_seconds=step_seconds,
            gpus=self.coverage,
            targets=self.targets,
            samples=self.samples,
            trend_errors=self.tracker.errors_total,
            loads_inferred=self.loads.spells,
            engines_inferred=set(self.loads.engines),
        )

    def _set(self, step: Step, prepared: tuple[GpuReadings, tuple[TargetReading, ...]]) -> None:
        nvml, targets = prepared
        self._gpus.reading = nvml
        self._views = [
            TargetView(t.name, (), None, t.state, t.engine_reading is not None and t.engine_reading.asleep, t.pod,
                       reservation(t))
            for t in targets
        ]  # fmt: skip

    def _publish(self, t: float, nvml: GpuReadings, targets: tuple[TargetReading, ...]) -> None:
        """The step's snapshot as a scrape's collection makes it, its exposition filtered and emitted."""
        memory = join_targets(nvml, targets)
        snapshot = Snapshot(
            gpus=nvml,
            targets=targets,
            sources={"nvml": SourceResult(True, 0.0)},
            collected_at=t,
            memory=memory,
            gpu_memory=join_gpus(nvml, targets, memory),
            trends=dict(self.tracker.latest),
            trend_samples_total=self.tracker.samples_total,
            trend_errors_total=self.tracker.errors_total,
        )
        self._account(t, nvml, targets, snapshot)
        stamp = f" {t:.3f}\n"
        lines = [line + stamp for line in series_lines(snapshot, self.series, self._labels, self._prefixes)]
        self.samples += len(lines)
        self.steps += 1
        self.end = t
        self.emit(t, lines)


def _label(found: tuple[int, int | None]) -> str:
    index, instance = found
    return str(index) if instance is None else f"{index}/{instance}"


def _bare_name(row: GpuRow) -> str:
    return f"{row.node}/{row.gpu}" if row.node else f"gpu{row.gpu}"
