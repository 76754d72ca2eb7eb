"""Finding a local engine's processes by the port it listens on: real processes, real /proc."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from oomguard.exporter.sources import processes
from oomguard.exporter.sources.process_lookup import ProcessLookup
from oomguard.exporter.sources.processes import ProcessFinder
from oomguard.exporter.sources.source_runs import SourceRuns

# An "engine": listens on a port (unless LISTEN=0, as while a model loads) and has a worker child.
ENGINE = """
import os, socket, subprocess, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
if os.environ.get("LISTEN", "1") == "1":
    s.listen()
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(s.getsockname()[1], worker.pid, flush=True)
time.sleep(600)
"""


class Engine:
    def __init__(self, listen: bool = True) -> None:
        env = {**os.environ, "LISTEN": "1" if listen else "0"}
        self.proc = subprocess.Popen([sys.executable, "-c", ENGINE], stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        port, worker = self.proc.stdout.readline().split()
        self.port, self.worker_pid = int(port), int(worker)

    def stop(self) -> None:
        for pid in (self.worker_pid, self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        self.proc.wait()


@pytest.fixture
def engine() -> Iterator[Engine]:
    e = Engine()
    yield e
    e.stop()


def test_finds_the_listener_and_its_worker(engine: Engine) -> None:
    trees = ProcessFinder().find_all([engine.port, 1])  # nothing listens on port 1
    tree = trees[engine.port]
    assert trees[1] is None
    assert tree is not None
    assert tree.root_pid == engine.proc.pid
    assert tree.pids == {engine.proc.pid, engine.worker_pid}
    rss = sum(psutil.Process(pid).memory_info().rss for pid in tree.pids)
    assert abs(tree.resident_bytes - rss) < 4 * 2**20  # read at nearly the same moment
    assert abs(tree.start_time_seconds - psutil.Process(engine.proc.pid).create_time()) < 1.0
    assert tree.cmdline == tuple(psutil.Process(engine.proc.pid).cmdline())


def test_known_listener_is_not_searched_again(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    finder = ProcessFinder()
    first = finder.find_all([engine.port])[engine.port]
    scans = []
    real = psutil.net_connections
    monkeypatch.setattr(psutil, "net_connections", lambda *a: scans.append(a) or real(*a))
    again = finder.find_all([engine.port])[engine.port]
    assert scans == []  # the socket scan reads all of /proc/net/tcp*: only for an unknown listener
    assert again is not None and first is not None and again.root_pid == first.root_pid
    assert again.start_time_seconds == first.start_time_seconds  # stable, or restarts would be miscounted


def test_a_known_family_is_read_pid_by_pid_without_listing_proc(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing every process on the host is what a busy host cannot afford on each scrape (a
    loaded 2-core machine took seconds): once the engine's family is known it is re-read by pid."""
    finder = ProcessFinder()
    first = finder.find_all([engine.port])[engine.port]
    listings = []
    real = processes._children_by_parent
    monkeypatch.setattr(processes, "_children_by_parent", lambda: listings.append(1) or real())
    again = finder.find_all([engine.port])[engine.port]
    assert listings == []
    assert again is not None and first is not None and again.pids == first.pids
    # A member whose start tick changed (it exited and its pid was reused): /proc is listed again.
    root, listed_at, ticks = finder._family[engine.port]
    finder._family[engine.port] = (root, listed_at, {**ticks, engine.worker_pid: ticks[engine.worker_pid] - 1})
    after = finder.find_all([engine.port])[engine.port]
    assert listings == [1]
    assert after is not None and after.pids == first.pids


def test_a_known_family_is_listed_again_after_the_rescan_interval(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker started after the first look is found within FAMILY_RESCAN_SECONDS."""
    finder = ProcessFinder()
    finder.find_all([engine.port])
    listings = []
    real = processes._children_by_parent
    monkeypatch.setattr(processes, "_children_by_parent", lambda: listings.append(1) or real())
    now = time.monotonic()
    monkeypatch.setattr(processes.time, "monotonic", lambda: now + processes.FAMILY_RESCAN_SECONDS + 1)
    assert finder.find_all([engine.port])[engine.port] is not None
    assert listings == [1]


def test_gone_listener_is_searched_again_and_not_found(engine: Engine) -> None:
    finder = ProcessFinder()
    assert finder.find_all([engine.port])[engine.port] is not None
    engine.stop()
    assert finder.find_all([engine.port]) == {engine.port: None}


def test_restart_is_seen_by_command_line_while_the_new_process_loads(engine: Engine) -> None:
    finder = ProcessFinder()
    assert finder.find_all([engine.port])[engine.port] is not None
    assert not finder.restarted(engine.port)  # the same process still runs
    engine.stop()
    time.sleep(0.02)  # start ticks are 10 ms apart: the new process starts strictly later
    loading = Engine(listen=False)  # same command line, not listening yet
    try:
        assert finder.restarted(engine.port)
    finally:
        loading.stop()
    assert not finder.restarted(engine.port)


async def test_sampler_reuses_a_lookup_that_found_every_engine_but_not_one_that_missed() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))  # bound, not listening yet: an engine loading its model
    port = listener.getsockname()[1]
    source_runs = SourceRuns()
    lookup = ProcessLookup(ProcessFinder(), [port], source_runs)
    try:
        lookups = []
        real = lookup.finder.find_all
        lookup.finder.find_all = lambda ports: lookups.append(ports) or real(ports)  # type: ignore[method-assign]
        assert await lookup.get(max_age=60) == {port: None}
        listener.listen()
        found = await lookup.get(max_age=60)  # a miss is not reused
        assert found[port] is not None and found[port].root_pid == os.getpid()
        assert await lookup.get(max_age=60) is found  # a hit is
        assert len(lookups) == 2
        assert source_runs.results()["processes"].success  # every lookup is recorded as a source's run
    finally:
        listener.close()


async def test_scrape_looks_again_so_a_killed_engine_is_not_reported(engine: Engine) -> None:
    lookup = ProcessLookup(ProcessFinder(), [engine.port], SourceRuns())
    assert (await lookup.get(max_age=60))[engine.port] is not None
    engine.stop()
    assert await lookup.get() == {engine.port: None}  # max_age 0: as a scrape asks


async def test_a_failed_lookup_is_recorded_and_yields_no_processes() -> None:
    source_runs = SourceRuns()
    finder = ProcessFinder()

    def broken(ports: list[int]) -> dict:
        raise PermissionError("no /proc here")

    finder.find_all = broken  # type: ignore[method-assign]
    assert await ProcessLookup(finder, [1], source_runs).get() == {}
    assert not source_runs.results()["processes"].success


def test_a_known_engine_is_read_without_psutil_its_command_line_kept(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once an engine's family is known, a lookup reads its memory from /proc alone: its command line and start
    time are those of the last listing (the same process: its start tick is checked), not read again."""
    finder = ProcessFinder()
    first = finder.find_all([engine.port])[engine.port]
    assert first is not None and first.cmdline and first.cmdline[0] == sys.executable

    def no_psutil(pid: int) -> psutil.Process:
        raise AssertionError(f"psutil.Process({pid}) on a known engine")

    monkeypatch.setattr(processes.psutil, "Process", no_psutil)
    again = finder.find_all([engine.port])[engine.port]
    assert again is not None
    assert (again.root_pid, again.pids, again.cmdline) == (first.root_pid, first.pids, first.cmdline)
    assert again.start_time_seconds == first.start_time_seconds
    assert again.resident_bytes > 0
    engine.stop()
    assert finder.find_all([engine.port])[engine.port] is None  # gone: not served from what was kept
