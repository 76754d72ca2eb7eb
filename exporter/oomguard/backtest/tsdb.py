"""The replayed series in a throwaway TSDB, and a real Prometheus over it to evaluate the rules.

The series are written as OpenMetrics text, one file per two hours of history (the TSDB's block: `promtool tsdb
create-blocks-from openmetrics` reads its file once for its bounds and once per block, so a file of one block is
read twice, whatever the history's length), each backfilled by promtool while the replay goes on, at most
BACKFILLS at once, and deleted once in its block. Then the Debian package's Prometheus starts on a free loopback
port over those blocks (no scrape, no rule of its own: the rules are evaluated through its HTTP API, rules.py),
and is stopped with the backtest.

`--query.lookback-delta` is set from the history's step: a live Prometheus writes a stale marker the moment a
series is gone from a scrape (a GPU lost, a trend state that ends, seconds_to_full once the climb stops), and an
alert on it ends at its next evaluation; a backfilled block has no stale markers, and with the default 5 minutes
of lookback a series gone would be read for 5 more minutes. A lookback of 1.5 steps reads a series until its next
sample is due, then no more, as the stale marker would.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import yaml

from oomguard.backtest import BacktestError
from oomguard.common.excerpt import excerpt
from oomguard.common.ports import free_port
from oomguard.common.served_process import ServedProcess

BLOCK_SECONDS = 7200  # the TSDB's block, to which promtool aligns the blocks it writes
BACKFILLS = 2  # promtool processes at once (each holds one block's samples: a few MB)
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}  # for the main thread alone: see Backfill._close_file
PROMTOOL_TIMEOUT = 300.0  # one block's backfill
START_TIMEOUT = 60.0  # Prometheus ready, its blocks opened
QUERY_TIMEOUT = 120.0  # one query (Prometheus' own --query.timeout is set to it too)
MAX_ANSWER_BYTES = 256 * 1024**2
# Prometheus refuses a range query of more than 11,000 points per series.
MAX_POINTS = 10_000


def find_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BacktestError(
            f"{name} not found: backtest evaluates the rules with a real Prometheus; install Debian's prometheus "
            "package (apt-get install prometheus), which brings prometheus and promtool"
        )
    return path


class Backfill:
    """OpenMetrics files by block, each handed to promtool once its block is complete (times only go forward).

    The backfills run on BACKFILLS daemon threads fed through `queue.SimpleQueue`s, not a ThreadPoolExecutor: a stop
    signal raises where the main thread is, and raised while it held a future's lock (Python releases none it took
    just before) it left a pool thread waiting for that lock in `set_result`, and the executor's shutdown, and the
    interpreter's exit, waiting for that thread: a stopped backtest hung (seen in test_command.py's signal test).
    The main thread here takes no lock a backfill thread needs, and nothing waits for those threads at exit."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.blocks = workdir / "blocks"
        self.blocks.mkdir(parents=True, exist_ok=True)
        self.promtool = find_binary("promtool")
        self._todo: queue.SimpleQueue[tuple[Path, Path] | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self._pending = 0  # handed over and not yet collected (the main thread's count)
        self._threads: list[threading.Thread] = []  # started with the first file (none before a fork)
        self._lock = threading.Lock()  # the backfill threads' and abort()'s
        self._running: set[subprocess.Popen[str]] = set()
        self._aborted = False
        self._block: int | None = None
        self._file: Any = None
        self._path: Path | None = None
        self.files = 0

    def write(self, t: float, lines: list[str]) -> None:
        block = int(t // BLOCK_SECONDS)
        if block != self._block:
            self._close_file()
            self._block = block
            self._path = self.workdir / f"series-{block}.om"
            self._file = self._path.open("w", encoding="utf-8")
            self.files += 1
        self._file.writelines(lines)
        self._raise_failed()

    def _close_file(self) -> None:
        if self._file is None:
            return
        self._file.write("# EOF\n")
        self._file.close()
        path, self._file = self._path, None
        assert path is not None
        if not self._threads:
            self._threads = [
                threading.Thread(target=self._serve, name=f"promtool-{i}", daemon=True) for i in range(BACKFILLS)
            ]
            # Started with the stop signals blocked (a thread keeps the mask it starts with): the kernel hands a
            # process's signal to any thread that takes it, and one taken by a backfill thread left the main thread
            # asleep in a read (a replay worker waiting for steps), its handler never run: a stopped backtest
            # hung until its parent gave up on it (test_command.py's signal test, 1 run in 12 under load).
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                for thread in self._threads:
                    thread.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        self._todo.put((path, self.workdir / f"out-{path.stem}"))
        self._pending += 1

    def _serve(self) -> None:
        while (job := self._todo.get()) is not None:
            try:
                self._backfill(*job)
            except BaseException as exc:  # handed to the main thread, which raises it
                self._done.put(exc)
            else:
                self._done.put(None)

    def _backfill(self, path: Path, out: Path) -> None:
        # Its TMPDIR is the backtest's folder: promtool makes its head there ("head<digits>"), which a kill would
        # otherwise leave in the user's /tmp.
        command = [self.promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(path), str(out)]
        with self._lock:
            if self._aborted:
                return
            process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env={**os.environ, "TMPDIR": str(self.workdir)},
            )  # fmt: skip
            self._running.add(process)
        try:
            stdout, stderr = process.communicate(timeout=PROMTOOL_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise BacktestError(f"promtool took over {PROMTOOL_TIMEOUT:g}s to backfill {path.name}") from None
        finally:
            with self._lock:
                self._running.discard(process)
        if self._aborted:
            return  # killed by abort(): its folder is being removed
        if process.returncode != 0:
            raise BacktestError(
                f"promtool could not backfill the replayed series ({path.name}): "
                f"{excerpt((stderr or stdout).strip(), 1000)}"
            )
        path.unlink()
        for block in out.iterdir():
            block.rename(self.blocks / block.name)
        out.rmdir()

    def _collect(self, outcome: BaseException | None) -> None:
        self._pending -= 1
        if outcome is not None:
            raise outcome

    def _raise_failed(self) -> None:
        while True:
            try:
                outcome = self._done.get_nowait()
            except queue.Empty:
                return
            self._collect(outcome)

    def finish(self) -> Path:
        """Waits for every backfill; the folder of the blocks."""
        self._close_file()
        try:
            while self._pending:
                self._collect(self._done.get())
        except BaseException:  # an error, or a stop signal while waiting: the others are not waited for
            self.abort()
            raise
        self._end_threads()
        return self.blocks

    def abort(self) -> None:
        """Stops at once (a stop signal, an error): the backfills running are killed, not waited for (one may take
        minutes on a busy machine), and none starts after."""
        with contextlib.suppress(Exception):
            if self._file is not None:
                self._file.close()
        with self._lock:
            self._aborted = True
            for process in self._running:
                with contextlib.suppress(OSError):
                    process.kill()
        self._end_threads()

    def _end_threads(self) -> None:
        for _ in self._threads:
            self._todo.put(None)


class Prometheus:
    """The Debian package's Prometheus over the backfilled blocks, on loopback."""

    # Those started and not stopped, for a stop signal to end at once (command.py): the queries in flight then fail
    # at once instead of being answered, and the way out does not wait for them.
    running: ClassVar[set[Prometheus]] = set()

    def __init__(self, workdir: Path, blocks: Path, lookback_seconds: float) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump({"global": {"evaluation_interval": "1h"}, "scrape_configs": []}))
        lookback = max(1, round(lookback_seconds * 1000))
        self.command = [
            find_binary("prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={blocks}",
            # The history may be years old: no block is old enough to be deleted.
            "--storage.tsdb.retention.time=100y",
            f"--web.listen-address=127.0.0.1:{self.port}",
            f"--query.lookback-delta={lookback}ms",
            f"--query.timeout={QUERY_TIMEOUT:g}s",
            "--log.level=warn",
        ]
        self.process = ServedProcess(self.command, workdir / "prometheus.log", f"{self.url}/-/ready",
                                     error=BacktestError)  # fmt: skip

    def start(self) -> None:
        Prometheus.running.add(self)
        self.process.start(START_TIMEOUT, poll_seconds=0.05)

    def log_tail(self, lines: int = 20) -> str:
        return self.process.log_tail(lines)

    def stop(self) -> None:
        self.process.stop()
        Prometheus.running.discard(self)

    @classmethod
    def end_all(cls) -> None:
        """Kills every Prometheus started and not stopped, without waiting (a signal handler's): what it holds is
        the replay's, thrown away. Its `stop` then reaps it."""
        for prometheus in list(cls.running):
            process = prometheus.process.proc
            if process is not None:
                with contextlib.suppress(OSError):
                    process.kill()

    def __enter__(self) -> Prometheus:
        try:
            self.start()
        except BaseException:  # a signal while it starts (command.py): stopped all the same
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def query_range_chunks(self, expr: str, start: float, end: float, step: float) -> Iterator[list[dict[str, Any]]]:
        """A range query's answers, a chunk of at most MAX_POINTS steps at a time."""
        at = start
        while at <= end:
            until = min(end, at + step * (MAX_POINTS - 1))
            yield self._range(expr, at, until, step)
            at = until + step

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """One range query, split into ranges of at most MAX_POINTS steps; the series' values joined."""
        joined: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        at = start
        while at <= end:
            until = min(end, at + step * (MAX_POINTS - 1))
            for series in self._range(expr, at, until, step):
                key = tuple(sorted(series["metric"].items()))
                held = joined.setdefault(key, {"metric": series["metric"], "values": []})
                held["values"].extend(series["values"])
            at = until + step
        return list(joined.values())

    def _range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return self._api("query_range", params)["result"]

    def _api(self, path: str, params: dict[str, str]) -> Any:
        data = urllib.parse.urlencode(params).encode()
        request = urllib.request.Request(f"{self.url}/api/v1/{path}", data=data)
        try:
            with urllib.request.urlopen(request, timeout=QUERY_TIMEOUT + 10) as response:
                body = response.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as exc:
            detail = exc.read(2000).decode("utf-8", "replace")
            with contextlib.suppress(ValueError, AttributeError):
                detail = json.loads(detail).get("error", detail)
            raise BacktestError(
                f"the backtest's Prometheus refused {excerpt(params.get('query', ''))!r}: {detail}"
            ) from None
        except OSError as exc:
            raise BacktestError(f"the backtest's Prometheus did not answer: {exc}\n{self.log_tail()}") from None
        if len(body) > MAX_ANSWER_BYTES:
            raise BacktestError(f"the backtest's Prometheus answered more than {MAX_ANSWER_BYTES:,} bytes")
        answer = json.loads(body)
        if answer.get("status") != "success":
            raise BacktestError(f"the backtest's Prometheus refused a query: {answer.get('error', answer)}")
        return answer["data"]
