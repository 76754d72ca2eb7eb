"""Event sources built from the configuration, each polled through the runner alike; the state file's layout kept."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from kmsg_stand_in import kmsg_record
from support import Clock, append_lines

from oomguard.exporter.config import Config, EventsConfig, TargetConfig
from oomguard.exporter.config_loader import load_config
from oomguard.exporter.engines import ENGINES
from oomguard.exporter.engines.base import LogGrammar
from oomguard.exporter.events.cgroup import CgroupSource
from oomguard.exporter.events.cri import PodLogReader
from oomguard.exporter.events.file_follower import FileFollower
from oomguard.exporter.events.journald import JournaldReader
from oomguard.exporter.events.kernel import KernelLogSource, read_boot_id
from oomguard.exporter.events.registry import HOST_SOURCES, TARGET_SOURCES, SavedState, build_sources
from oomguard.exporter.events.runner import STATE_FILE, EventRunner
from oomguard.exporter.events.source import LogSource
from oomguard.exporter.model import HOST, EventSourceHealth

STAMP = "2026-12-02T12:00:00.000000000Z"
FATAL = "(EngineCore pid=7) ERROR 12-02 12:00:00 [core.py:701] EngineCore encountered a fatal error."
# PyTorch's OOM: the exception that ends a traceback of the engine core (two lines, frames left out).
OOM = (
    "(EngineCore pid=7) Traceback (most recent call last):\n"
    "(EngineCore pid=7) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
)
RESTART = "(APIServer pid=8) INFO 12-02 12:00:05 [api_server.py:1000] vLLM server version 0.32.0, serving model m"


def memory_events(directory: Path, oom_kill: int) -> None:
    directory.mkdir(exist_ok=True)
    (directory / "memory.events").write_text(f"low 0\nhigh 0\nmax 0\noom {oom_kill}\noom_kill {oom_kill}\n")


def config(tmp_path: Path, target: dict[str, Any], **events: Any) -> Config:
    return load_config(
        None,
        {
            "state_dir": str(tmp_path / "state"),
            "events": {"kernel_log": False, "quiet_seconds": 5, "k8s_pods_dir": str(tmp_path / "pods"), **events},
            "targets": [{"name": "vllm", "url": "http://127.0.0.1:8000", **target}],
        },
    )


def test_the_registry_builds_every_kind_of_source(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        {
            "logs": [str(tmp_path / "a.log"), str(tmp_path / "b-*.log")],
            "journald_unit": "vllm.service",
            "k8s_pod_logs": {"namespace": "ns", "pod": "vllm-*", "container": "vllm"},
            "cgroup": str(tmp_path / "cg"),
        },
        kernel_log=True,
        kernel_log_path=str(tmp_path / "kmsg"),
    )
    sources = build_sources(cfg)
    described = [(s.target, s.name, type(s), s.kinds) for s in sources]
    log_kinds = ("cuda_oom", "startup_memory", "engine_death")
    assert described == [
        ("vllm", f"file:{tmp_path / 'a.log'}", LogSource, log_kinds),
        ("vllm", f"file:{tmp_path / 'b-*.log'}", LogSource, log_kinds),
        ("vllm", "journald:vllm.service", LogSource, log_kinds),
        ("vllm", "k8s:ns/vllm-*/vllm", LogSource, log_kinds),
        ("vllm", f"cgroup:{tmp_path / 'cg'}", CgroupSource, ("cgroup_oom_kill",)),
        (HOST, f"kernel:{tmp_path / 'kmsg'}", KernelLogSource, ("kernel_oom_kill",)),
    ]
    readers = [type(s.reader) for s in sources if isinstance(s, LogSource)]
    assert readers == [FileFollower, FileFollower, JournaldReader, PodLogReader]
    pods = next(s for s in sources if s.name.startswith("k8s:"))
    assert isinstance(pods, LogSource) and isinstance(pods.reader, PodLogReader)
    assert pods.reader.follower.pattern == str(tmp_path / "pods" / "ns_vllm-*_*" / "vllm" / "*.log")
    for source in sources:
        health = source.health()
        assert isinstance(health, EventSourceHealth)
        assert (health.target, health.source, health.kinds) == (source.target, source.name, source.kinds)
        json.dumps(source.state())  # what is saved is JSON
    # A target without sources, and the host's off: nothing at all.
    assert build_sources(config(tmp_path, {})) == []


def test_each_builder_is_named_after_its_configuration_field() -> None:
    assert set(TARGET_SOURCES) <= set(TargetConfig.model_fields)
    assert set(HOST_SOURCES) <= set(EventsConfig.model_fields)


def test_saved_state_is_given_back_by_source() -> None:
    saved = SavedState(
        {
            "positions": {"vllm|journald:u": {"cursor": "c"}, "|kernel:/dev/kmsg": {"last_seq": 9}},
            "incidents": {"vllm|journald:u": None},
            "counts": {"vllm|journald:u": "not a section of sources"},
        }
    )
    assert saved.of("vllm", "journald:u") == {"positions": {"cursor": "c"}, "incidents": None}
    assert saved.of(HOST, "kernel:/dev/kmsg") == {"positions": {"last_seq": 9}}
    assert saved.of("other", "journald:u") == {}


def test_a_targets_log_is_read_with_its_engines_patterns(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.touch()
    clock = Clock()
    extra = [{"kind": "cuda_oom", "at": "exception", "regex": r"torch\.OutOfMemoryError: HIP out of memory"}]
    r = EventRunner(config(tmp_path, {"logs": [str(log)], "engine": "vllm"}, patterns=extra), clock=clock)
    r.poll()
    append_lines(log, [FATAL, *traceback("RuntimeError: something else", "(EngineCore pid=7) "), RESTART])  # vLLM's own
    r.poll()
    hip = "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1 GiB"
    append_lines(log, [*traceback(hip), RESTART])  # config's
    r.poll()
    append_lines(log, [*traceback("RuntimeError: CUDA out of memory."), RESTART])  # the generic catalogue's
    r.poll()
    assert r.counts["vllm"].total == {"engine_death": 1, "cuda_oom": 2}


def traceback(exception: str, tag: str = "") -> list[str]:
    """A Python traceback that ends in `exception`, each line after `tag`: where PyTorch's OOM is written."""
    return [f"{tag}Traceback (most recent call last):", f'{tag}  File "serve.py", line 9, in main', f"{tag}{exception}"]


class _PlainEngine:
    """An engine with no log lines of its own and no record header."""

    log_grammar = LogGrammar()

    def log_patterns(self) -> list[dict[str, str]]:
        return []


def test_the_generic_patterns_count_for_any_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ENGINES, "plain", _PlainEngine())
    log = tmp_path / "plain.log"
    log.touch()
    target = TargetConfig.model_construct(url="http://127.0.0.1:8001", name="plain", engine="plain", logs=(str(log),))
    cfg = Config.model_construct(targets=(target,), events=EventsConfig(kernel_log=False, quiet_seconds=5))
    clock = Clock()
    r = EventRunner(cfg, clock=clock)
    r.poll()
    append_lines(log, [*traceback("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"), FATAL])
    r.poll()
    clock.now += 10
    r.poll()
    # The memory line counts; vLLM's fatal error line is nothing to an engine that is not vLLM.
    assert r.counts["plain"].total == {"cuda_oom": 1}
    append_lines(log, [FATAL])
    clock.now += 100
    r.poll()
    clock.now += 10
    r.poll()
    assert r.counts["plain"].total == {"cuda_oom": 1}


def test_kernel_and_cgroup_sources_through_the_runner(tmp_path: Path, kmsg: Path) -> None:
    kmsg.write_text(kmsg_record(100, "Linux version 6.8"))
    cgroup = tmp_path / "cg"
    memory_events(cgroup, 2)
    clock = Clock()
    cfg = config(tmp_path, {"cgroup": str(cgroup)}, kernel_log=True, kernel_log_path=str(kmsg))
    r = EventRunner(cfg, clock=clock)
    r.poll()  # the kernel log from its end, the cgroup's counter as the baseline: neither counts the past
    assert r.counts == {}
    with kmsg.open("a") as f:
        f.write(kmsg_record(101, "Out of memory: Killed process 4242 (python3) total-vm:1234kB"))
    memory_events(cgroup, 5)
    r.poll()
    with kmsg.open("a") as f:
        f.write(kmsg_record(102, "usb 1-1: new high-speed USB device"))
    r.poll()
    assert r.counts[HOST].total == {"kernel_oom_kill": 1}
    assert r.counts["vllm"].total == {"cgroup_oom_kill": 3}  # one event of count 3
    assert r.counts["vllm"].last["cgroup_oom_kill"] == 1000.0
    health = {h.source: h for h in r.health()}
    assert health[f"kernel:{kmsg}"].lines_read == 2 and health[f"kernel:{kmsg}"].target == HOST
    assert health[f"cgroup:{cgroup}"].read_errors == 0
    r.close()
    # Restarted: nothing is counted twice.
    r = EventRunner(cfg, clock=clock)
    r.poll()
    assert r.counts[HOST].total == {"kernel_oom_kill": 1} and r.counts["vllm"].total == {"cgroup_oom_kill": 3}


def test_the_readers_counters_are_reported(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.touch()
    container = tmp_path / "pods" / "ns_vllm-0_1" / "vllm"
    container.mkdir(parents=True)
    (container / "0.log").touch()
    target = {"logs": [str(log)], "k8s_pod_logs": {"namespace": "ns", "pod": "vllm-*", "container": "vllm"}}
    r = EventRunner(config(tmp_path, target), clock=Clock())
    r.poll()
    long_line = "x" * (1024 * 1024 + 10)  # over the follower's 1 MiB line limit
    append_lines(log, ["short", long_line])
    append_lines(container / "0.log", ["not a CRI record", f"{STAMP} stdout F fine"])
    r.poll()
    health = {h.source: h for h in r.health()}
    file = health[f"file:{log}"]
    assert (file.lines_read, file.lines_truncated, file.lines_malformed) == (2, 1, 0)
    assert file.bytes_read == log.stat().st_size and file.bytes_behind == 0
    pods = health["k8s:ns/vllm-*/vllm"]
    assert (pods.lines_read, pods.lines_malformed, pods.lines_truncated) == (2, 1, 0)
    assert pods.bytes_read == (container / "0.log").stat().st_size


def test_a_source_that_raises_is_a_read_error_and_the_others_go_on(tmp_path: Path) -> None:
    bad, good = tmp_path / "bad.log", tmp_path / "good.log"
    bad.touch()
    good.touch()
    r = EventRunner(config(tmp_path, {"logs": [str(bad), str(good)]}), clock=Clock())

    def boom(now: float) -> list:
        raise RuntimeError("a bug")

    r.sources[0].poll = boom  # type: ignore[method-assign]
    r.poll()
    append_lines(good, [OOM, RESTART])
    r.poll()
    assert r.counts["vllm"].total == {"cuda_oom": 1}
    assert [h.read_errors for h in r.health()] == [2, 0]


def test_a_state_file_of_the_old_layout_resumes_without_recounting(tmp_path: Path, kmsg: Path) -> None:
    """The state file as the exporter wrote it before the sources were one protocol: read as it is."""
    log = tmp_path / "vllm.log"
    append_lines(log, [FATAL, OOM, RESTART, FATAL])  # counted before the upgrade; the last death still open
    kmsg.write_text(kmsg_record(100, "Out of memory: Killed process 1 (python3)"))  # counted before
    cgroup = tmp_path / "cg"
    memory_events(cgroup, 3)  # 2 when the old exporter stopped
    st = log.stat()
    data = log.read_bytes()
    tail = base64.b64encode(data[-64:]).decode()
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / STATE_FILE).write_text(
        f"""{{
          "positions": {{
            "vllm|file:{log}": {{"version": 1, "pattern": "{log}", "started": true, "files": [
              {{"dev": {st.st_dev}, "ino": {st.st_ino}, "path": "{log}", "names": ["{log}"], "dir": "{tmp_path}",
               "offset": {len(data)}, "partial": "", "overflow": false, "discard": false, "skip_nul": false,
               "tail": "{tail}"}}]}},
            "vllm|cgroup:{cgroup}": {{"oom_kill": 2}},
            "|kernel:{kmsg}": {{"last_seq": 100}}
          }},
          "incidents": {{
            "vllm|file:{log}": {{"open": [950.0, 950.0, ["engine_death"]], "dead_until_startup": null}}
          }},
          "counts": {{
            "vllm": {{"total": {{"cuda_oom": 1, "cgroup_oom_kill": 2}}, "last": {{"cuda_oom": 900.0, "cgroup_oom_kill": 800.0}}}},
            "": {{"total": {{"kernel_oom_kill": 1}}, "last": {{"kernel_oom_kill": 700.0}}}}
          }}
        }}"""  # noqa: E501
    )
    # While the exporter was being upgraded: the open death turns out to be an OOM, the kernel kills again.
    append_lines(log, [OOM])
    with kmsg.open("a") as f:
        f.write(kmsg_record(101, "Out of memory: Killed process 2 (python3)"))
    clock = Clock()
    cfg = config(tmp_path, {"logs": [str(log)], "cgroup": str(cgroup)}, kernel_log=True, kernel_log_path=str(kmsg))
    r = EventRunner(cfg, clock=clock)
    r.poll()
    clock.now += 10
    r.poll()
    assert r.counts["vllm"].total == {"cuda_oom": 2, "cgroup_oom_kill": 3}
    assert r.counts["vllm"].last == {"cuda_oom": 950.0, "cgroup_oom_kill": 1000.0}
    assert r.counts[HOST].total == {"kernel_oom_kill": 2}
    assert [h.lines_read for h in r.health()] == [2, 0, 1]  # only what came after the saved positions
    r.close()
    saved = json.loads((state_dir / STATE_FILE).read_text())
    assert set(saved) == {"positions", "incidents", "counts"}
    assert set(saved["positions"]) == {f"vllm|file:{log}", f"vllm|cgroup:{cgroup}", f"|kernel:{kmsg}"}
    assert set(saved["incidents"]) == {f"vllm|file:{log}"}
    kernel_position = saved["positions"][f"|kernel:{kmsg}"]
    assert kernel_position["last_seq"] == 101 and kernel_position["boot_id"] == read_boot_id()
    assert [pids for pids, _usec, _memcg in kernel_position["kills"]] == [[2]]  # the last minute's kills
    assert saved["positions"][f"vllm|cgroup:{cgroup}"] == {"oom_kill": 3}
    # The OOM written while the exporter was away is judged as the open incident's next line (950 s, no stamp of
    # its own says otherwise); the log's clock then catches up with the wall clock (1000 s): the death re-armed
    # 60 s after its last line.
    assert saved["incidents"][f"vllm|file:{log}"] == {"clock": {"at": 1000.0}}
    assert saved["counts"][""] == {"total": {"kernel_oom_kill": 2}, "last": {"kernel_oom_kill": 1000.0}}
