"""The replay of a long history on several processes: its engines and GPUs shared out, every step to every one.

The replay's cost is the trend's analysis of each series at each step, and the exposition of each: a week of 8 GPUs
every 15 s is 40,320 steps of 16 series, about a minute on one core (docs/performance.md). The series do not
interact: a GPU's trend, joins and series depend on its own readings and its engine's, and an engine on its own and
its GPUs'. So the engines (with the GPUs they run on) and the GPUs without one are dealt out to `jobs` worker
processes in the order they first appear, each worker a `Replay` of its share, with its own backfill; every worker
gets every step (its share of the rows, often none), so that each ticks when the exporter would have, and the
merged result is what one replay gives (tests/backtest/test_parallel.py holds them equal). A GPU that changes
engines keeps the worker of its first; its new engine's rows go with it.

The main process reads the history (a file, a Prometheus) and deals the rows; a worker's failure is the backtest's.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import shutil
import signal
from collections.abc import Iterator
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from oomguard.backtest import BacktestError
from oomguard.backtest.history import Step
from oomguard.backtest.replay import GpuCoverage, Replay, ReplaySummary, SeriesFilter
from oomguard.backtest.tsdb import PROMTOOL_TIMEOUT, Backfill
from oomguard.exporter.model import TrendSettings

BATCH = 64  # steps sent to a worker at once: fewer, larger messages through its pipe
BATCH_ROWS = 65_536  # and at most these GPU rows (and the step that passes them): 64 steps of 16,384 GPUs were 700 MiB
MAX_JOBS = 4
# Histories shorter than this are replayed in the main process: starting a worker (a Python with oomguard
# imported) costs about half a second.
PARALLEL_FROM_STEPS = 10_000


class Dealer:
    """Which worker each engine and GPU of the history goes to: in the order they first appear, in turn."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.of: dict[str, int] = {}  # "engine:NAME" or "gpu:NODE/GPU" -> worker
        self._next = 0

    def _worker(self, key: str, *also: str) -> int:
        for k in (key, *also):
            found = self.of.get(k)
            if found is not None:
                break
        else:
            found = self._next % self.jobs  # a new engine (with its GPU), or a GPU of none: the next worker's
            self._next += 1
        for k in (key, *also):
            self.of.setdefault(k, found)
        return found

    def deal(self, step: Step) -> list[Step]:
        parts = [Step(step.t) for _ in range(self.jobs)]
        for row in step.gpus:
            gpu = f"gpu:{row.node}/{row.gpu}"
            # A GPU goes with its engines (several on a shared GPU: the first one's worker takes them all).
            keys = [f"engine:{target}" for target in row.targets]
            worker = self._worker(*keys, gpu) if keys else self._worker(gpu)
            parts[worker].gpus.append(row)
        for name, engine in step.engines.items():
            parts[self._worker(f"engine:{name}")].engines[name] = engine
        return parts


def _work(
    conn: Connection, settings: TrendSettings, wanted: dict, lookback: float, utilization: float | None, workdir: str,
    parents: list[Connection],
) -> None:  # fmt: skip
    """A worker: its share of each step, replayed into its own backfill; its summary (or its error) sent back."""
    # The fork copied the parent's ends of the pipes made so far, its own among them: closed here, so that the
    # parent closing its end reads as the end of the steps (EOFError), not a wait for a writer that is this worker.
    for parent in parents:
        parent.close()
    # Forked with the command's handlers (command.py): a worker is stopped by the process that started it (SIGTERM:
    # it kills its promtool, leaving nothing to write into the folder being removed), and ^C, which the terminal
    # sends to every process of the group, is that process's to handle.
    signal.signal(signal.SIGTERM, _stopped)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger("oomguard.exporter.trend.sampler").disabled = True
    backfill = Backfill(Path(workdir))

    def steps() -> Iterator[Step]:
        while True:
            batch = conn.recv()
            if batch is None:
                return
            yield from batch

    try:
        replay = Replay(settings, SeriesFilter(wanted), backfill.write, lookback=lookback,
                        gpu_memory_utilization=utilization)  # fmt: skip
        summary = replay.run(steps())
        backfill.finish()
        outcome: tuple[str, Any] = ("ok", summary)
    except BacktestError as exc:
        backfill.abort()
        outcome = ("error", str(exc))
    except Exception as exc:  # the parent gone too (EOFError)
        backfill.abort()
        outcome = ("error", f"a replay worker failed: {type(exc).__name__}: {exc}")
    except BaseException:  # stopped
        backfill.abort()
        conn.close()
        raise
    try:
        conn.send(outcome)
    except OSError:
        pass  # the parent is gone, or has stopped listening: no one to tell
    finally:
        conn.close()


def _stopped(signum: int, _: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the way out kills promtool and removes its files: not cut short
    raise SystemExit(128 + signum)


def replay_parallel(
    steps: Iterator[Step], jobs: int, settings: TrendSettings, series: SeriesFilter, lookback: float,
    utilization: float | None, workdir: Path, blocks: Path,
) -> ReplaySummary:  # fmt: skip
    """`steps` dealt to `jobs` workers; their blocks moved into `blocks`; their summaries merged."""
    # Forked: a spawned worker would import the command's __main__ again (`python -m oomguard` runs the CLI at import).
    # The parent has no event loop and no thread of its own running yet (the replay and its backfill are the workers').
    context = multiprocessing.get_context("fork")
    workers: list[tuple[Any, Connection, Path]] = []
    try:
        for i in range(jobs):
            folder = workdir / f"worker-{i}"
            parent, child = context.Pipe()
            parents = [conn for _, conn, _ in workers] + [parent]
            process = context.Process(
                target=_work, args=(child, settings, series.wanted, lookback, utilization, str(folder), parents),
                name=f"oomguard-backtest-{i}", daemon=True,
            )  # fmt: skip
            process.start()
            child.close()
            workers.append((process, parent, folder))
        for batch in batches(steps, Dealer(jobs)):
            _send(workers, batch)
        _send(workers, None)
        summaries = [_result(process, conn) for process, conn, _ in workers]
    finally:
        for process, conn, _ in workers:
            conn.close()
            if process.is_alive():
                process.terminate()
        for process, _, _ in workers:  # each kills its promtool and ends
            process.join(PROMTOOL_TIMEOUT + 10)
            if process.is_alive():
                process.kill()
                process.join()
    for _, _, folder in workers:
        for block in (folder / "blocks").iterdir():
            block.rename(blocks / block.name)
        shutil.rmtree(folder, ignore_errors=True)
    return merge(summaries)


def batches(steps: Iterator[Step], dealer: Dealer) -> Iterator[list[list[Step]]]:
    """Each worker's share of the steps, BATCH steps (or BATCH_ROWS rows) at a time."""
    batch: list[list[Step]] = [[] for _ in range(dealer.jobs)]
    rows = 0
    for step in steps:
        for i, part in enumerate(dealer.deal(step)):
            batch[i].append(part)
        rows += len(step.gpus)
        if len(batch[0]) >= BATCH or rows >= BATCH_ROWS:
            yield batch
            batch, rows = [[] for _ in range(dealer.jobs)], 0
    yield batch


def _send(workers: list[tuple[Any, Connection, Path]], batches: list[list[Step]] | None) -> None:
    for i, (process, conn, _) in enumerate(workers):
        message = None if batches is None else batches[i]
        if message is not None and not message:
            continue
        try:
            conn.send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            raise BacktestError(_failure(process, conn)) from None


def _failure(process: Any, conn: Connection) -> str:
    with contextlib.suppress(EOFError, OSError):
        if conn.poll(5):
            kind, detail = conn.recv()
            if kind == "error":
                return detail
    return f"a replay worker ended with status {process.exitcode}"


def _result(process: Any, conn: Connection) -> ReplaySummary:
    while True:
        if conn.poll(1.0):
            try:
                kind, detail = conn.recv()
            except EOFError:
                raise BacktestError(_failure(process, conn)) from None
            if kind == "error":
                raise BacktestError(detail)
            return detail
        if not process.is_alive():
            raise BacktestError(_failure(process, conn))


def merge(summaries: list[ReplaySummary]) -> ReplaySummary:
    """One summary of the workers': every GPU's coverage (a GPU in two workers summed), every engine's GPUs."""
    gpus: dict[Any, GpuCoverage] = {}
    targets: dict[str, set] = {}
    for summary in summaries:
        for key, cover in summary.gpus.items():
            held = gpus.get(key)
            if held is None:
                gpus[key] = replace(cover, missing=set(cover.missing), targets=set(cover.targets))
                continue
            held.first, held.last = min(held.first, cover.first), max(held.last, cover.last)
            held.steps += cover.steps
            held.measured += cover.measured
            held.headroom += cover.headroom
            held.judged_seconds += cover.judged_seconds
            held.missing |= cover.missing
            held.targets |= cover.targets
        for name, keys in summary.targets.items():
            targets.setdefault(name, set()).update(keys)
    first = summaries[0]
    return ReplaySummary(
        start=min(s.start for s in summaries),
        end=max(s.end for s in summaries),
        steps=max(s.steps for s in summaries),
        step_seconds=first.step_seconds,
        gpus=dict(sorted(gpus.items())),
        targets=targets,
        samples=sum(s.samples for s in summaries),
        trend_errors=sum(s.trend_errors for s in summaries),
        loads_inferred=sum(s.loads_inferred for s in summaries),
        engines_inferred=set().union(*(s.engines_inferred for s in summaries)),
    )


def jobs_for(requested: int | None, keys: int, large: bool) -> int:
    """How many workers: `requested` (--jobs), else the CPUs (at most MAX_JOBS) for a large history with engines
    or GPUs to share out; 1 for a short one."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1  # see replay_parallel
    if requested is not None:
        return max(1, min(requested, max(keys, 1)))
    try:
        import os

        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = 1
    return max(1, min(cpus, MAX_JOBS, keys)) if large else 1
