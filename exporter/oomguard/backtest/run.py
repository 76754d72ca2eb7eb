"""The backtest from end to end: history -> replay -> blocks -> a real Prometheus -> the rules -> the report."""

from __future__ import annotations

import contextlib
import itertools
import logging
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from oomguard.backtest import BacktestError
from oomguard.backtest.history import Problems, Step
from oomguard.backtest.notifications import Routing, notify
from oomguard.backtest.ooms import Oom
from oomguard.backtest.parallel import jobs_for, replay_parallel
from oomguard.backtest.progress import metered
from oomguard.backtest.replay import Replay, ReplaySummary, SeriesFilter
from oomguard.backtest.report import Report, Window, judge, write_plots
from oomguard.backtest.rules import RuleSet, backfill_records, evaluate, rule_set
from oomguard.backtest.tsdb import Backfill, Prometheus
from oomguard.bundle.bundle_config import BundleConfig
from oomguard.exporter.model import TrendSettings

# Steps read ahead to find the history's step (the trend samples at it) before the replay starts, at most PEEK_ROWS
# GPU rows of them (and the step that passes it): 64 steps of the largest fleet a step holds (16,384 GPUs) were a
# million rows, some 700 MiB, held at once.
PEEK_STEPS = 64
PEEK_ROWS = 65_536
# A series is read this many steps after its last sample, then no more (tsdb.py: the stale marker's stand-in).
LOOKBACK_STEPS = 1.5

Progress = Callable[[str], None]


def quiet(_: str) -> None:
    """No progress lines (--quiet): the replay is not metered either."""


class History(Protocol):
    """A file's (files.FileHistory) or a Prometheus' (source.PrometheusHistory) steps; either also says how much of
    it is read once a step is (`read_share(step)`, 0-1, or None), for the progress lines."""

    problems: Problems

    def __iter__(self) -> Iterator[Step]: ...


@dataclass
class Options:
    bundle: BundleConfig
    bundle_name: str = "the bundle's defaults"
    trend: TrendSettings = field(default_factory=TrendSettings)
    evaluation_interval: float = 30.0
    window: Window = field(default_factory=Window)
    gpu_memory_utilization: float | None = None
    sweep: bool = False
    plot: Path | None = None
    keep: Path | None = None  # keep the TSDB (and the OpenMetrics files' blocks) there
    jobs: int | None = None  # replay workers (parallel.py); None: as many as the CPUs for a long history


def peek(steps: Iterator[Step], n: int) -> tuple[list[Step], float]:
    """The first `n` steps, or those that pass PEEK_ROWS rows (the caller replays them first), and the median
    interval between them."""
    head: list[Step] = []
    rows = 0
    for step in itertools.islice(steps, n):
        head.append(step)
        rows += len(step.gpus)
        if rows >= PEEK_ROWS:
            break
    intervals = [b.t - a.t for a, b in itertools.pairwise(head) if b.t > a.t]
    return head, statistics.median(intervals) if intervals else 0.0


def trend_settings(base: TrendSettings, step: float) -> TrendSettings:
    """The exporter's trend settings, sampling at the history's step (the tracker's sample interval is its clock)."""
    return replace(base, interval_seconds=step) if step > 0 else base


@dataclass
class Replayed:
    """A history replayed into a backfill: what the report needs of it."""

    source: str
    summary: ReplaySummary
    step: float
    lookback: float
    problems: list[str]


def replay_history(
    history: History, source: str, options: Options, rules: RuleSet, backfill: Backfill, progress: Progress = quiet
) -> Replayed:
    """The history through the exporter's join and trend, its series into `backfill` (by several processes for a
    long history: parallel.py)."""
    started = time.monotonic()
    steps = iter(history)
    head, step = peek(steps, PEEK_STEPS)
    if not head:
        raise BacktestError(f"{source}: no readings in the history (or in the window asked for)")
    lookback = max(1.0, LOOKBACK_STEPS * step) if step > 0 else max(1.0, options.evaluation_interval)
    settings, series = trend_settings(options.trend, step), SeriesFilter(rules.wanted)
    units = {(row.targets or [f"{row.node}/{row.gpu}"])[0] for s in head for row in s.gpus} | {
        e for s in head for e in s.engines
    }
    jobs = jobs_for(options.jobs, len(units), getattr(history, "large", False))
    progress(
        f"replaying the history through the exporter's join and trend (a reading every {step:g} s"
        + (f", {jobs} processes)" if jobs > 1 else ")")
    )
    everything: Iterator[Step] = itertools.chain(head, steps)
    if progress is not quiet:  # a line every few seconds: the readings replayed, of about how many, the time left
        everything = metered(everything, progress, getattr(history, "read_share", None), started=started)
    if jobs > 1:
        summary = replay_parallel(
            everything, jobs, settings, series, lookback, options.gpu_memory_utilization, backfill.workdir,
            backfill.blocks,
        )  # fmt: skip
    else:
        replay = Replay(settings, series, backfill.write, lookback=lookback,
                        gpu_memory_utilization=options.gpu_memory_utilization)  # fmt: skip
        # A sample that fails in the trend is counted (errors_total), as live; its traceback is no user's business.
        sampler_log = logging.getLogger("oomguard.exporter.trend.sampler")
        was = sampler_log.disabled
        sampler_log.disabled = True
        try:
            summary = replay.run(everything)
        finally:
            sampler_log.disabled = was
    progress(f"{summary.steps:,} readings replayed, {summary.samples:,} samples written")
    problems = history.problems.lines()
    if summary.loads_inferred:
        problems.append(
            f"{summary.loads_inferred} engine loads inferred ({len(summary.engines_inferred)} engines; the history "
            "does not say their state): a ramp from an empty GPU, until the engine served or its memory settled, is "
            "left out of the trend, as the live exporter leaves a loading engine out"
        )
    if summary.trend_errors:
        problems.append(f"{summary.trend_errors} trend samples failed (counted, as the exporter counts them)")
    return Replayed(source, summary, step, lookback, problems)


def judge_history(
    prometheus: Prometheus, replayed: Replayed, options: Options, rules: RuleSet, ooms: list[Oom],
    progress: Progress = quiet,
) -> tuple[Report, dict[int, dict[str, list[tuple[float, float]]]]]:  # fmt: skip
    """The rules over the replayed window, judged against `ooms`; with the memory to plot (when asked for)."""
    summary = replayed.summary
    start, end = summary.start, summary.end
    progress(f"evaluating {len(rules.alerts)} alerts every {options.evaluation_interval:g} s over the history")
    episodes = evaluate(prometheus, rules.alerts, start, end)
    ooms = [oom for oom in ooms if start - options.window.before <= oom.t <= end + options.window.after]
    results, false, outcome = judge(episodes, ooms, summary, options.window)
    report = Report(
        source=replayed.source, start=start, end=end, steps=summary.steps, step_seconds=summary.step_seconds,
        evaluation_seconds=options.evaluation_interval, bundle=options.bundle_name, window=options.window,
        ooms=results, false_alarms=false, summary=summary, outcome=outcome, problems=list(replayed.problems),
    )  # fmt: skip
    report.episodes = episodes
    report.notifications = notify([e for eps in episodes.values() for e in eps], Routing.shipped(), end)
    if not ooms:
        report.notes.append("no OOMs in the window: give them with --ooms FILE (one time a line)")
    if options.sweep:
        from oomguard.backtest.sweep import sweep

        progress("sweeping the memory alerts' thresholds and windows")
        report.sweep = sweep(prometheus, options, rules, episodes, ooms, summary)
    memory = _plot_memory(prometheus, report, replayed.step) if options.plot is not None else {}
    return report, memory


def backtest(
    history: History,
    source: str,
    options: Options,
    *,
    ooms: list[Oom] | None,
    ooms_from: Callable[[], list[Oom]] | None = None,
    progress: Progress = quiet,
) -> Report:
    """`ooms`: the OOM list given; None: read them with `ooms_from` (oomguard's own counters) once the history is
    read, or none."""
    rules = rule_set(options.bundle, options.evaluation_interval)
    workdir = Path(tempfile.mkdtemp(prefix="oomguard-backtest-"))
    try:
        backfill = Backfill(workdir)
        try:
            replayed = replay_history(history, source, options, rules, backfill, progress)
        except BaseException:
            backfill.abort()
            raise
        progress("waiting for promtool's blocks")
        blocks = backfill.finish()
        if ooms is None:
            ooms = ooms_from() if ooms_from is not None else []
        progress("starting Prometheus over the replayed series")
        with Prometheus(workdir, blocks, replayed.lookback) as prometheus:
            if rules.records:
                progress(f"recording {len(rules.records)} rules the alerts read")
                record(prometheus, rules, replayed.summary, options.evaluation_interval, workdir, blocks)
            report, memory = judge_history(prometheus, replayed, options, rules, ooms, progress)
        if options.plot is not None:
            try:
                report.plots = write_plots(options.plot, report, memory)
            except BacktestError as exc:
                report.notes.append(f"no plots: {exc}")
        return report
    finally:
        if options.keep is not None:
            with contextlib.suppress(OSError):
                shutil.copytree(workdir / "blocks", options.keep / "data", dirs_exist_ok=True)
        shutil.rmtree(workdir, ignore_errors=True)


def record(
    prometheus: Prometheus, rules: RuleSet, summary: ReplaySummary, interval: float, workdir: Path, blocks: Path
) -> None:
    """The recording rules the alerts read, backfilled over the window; Prometheus restarted to read their blocks."""
    recorded = backfill_records(prometheus, rules.records, summary.start, summary.end, interval, workdir)
    prometheus.stop()
    if recorded is not None:
        for block in recorded.iterdir():
            block.rename(blocks / block.name)
    prometheus.start()


def _plot_memory(
    prometheus: Prometheus, report: Report, step: float
) -> dict[int, dict[str, list[tuple[float, float]]]]:
    """Per OOM, its GPUs' used share (and headroom's) over its incident: at most four GPUs each."""
    from oomguard.backtest.report import Places

    places = Places(report.summary)
    out: dict[int, dict[str, list[tuple[float, float]]]] = {}
    for index, result in enumerate(report.ooms):
        keys = places.of_oom(result.oom)
        if keys is None or not keys:
            keys = set()
            for lead in result.leads:
                keys |= places.of_episode(lead.labels) or set()
        start = result.oom.t - report.window.before
        end = result.oom.t + report.window.after
        series: dict[str, list[tuple[float, float]]] = {}
        for node, gpu in sorted(keys)[:4]:
            name = report.summary.gpus[(node, gpu)].name if (node, gpu) in report.summary.gpus else gpu
            where = f"{node}/GPU {name}" if node else f"GPU {name}"
            for family, what in (("oomguard_gpu_memory_used_ratio", "used"),
                                 ("oomguard_gpu_memory_headroom_used_ratio", "headroom used")):  # fmt: skip
                expr = f'{family}{{node="{node}",gpu="{gpu}"}}'
                for found in prometheus.query_range(expr, start, end, max(step, 1.0)):
                    series[f"{where} {what}"] = [(float(t), float(v)) for t, v in found["values"]]
        out[index] = series
    return out
