"""N known events written while the log rotates: exactly N counted, also across an exporter restart."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import Clock, append_lines

from oomguard.exporter.config import Config
from oomguard.exporter.config_loader import load_config
from oomguard.exporter.events.runner import EventRunner
from oomguard.exporter.events.source import source_health
from oomguard.exporter.model import Event, EventSourceHealth, ReadStats
from oomguard.simulate.fake_nvml import FakeGpu, FakeNvml

N = 40
OOM = [
    "(EngineCore pid={i}) ERROR 12-02 12:00:00 [core.py:701] EngineCore encountered a fatal error.",
    "(EngineCore pid={i}) Traceback (most recent call last):",
    '(EngineCore pid={i})   File "vllm/v1/engine/core.py", line 701, in run_engine_core',
    "(EngineCore pid={i}) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
]
RESTART = "(APIServer pid={i}) INFO 12-02 12:00:05 [api_server.py:1000] vLLM server version 0.32.0, serving model m"
CHATTER = '(APIServer pid={i}) INFO:     127.0.0.1:5555 - "GET /metrics HTTP/1.1" 200 OK'


def runner(tmp_path: Path, clock: Clock, logs: list[str], **events: object) -> EventRunner:
    config = load_config(
        None,
        {
            "state_dir": str(tmp_path / "state"),
            "events": {"kernel_log": False, "quiet_seconds": 5, **events},
            "targets": [{"name": "vllm", "url": "http://127.0.0.1:8000", "logs": logs}],
        },
    )
    return EventRunner(config, clock=clock)


def rotate_rename(log: Path) -> None:
    os.replace(log, log.with_name(log.name + ".1"))
    log.touch()


def rotate_copytruncate(log: Path) -> None:
    shutil.copy(log, log.with_name(log.name + ".1"))
    with log.open("r+") as f:
        f.truncate(0)


def rotate_recreate(log: Path) -> None:
    log.unlink()
    log.touch()


@pytest.mark.parametrize("rotate", [rotate_rename, rotate_copytruncate, rotate_recreate])
@pytest.mark.parametrize("restart_halfway", [False, True])
def test_exactly_n_events_through_rotations(
    tmp_path: Path, rotate: Callable[[Path], None], restart_halfway: bool
) -> None:
    log = tmp_path / "vllm.log"
    log.touch()
    clock = Clock()
    # With rename rotation a glob also matching the rotated files must not read them twice. With
    # copy-truncate it must not match the copies: they are new files, whose lines we already read.
    logs = [str(tmp_path / "vllm.log*")] if rotate is rotate_rename else [str(log)]
    r = runner(tmp_path, clock, logs)
    r.poll()  # first start: from the end of what exists
    for i in range(N):
        lines = [line.format(i=i) for line in OOM]
        # The traceback is flushed in two pieces, with a poll in between.
        append_lines(log, [CHATTER.format(i=i), *lines[:2]])
        r.poll()
        append_lines(log, [*lines[2:], RESTART.format(i=i)])
        if i % 7 == 3:
            # copy-truncate loses what is written between the copy and the truncate: poll first,
            # as logrotate's copytruncate users must accept; rename and recreate lose nothing.
            if rotate is rotate_copytruncate:
                r.poll()
            rotate(log)
        if i % 5 == 0:
            r.poll()
        clock.now += 1
        if restart_halfway and i == N // 2:
            r.close()
            r = runner(tmp_path, clock, logs)
    r.poll()
    clock.now += 10
    r.poll()
    assert r.counts["vllm"].total == {"cuda_oom": N}


def test_incident_open_when_the_exporter_stops_is_counted_once(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.touch()
    clock = Clock()
    r = runner(tmp_path, clock, [str(log)])
    r.poll()
    append_lines(log, [line.format(i=1) for line in OOM[:2]])  # fatal error, the OOM line not yet written
    r.poll()
    r.close()
    append_lines(log, [line.format(i=1) for line in OOM[2:]])
    clock.now += 60  # down for a minute: the incident is closed at the first poll after the restart
    r = runner(tmp_path, clock, [str(log)])
    r.poll()
    clock.now += 10
    r.poll()
    assert r.counts["vllm"].total == {"cuda_oom": 1}
    assert r.counts["vllm"].last["cuda_oom"] == 1000.0  # when its first line was read


def test_broken_sources_do_not_stop_the_others(tmp_path: Path) -> None:
    good = tmp_path / "good.log"
    good.touch()
    garbage = tmp_path / "garbage.log"
    garbage.write_bytes(b"")
    clock = Clock()
    config = load_config(
        None,
        {
            "state_dir": str(tmp_path / "state"),
            "events": {"kernel_log": False, "quiet_seconds": 5},
            "targets": [
                {"name": "good", "url": "http://127.0.0.1:8000", "logs": [str(good)]},
                {"name": "bad", "url": "http://127.0.0.1:8001",
                 "logs": [str(garbage), str(tmp_path / "gone.log"), str(tmp_path)],
                 "journald_unit": "vllm.service", "cgroup": str(tmp_path / "no-cgroup")},
            ],
        },
    )  # fmt: skip
    r = EventRunner(config, clock=clock)
    r.poll()
    with garbage.open("ab") as f:
        f.write(os.urandom(200_000) + b"\n" + b"x" * (10 * 1024 * 1024) + b"\n\xff\xfe\x00 partial")
    append_lines(good, [line.format(i=0) for line in OOM] + [RESTART.format(i=0)])
    r.poll()
    r.poll()
    assert r.counts["good"].total == {"cuda_oom": 1}
    assert "bad" not in r.counts
    health = {(h.target, h.source): h for h in r.health()}
    assert health[("bad", f"cgroup:{tmp_path / 'no-cgroup'}")].read_errors >= 1
    assert health[("bad", "file:" + str(garbage))].lines_read >= 2
    assert health[("good", "file:" + str(good))].read_errors == 0


def test_unwritable_state_dir_is_reported_not_fatal(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state directory should be")
    log = tmp_path / "vllm.log"
    log.touch()
    clock = Clock()
    r = runner(tmp_path, clock, [str(log)])
    r.poll()
    append_lines(log, [line.format(i=0) for line in OOM] + [RESTART.format(i=0)])
    r.poll()
    assert r.counts["vllm"].total == {"cuda_oom": 1} and r.state_write_errors >= 1 and r.has_state


def pod_logs_config(tmp_path: Path, pod_dir: str) -> tuple[Config, Path, Path]:
    """One container's CRI logs under a pods directory: (the configuration, its 0.log, the container dir)."""
    container = tmp_path / "pods" / pod_dir / "vllm"
    container.mkdir(parents=True)
    log = container / "0.log"
    log.touch()
    config = load_config(
        None,
        {
            "state_dir": str(tmp_path / "state"),
            "events": {"kernel_log": False, "quiet_seconds": 5, "k8s_pods_dir": str(tmp_path / "pods")},
            "targets": [
                {"name": "vllm", "url": "http://10.0.0.1:8000",
                 "k8s_pod_logs": {"namespace": "inference", "pod": "vllm-*", "container": "vllm"}},
            ],
        },
    )  # fmt: skip
    return config, log, container


def test_kubernetes_pod_logs(tmp_path: Path) -> None:
    """CRI files under the pods directory, a partial record joined, the kubelet's rotation followed."""
    config, log, container = pod_logs_config(tmp_path, "inference_vllm-7d9f_0a1b2c")
    r = EventRunner(config, clock=Clock())
    r.poll()
    stamp = "2026-12-02T12:00:00.000000000Z"
    lines = [line.format(i=1) for line in OOM]
    cri = [f"{stamp} stderr F {line}" for line in lines[:3]]
    cri += [f"{stamp} stderr P {lines[3][:30]}", f"{stamp} stderr F {lines[3][30:]}"]
    append_lines(log, cri)
    os.replace(log, container / "0.log.20261202-120001")  # the kubelet's rotation
    append_lines(container / "0.log", [f"{stamp} stdout F {RESTART.format(i=2)}"])
    r.poll()
    r.poll()
    assert r.counts["vllm"].total == {"cuda_oom": 1}


def test_a_partial_record_held_when_the_exporter_stops_is_not_lost(tmp_path: Path) -> None:
    """The saved position is past a partial CRI record: it is read into the detector on close, not dropped."""
    config, log, _ = pod_logs_config(tmp_path, "inference_vllm-0_1")
    clock = Clock()
    r = EventRunner(config, clock=clock)
    r.poll()
    stamp = "2026-12-02T12:00:00.000000000Z"
    append_lines(log, [f"{stamp} stderr F (EngineCore pid=1) Traceback (most recent call last):"])
    append_lines(log, [f"{stamp} stderr P (EngineCore pid=1) torch.OutOfMemoryError: CUDA out of memory. "])
    r.poll()
    r.close()  # the runtime cut the line and the exporter stops before its final record
    append_lines(log, [f"{stamp} stderr F Tried to allocate 2.00 GiB."])  # alone, this matches nothing
    clock.now += 1
    r = EventRunner(config, clock=clock)
    r.poll()
    clock.now += 10
    r.poll()
    assert r.counts["vllm"].total == {"cuda_oom": 1}
    assert r.counts["vllm"].last["cuda_oom"] == 1000.0


def test_a_pattern_that_matches_no_file_is_said_once_and_counted_as_following_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A typo in logs: fails nothing: the files followed say it (0), and the log says it once, not every poll."""
    typo = str(tmp_path / "vlm" / "*.log")
    r = runner(tmp_path, Clock(), [typo])
    assert [h.files for h in r.health()] == [None]  # not polled yet: nothing known
    with caplog.at_level("INFO", logger="oomguard.exporter.events.source"):
        for _ in range(3):
            r.poll()
    assert [h.files for h in r.health()] == [0]
    said = [rec.getMessage() for rec in caplog.records if "follows no file" in rec.getMessage()]
    assert len(said) == 1 and f"file:{typo}" in said[0] and "matches nothing" in said[0]
    (tmp_path / "vlm").mkdir()
    append_lines(tmp_path / "vlm" / "a.log", ["x"])
    caplog.clear()
    with caplog.at_level("INFO", logger="oomguard.exporter.events.source"):
        r.poll()
        r.poll()
    assert [h.files for h in r.health()] == [1]
    assert [rec.getMessage() for rec in caplog.records].count(
        f"event source file:{typo} of 'vllm' now follows 1 file(s)"
    ) == 1


class _SlowSource:
    """A source whose poll reads for as long as the test holds it (a slow journalctl, a large file), then
    reports one OOM: the runner holds its lock all the while."""

    name, kinds = "slow", ("cuda_oom",)

    def __init__(self, target: str) -> None:
        self.target = target
        self.reading, self.release = threading.Event(), threading.Event()
        self.stats = ReadStats()

    def poll(self, now: float) -> list[Event]:
        self.reading.set()
        assert self.release.wait(10)
        self.stats.lines_read += 1
        return [Event("cuda_oom", now)]

    def health(self) -> EventSourceHealth:
        return source_health(self, self.stats)

    def state(self) -> dict[str, object]:
        return {}

    def close(self) -> list[Event]:
        return []


def test_a_scrape_reads_the_last_poll_without_waiting_for_the_one_in_progress(tmp_path: Path) -> None:
    """The collection reads `view` on the event loop while a poll runs in a worker thread: it takes no lock
    (the poll holds it for as long as its reads take) and gets dicts no poll changes after it."""
    r = runner(tmp_path, Clock(), [])
    slow = _SlowSource("pod-a")
    r.set_sources("pod-a", [slow])
    before = r.view
    assert "pod-a" not in before.counts and [h.source for h in before.health] == ["slow"]
    poll = threading.Thread(target=r.poll)
    poll.start()
    try:
        assert slow.reading.wait(10)
        started = time.monotonic()
        during = r.view  # the lock is held by the poll: a reader that took it would wait here
        assert time.monotonic() - started < 0.5
        assert during is before
    finally:
        slow.release.set()
        poll.join(10)
    after = r.view
    assert after.counts["pod-a"].total == {"cuda_oom": 1} and after.health[0].lines_read == 1
    assert "pod-a" not in before.counts  # what a scrape held was never changed under it


def test_xid_counts_are_saved_and_go_on_after_an_exporter_restart(tmp_path: Path) -> None:
    """XIDs are an event source like the others: counted by the runner, in its state file, resumed at start."""
    config = load_config(None, {"state_dir": str(tmp_path / "state"), "events": {"kernel_log": False}})

    def counted(r: EventRunner, want: dict[tuple[int, int], int]) -> dict[tuple[int, int], int]:
        deadline = time.time() + 5
        while r.view.xid != want and time.time() < deadline:
            r.poll()
            time.sleep(0.02)
        return r.view.xid

    lib = FakeNvml([FakeGpu(0), FakeGpu(1)])
    first = EventRunner(config, nvml=lib)
    assert first.view.xid == {} and first.view.xid_read_errors == 0
    first.poll()  # the first poll starts the wait for NVML's events
    for event in [(1, 79), (1, 79), (0, 31)]:
        lib.xid_queue.put(event)
    assert counted(first, {(1, 79): 2, (0, 31): 1}) == {(1, 79): 2, (0, 31): 1}
    last = first.view.xid_last
    first.close()

    lib = FakeNvml([FakeGpu(0), FakeGpu(1)])
    second = EventRunner(config, nvml=lib)
    assert second.view.xid == {(1, 79): 2, (0, 31): 1} and second.view.xid_last == last  # not from zero
    second.poll()
    lib.xid_queue.put((1, 79))
    assert counted(second, {(1, 79): 3, (0, 31): 1}) == {(1, 79): 3, (0, 31): 1}
    second.close()
    assert EventRunner(config).view.xid_read_errors is None  # no NVML: no XID source, its errors absent
