"""journald JSON, cgroup memory.events, the kernel log and NVML XID events."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from oomguard.exporter.events.cgroup import CgroupOomReader
from oomguard.exporter.events.journald import JournaldReader, parse_json_lines
from oomguard.exporter.events.kernel import KmsgReader
from oomguard.exporter.events.xid import XidSource
from oomguard.exporter.model import Event, ReadStats
from oomguard.simulate.fake_nvml import FakeGpu, FakeNvml

RECORDED = Path(__file__).with_name("fixtures") / "journalctl-vllm.json"


def test_journald_json_reader_on_recorded_output() -> None:
    stats = ReadStats()
    lines, cursor = parse_json_lines(RECORDED.read_text(), stats)
    assert len(lines) == 5
    assert lines[1].endswith("EngineCore encountered a fatal error.")
    # A MESSAGE that is not valid UTF-8 comes as a list of bytes: decoded, the bad byte replaced.
    assert lines[3].startswith("(EngineCore pid=4242) torch.OutOfMemoryError: CUDA out of memory.")
    assert lines[3].endswith("\ufffd")
    assert cursor == "s=1a2b;i=105;b=c0ffee;m=5;t=5f4;x=5"
    assert stats.read_errors == 1 and "not JSON" in stats.last_error


def test_journald_reader_resumes_after_its_cursor(tmp_path: Path) -> None:
    """journalctl itself is stood in for by a script printing the recorded entries after the cursor."""
    fake = tmp_path / "journalctl"
    fake.write_text(
        "#!/usr/bin/env python3\n"
        "import sys\n"
        f"lines = open({str(RECORDED)!r}).read().splitlines()[:5]\n"
        "args = sys.argv[1:]\n"
        "if '-n' in args: lines = lines[-int(args[args.index('-n') + 1]):]\n"
        "if '--after-cursor' in args:\n"
        "    c = args[args.index('--after-cursor') + 1]\n"
        "    i = next(i for i, l in enumerate(lines) if c in l)\n"
        "    lines = lines[i + 1:]\n"
        "print('\\n'.join(lines))\n"
    )
    fake.chmod(0o755)
    reader = JournaldReader("vllm.service", binary=str(fake))
    assert reader.poll() == []  # first start: from the end
    assert reader.cursor.endswith("x=5")
    resumed = JournaldReader("vllm.service", binary=str(fake), state={"cursor": "s=1a2b;i=102;b=c0ffee;m=2;t=5f1;x=2"})
    assert [line[:21] for line in resumed.poll()] == [
        "(EngineCore pid=4242)",
        "(EngineCore pid=4242)",
        "INFO 12-02 12:02:40 [",
    ]
    assert resumed.poll() == []


def test_journald_on_this_machine() -> None:
    if shutil.which("journalctl") is None:
        pytest.skip("journalctl is not installed here: the recorded-output tests above cover the reader")
    probe = subprocess.run(["journalctl", "-n", "1", "-o", "json", "--no-pager"], capture_output=True, text=True)
    if probe.returncode != 0 or not probe.stdout.strip():
        pytest.skip(f"journald has no journal here (no systemd in this container: {probe.stderr.strip()[:80]!r}); "
                    "the recorded-output tests above cover the reader")  # fmt: skip
    reader = JournaldReader("systemd-journald.service", from_start=True)
    reader.poll()
    assert reader.stats.read_errors == 0


def test_journalctl_missing_is_a_read_error_not_a_crash() -> None:
    reader = JournaldReader("vllm.service", binary="/nonexistent/journalctl")
    assert reader.poll() == [] and reader.stats.read_errors == 1
    assert reader.cursor is None and reader.poll() == [] and reader.stats.read_errors == 2  # the probe is tried again


def test_journald_first_start_on_an_empty_journal_reads_from_now_on(tmp_path: Path) -> None:
    fake = tmp_path / "journalctl"
    fake.write_text(f'#!/bin/sh\ncase " $* " in *" -n "*) exit 0;; esac\ncat {RECORDED}\n')
    fake.chmod(0o755)
    reader = JournaldReader("vllm.service", binary=str(fake))
    assert reader.poll() == [] and reader.cursor is None  # empty for this unit: no cursor to start after
    assert len(reader.poll()) == 5  # what the unit wrote since, from its start
    assert reader.cursor == "s=1a2b;i=105;b=c0ffee;m=5;t=5f4;x=5"


def test_cgroup_oom_kills(tmp_path: Path) -> None:
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n")
    reader = CgroupOomReader(str(tmp_path))
    assert reader.read_new() == 0  # the first read is the baseline: kills before we watched are not ours
    events.write_text("low 0\nhigh 0\nmax 15\noom 5\noom_kill 4\noom_group_kill 0\n")
    assert reader.read_new() == 2
    resumed = CgroupOomReader(str(tmp_path), state=reader.state())
    events.write_text("low 0\nhigh 0\nmax 15\noom 6\noom_kill 5\noom_group_kill 0\n")
    assert resumed.read_new() == 1
    events.unlink()
    assert (
        resumed.read_new() == 0 and resumed.stats.read_errors == 1 and "memory controller" in resumed.stats.last_error
    )


def test_kmsg_reader_on_the_real_device() -> None:
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable here: the record forms are tested in test_kernel_kills.py")
    reader = KmsgReader(from_start=True)
    records = reader.poll()
    assert reader.stats.read_errors == 0
    assert records and reader.last_seq is not None  # the boot messages
    resumed = KmsgReader(from_start=True, state=reader.state())
    assert resumed.poll() == []  # nothing is read twice
    fresh = KmsgReader()
    assert fresh.poll() == []  # first start: from the end


def test_unreadable_kernel_log_is_one_error() -> None:
    reader = KmsgReader("/nonexistent/kmsg")
    assert reader.poll() == [] and reader.stats.read_errors == 1


def taken(source: XidSource, n: int) -> list[Event]:
    """Poll until the thread has seen `n` events (NVML's waits are in a thread of the source's own)."""
    events: list[Event] = []
    deadline = time.time() + 5
    while sum(e.count for e in events) < n and time.time() < deadline:
        events += source.poll(time.time())
        time.sleep(0.02)
    return events


def test_xid_events_by_gpu_and_code_as_the_runner_takes_them() -> None:
    lib = FakeNvml([FakeGpu(0), FakeGpu(1), FakeGpu(2, unsupported={"nvmlDeviceRegisterEvents"})])
    source = XidSource(lib)
    try:
        assert source.poll(time.time()) == []  # starts the wait
        for event in [(1, 79), (1, 79), (0, 31)]:
            lib.xid_queue.put(event)
        events = taken(source, 3)
    finally:
        assert source.close() == []
    by_key: dict[tuple[int | None, int | None], int] = {}
    for e in events:
        assert e.kind == "xid" and e.timestamp > 1.7e9
        by_key[(e.gpu, e.code)] = by_key.get((e.gpu, e.code), 0) + e.count
    assert by_key == {(1, 79): 2, (0, 31): 1}
    assert lib.calls["nvmlEventSetFree"] == 1
    assert source.health().read_errors == 0 and source.state() == {}


def test_a_storm_of_one_xid_is_held_as_one_entry_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    lib = FakeNvml([FakeGpu(0)])
    source = XidSource(lib)
    source.poll(time.time())
    try:
        with caplog.at_level("ERROR", "oomguard.exporter.events.xid"):
            for _ in range(500):
                lib.xid_queue.put((0, 13))
            deadline = time.time() + 5
            while lib.xid_queue.qsize() and time.time() < deadline:
                time.sleep(0.02)
            time.sleep(0.05)  # the last one taken from the queue is counted
    finally:
        held = source.close()  # what no poll took: given to the runner at its close
    assert [(e.gpu, e.code, e.count) for e in held] == [(0, 13, 500)]
    assert caplog.text.count("XID 13") == 1


def test_xid_without_a_driver_stays_quiet() -> None:
    source = XidSource(FakeNvml(library_present=False))
    assert source.poll(time.time()) == []
    assert source.close() == [] and source.health().read_errors == 0
