"""Real kernel OOM kills: processes over their memory cgroup's limit, read by the real exporter from /dev/kmsg.

Where the machine allows it (root, a memory controller to make a cgroup with, a readable /dev/kmsg),
each test makes cgroups of its own with a 64 MiB limit and, in each, a process that listens on a
port (so that the exporter's process lookup finds it as a target's engine) and then allocates
300 MiB when told to. The kernel kills it and writes its records; the exporter behind make_app
must count each kill exactly once for the host and once for its target, and nothing again
after a restart. Elsewhere the tests skip, saying what is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import samples

from oomguard.exporter.config_loader import load_config
from oomguard.exporter.events.kernel_records import KILLED, parse
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import RUNTIME, make_app

LIMIT = 64 * 1024 * 1024
V2_ROOT = Path("/sys/fs/cgroup")
V1_MEMORY = Path("/sys/fs/cgroup/memory")

# Joins the cgroup named by argv[1], listens on a port, says which, waits for a line, then takes 300 MiB.
VICTIM = """
import socket, sys
with open(sys.argv[1] + "/cgroup.procs", "w") as f:
    f.write("0")
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()
print(listener.getsockname()[1], flush=True)
sys.stdin.readline()
hog = bytearray(300 * 1024 * 1024)
print("survived", flush=True)
"""


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "not root: making a cgroup with a memory limit needs root"
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        os.close(fd)
    except OSError as exc:
        return f"/dev/kmsg is not readable here ({exc.strerror}): kernel OOM kills cannot be read"
    if "memory" in _v2_controllers():
        return None
    if (V1_MEMORY / "memory.limit_in_bytes").is_file():
        return None
    return "no memory controller: neither cgroup v2's nor v1's memory hierarchy is mounted under /sys/fs/cgroup"


def _v2_controllers() -> str:
    try:
        return (V2_ROOT / "cgroup.controllers").read_text()
    except OSError:
        return ""


def _make_cgroup(name: str) -> Path:
    """A cgroup of our own at LIMIT, no swap; v2 where its memory controller is there, else v1's."""
    if "memory" in _v2_controllers():
        path = V2_ROOT / name
        path.mkdir()
        (path / "memory.max").write_text(str(LIMIT))
        with contextlib.suppress(OSError):
            (path / "memory.swap.max").write_text("0")
        return path
    path = V1_MEMORY / name
    path.mkdir()
    (path / "memory.limit_in_bytes").write_text(str(LIMIT))
    with contextlib.suppress(OSError):  # memsw exists only with swap accounting
        (path / "memory.memsw.limit_in_bytes").write_text(str(LIMIT))
    return path


def _remove_cgroup(path: Path) -> None:
    with contextlib.suppress(OSError, ValueError):  # a victim a failed test left alive
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                os.kill(int(pid), 9)
    deadline = time.monotonic() + 10
    while True:  # a killed process leaves its cgroup a moment after its death
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture
def cgroups() -> Iterator[list[Path]]:
    if (why := _why_not()) is not None:
        pytest.skip(why)
    made: list[Path] = []
    try:
        for role in ("engine", "caged"):
            made.append(_make_cgroup(f"oomguard-test-{os.getpid()}-{role}"))
        yield made
    finally:
        for path in made:
            _remove_cgroup(path)


class Victim:
    def __init__(self, cgroup: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", VICTIM, str(cgroup)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline())

    def overcommit(self) -> int:
        """Take 300 MiB: the kernel kills it. Its exit code."""
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        return self.process.wait(timeout=30)


def last_kill_seq(pid: int) -> int | None:
    """The sequence number of the kernel log's `Killed process PID` record, once it is there."""
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    found = None
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode(errors="replace")
            except BlockingIOError:
                return found
            except OSError:  # records overwritten while we read: go on
                continue
            header, _, message = record.partition(";")
            parsed = parse(message.splitlines()[0] if message else "", 0)
            if parsed is not None and parsed.form == KILLED and parsed.pid == pid:
                found = int(header.split(",")[1])
    finally:
        os.close(fd)


async def kill_recorded(pid: int) -> int:
    """The sequence number of the kernel's `Killed process PID` record, waiting for it (a deadline of 10 s)."""
    deadline = time.monotonic() + 10
    while (seq := last_kill_seq(pid)) is None:
        assert time.monotonic() < deadline, f"the kernel wrote no Killed process record for pid {pid}"
        await asyncio.sleep(0.05)
    return seq


async def wait_until_read(runtime: Runtime, seq: int) -> None:
    """Until the exporter's kernel log reader has read past `seq` (a deadline, never a bare sleep)."""
    events = runtime._events
    assert events is not None
    reader = next(s.reader for s in events.sources if s.name == "kernel:/dev/kmsg")  # type: ignore[attr-defined]
    deadline = time.monotonic() + 20
    while reader.last_seq is None or reader.last_seq < seq:
        assert time.monotonic() < deadline, f"the kernel log was not read up to record {seq} in 20 s"
        await asyncio.sleep(0.05)
    # The poll that read it is over when the lock is free: its events are counted.
    await asyncio.to_thread(events.health)


def config(tmp_path: Path, engine_port: int, caged: Path) -> object:
    return load_config(
        None,
        {
            "targets": [
                {"name": "engine", "url": f"http://127.0.0.1:{engine_port}", "local_process": "yes"},
                {"name": "caged", "url": "http://127.0.0.1:9", "local_process": "no", "cgroup": str(caged)},
            ],
            "state_dir": str(tmp_path / "state"),
            "scrape": {"timeout_seconds": 0.5},
            "nvml": {"enabled": False},
            "trend": {"enabled": False},
            "discovery": {"local": "off"},
            "events": {"kernel_log": True, "xid": False, "poll_interval_seconds": 0.1},
        },
    )


async def counts(client) -> tuple[float, float, float]:
    """(the host's kernel OOM kills, the engine's and the caged target's kills); a series not yet born is 0."""
    found = samples(await (await client.get("/metrics")).text())

    def count(name: str, **labels: str) -> float:
        return found.get((name, tuple(sorted(labels.items()))), 0.0)

    return (
        count("oomguard_host_events_total", kind="kernel_oom_kill"),
        count("oomguard_target_events_total", kind="cgroup_oom_kill", target="engine"),
        count("oomguard_target_events_total", kind="cgroup_oom_kill", target="caged"),
    )


async def test_each_real_kill_counts_once_for_the_host_and_once_for_its_target(
    cgroups: list[Path], tmp_path: Path, aiohttp_client
) -> None:
    engine_cgroup, caged_cgroup = cgroups
    engine = Victim(engine_cgroup)
    caged = Victim(caged_cgroup)
    cfg = config(tmp_path, engine.port, caged_cgroup)
    client = await aiohttp_client(make_app(Runtime(cfg, nvml_lib=None)))
    runtime = client.app[RUNTIME]
    # A scrape looks the engine's process up on its port: its pid is the target's from then on.
    await client.get("/metrics")
    assert await counts(client) == (0, 0, 0)

    # The engine's process is killed: the host's kill, and the engine's (its pid); counted once each.
    assert engine.overcommit() == -9
    seq = await kill_recorded(engine.process.pid)
    await wait_until_read(runtime, seq)
    assert await counts(client) == (1, 1, 0)

    # The caged target's process: its cgroup's counter counts it, the kernel log does not count it again for it.
    assert caged.overcommit() == -9
    seq = await kill_recorded(caged.process.pid)
    await wait_until_read(runtime, seq)
    deadline = time.monotonic() + 10
    while (now := await counts(client))[2] < 1:  # the cgroup's counter is read on the next poll
        assert time.monotonic() < deadline, f"the caged target's kill was not counted: {now}"
        await asyncio.sleep(0.05)
    assert now == (2, 1, 1)
    await client.close()

    # Restarted: the state file holds every count and the kernel log's position; nothing is counted again.
    client = await aiohttp_client(make_app(Runtime(cfg, nvml_lib=None)))
    runtime = client.app[RUNTIME]
    await client.get("/metrics")
    await wait_until_read(runtime, seq)
    assert await counts(client) == (2, 1, 1)
    await client.close()


def test_the_victim_dies_of_its_limit_only(cgroups: list[Path]) -> None:
    """The test's own premise: the victim listens as an engine does, and its hog gets it killed (SIGKILL)."""
    victim = Victim(cgroups[0])
    with socket.create_connection(("127.0.0.1", victim.port), timeout=5):
        pass  # it listens, as an engine does
    assert victim.overcommit() == -9
