"""What makes a stop signal end a replay worker: the signal reaches its main thread, and the parent closing its
pipe reads as the end of the steps.

Both were missing once (test_command.py's signal test hung 1 run in 10 under load): SIGTERM taken by a backfill
thread left the worker's main thread asleep in a pipe read that no one would end, since the worker held the
parent's end of its own pipe too."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from oomguard.backtest.history import GpuRow, Step
from oomguard.backtest.parallel import replay_parallel
from oomguard.backtest.replay import SeriesFilter
from oomguard.backtest.tsdb import BLOCK_SECONDS, Backfill
from oomguard.exporter.config import TrendConfig


def _blocked(native_id: int) -> int:
    """The thread's blocked-signal mask, as the kernel keeps it."""
    for line in Path(f"/proc/self/task/{native_id}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigBlk line")


def _has(mask: int, signum: int) -> bool:
    return bool(mask >> (signum - 1) & 1)


def test_backfill_threads_leave_stop_signals_to_the_main_thread(tmp_path: Path) -> None:
    backfill = Backfill(tmp_path)
    backfill.write(0.0, ['oomguard_x{gpu="0"} 1 0\n'])
    backfill.write(BLOCK_SECONDS, [f'oomguard_x{{gpu="0"}} 1 {BLOCK_SECONDS}\n'])  # the first block is handed over
    try:
        assert backfill._threads  # started with the first file
        for thread in backfill._threads:
            assert thread.native_id is not None
            mask = _blocked(thread.native_id)
            assert _has(mask, signal.SIGTERM) and _has(mask, signal.SIGINT), f"{thread.name} takes stop signals"
        main = _blocked(threading.main_thread().native_id or 0)
        assert not _has(main, signal.SIGTERM) and not _has(main, signal.SIGINT), "the main thread's mask changed"
    finally:
        backfill.abort()


def _sockets(pid: int) -> set[int]:
    """The socket inodes a process holds open."""
    held = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            held.add(int(target[8:-1]))
    return held


def test_each_worker_holds_only_its_own_end_of_its_pipe(tmp_path: Path) -> None:
    """The parent's ends, of its own pipe and of those made for the workers before it, are closed in each worker.

    Waits up to 20 s for a worker to close them, as it does when it starts."""
    ours: dict[int, set[int]] = {}

    def steps() -> Iterator[Step]:
        # Asked for once every worker is started: what each holds of this process's sockets, once it settled.
        mine = _sockets(os.getpid())
        deadline = time.monotonic() + 20
        for child in multiprocessing.active_children():
            assert child.pid is not None
            while True:
                ours[child.pid] = _sockets(child.pid) & mine
                if not ours[child.pid] or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        for i in range(4):
            yield Step(1e9 + 15 * i, gpus=[GpuRow("n", "0", 1e9, 8e10)])

    blocks = tmp_path / "blocks"
    blocks.mkdir()
    replay_parallel(steps(), 3, TrendConfig().settings(), SeriesFilter({}), 300.0, None, tmp_path / "work", blocks)
    assert len(ours) == 3
    # Of the parent's sockets a worker holds none (its own end of its pipe is one the parent closed).
    assert all(not held for held in ours.values()), ours
