"""Kernel OOM kills from recorded kernel log records: one kill is one event, whatever records the kernel wrote.

The records are those of real kernels: 6.18's are the very ones this machine wrote for a process over
its memory cgroup's limit (tests/events/test_real_oom_kills.py makes such kills); 4.19's and 5.x's are
the forms of those kernels' mm/oom_kill.c, with a child sacrificed in place of its parent on 4.x.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from kmsg_stand_in import kmsg_record

from oomguard.exporter.config_loader import load_config
from oomguard.exporter.describe import describe
from oomguard.exporter.events.cgroup import CgroupOomReader
from oomguard.exporter.events.kernel import KernelLogSource, KmsgReader, read_boot_id
from oomguard.exporter.events.kernel_records import KILLED, REAPED, SUMMARY, KillDedupe, parse
from oomguard.exporter.events.kill_owners import REMEMBER_SECONDS, KillOwners
from oomguard.exporter.events.runner import STATE_FILE, EventRunner
from oomguard.exporter.model import HOST

# What 6.18 wrote on this machine for one kill in a v1 memory cgroup (the lines between left out).
KERNEL_6 = [
    "python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
    "memory: usage 65536kB, limit 65536kB, failcnt 0",
    "[   4191]     0  4191    80941    17979    16320     1659         0   192512        0             0 python3",
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/oomtest1,"
    "task_memcg=/oomtest1,task=python3,pid=4191,uid=0",
    "Memory cgroup out of memory: Killed process 4191 (python3) total-vm:323764kB, anon-rss:65280kB, "
    "file-rss:6636kB, shmem-rss:0kB, UID:0 pgtables:188kB oom_score_adj:0",
]
# 5.x, the host out of memory: the summary, the kill, the reaper.
KERNEL_5_GLOBAL = [
    "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,"
    "task_memcg=/user.slice/user-1000.slice/session-2.scope,task=stress,pid=1234,uid=1000",
    "Out of memory: Killed process 1234 (stress) total-vm:1056780kB, anon-rss:1049216kB, file-rss:0kB, "
    "shmem-rss:0kB, UID:1000 pgtables:2104kB oom_score_adj:0",
    "oom_reaper: reaped process 1234 (stress), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
]
# 4.19, a pod's cgroup at its limit: the victim chosen ("Kill process"), then killed, then reaped.
KERNEL_4_MEMCG = [
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=cri-containerd-ab12.scope,mems_allowed=0,"
    "oom_memcg=/kubepods/burstable/pod6a1c3e1e-2b7f-4d1c-9a55-0c2f3e4d5a6b,"
    "task_memcg=/kubepods/burstable/pod6a1c3e1e-2b7f-4d1c-9a55-0c2f3e4d5a6b/ab12,task=python3,pid=777,uid=0",
    "Memory cgroup out of memory: Kill process 777 (python3) score 1000 or sacrifice child",
    "Killed process 777 (python3) total-vm:9000000kB, anon-rss:8000000kB, file-rss:0kB, shmem-rss:0kB",
    "oom_reaper: reaped process 777 (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
]
# 4.x sacrificing a child: the summary names the chosen parent, the kill and the reaper its child.
KERNEL_4_CHILD = [
    "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/,"
    "task=vllm,pid=500,uid=0",
    "Out of memory: Kill process 500 (vllm) score 900 or sacrifice child",
    "Killed process 501 (python3) total-vm:5000kB, anon-rss:4000kB, file-rss:0kB, shmem-rss:0kB",
    "oom_reaper: reaped process 501 (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
]
ONE_KILL = {"6.18 memcg": KERNEL_6, "5.x global": KERNEL_5_GLOBAL, "4.19 memcg": KERNEL_4_MEMCG,
            "4.x child": KERNEL_4_CHILD}  # fmt: skip


class Records:
    """A reader of kernel log records given by hand: (usec, message), as KmsgReader.poll returns them."""

    path = "recorded"

    def __init__(self) -> None:
        self.queue: list[tuple[int, str]] = []
        self.kills: list | None = None
        from oomguard.exporter.model import ReadStats

        self.stats = ReadStats()

    def poll(self) -> list[tuple[int, str]]:
        out, self.queue = self.queue, []
        return out

    def state(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def source(kills: list | None = None) -> tuple[KernelLogSource, Records]:
    reader = Records()
    reader.kills = kills
    return KernelLogSource(reader), reader  # type: ignore[arg-type]


def test_the_record_forms() -> None:
    forms = {line: parse(line, 0) for lines in ONE_KILL.values() for line in lines}
    assert forms[KERNEL_6[3]] is not None and (forms[KERNEL_6[3]].form, forms[KERNEL_6[3]].pid) == (SUMMARY, 4191)
    assert forms[KERNEL_6[3]].memcg == "/oomtest1" and forms[KERNEL_6[3]].task == "python3"
    assert (forms[KERNEL_6[4]].form, forms[KERNEL_6[4]].pid, forms[KERNEL_6[4]].memcg) == (KILLED, 4191, None)
    assert (forms[KERNEL_5_GLOBAL[2]].form, forms[KERNEL_5_GLOBAL[2]].pid) == (REAPED, 1234)
    assert forms[KERNEL_4_MEMCG[0]].memcg.endswith("/ab12")
    # The lines around a kill, and 4.x's choice of a victim, are not kills.
    for line in (KERNEL_6[0], KERNEL_6[1], KERNEL_6[2], KERNEL_4_MEMCG[1], KERNEL_4_CHILD[1]):
        assert forms[line] is None, line
    assert parse("usb 1-1: new high-speed USB device number 2", 0) is None
    # A summary without task_memcg (older 4.19 builds): its pid still read.
    bare = parse("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,task=py,pid=42", 0)
    assert bare is not None and (bare.pid, bare.memcg) == (42, None)


@pytest.mark.parametrize("kernel", ONE_KILL)
def test_one_kill_is_one_event_in_one_read(kernel: str) -> None:
    src, reader = source()
    reader.queue = [(1_000_000 + i * 100, line) for i, line in enumerate(ONE_KILL[kernel])]
    events = src.poll(5.0)
    assert [(e.kind, e.count) for e in events] == [("kernel_oom_kill", 1)]
    first_pid = next(r.pid for line in ONE_KILL[kernel] if (r := parse(line, 0)) is not None)
    assert events[0].pid == first_pid


@pytest.mark.parametrize("kernel", ["6.18 memcg", "5.x global", "4.19 memcg"])
def test_one_kill_in_any_order_and_split_across_reads(kernel: str) -> None:
    records = [line for line in ONE_KILL[kernel] if parse(line, 0) is not None]
    for order in itertools.permutations(records):
        src, reader = source()
        counted = []
        for i, line in enumerate(order):  # each record in a read of its own
            reader.queue = [(1_000_000 + i * 100, line)]
            counted += src.poll(float(i))
        assert len(counted) == 1, order
        # In one read, in this order: one too, and the cgroup told whichever record came first.
        src, reader = source()
        reader.queue = [(1_000_000 + i * 100, line) for i, line in enumerate(order)]
        (event,) = src.poll(0.0)
        assert event.cgroup == next(r.memcg for line in records if (r := parse(line, 0)) and r.form == SUMMARY)


def test_kills_apart_are_counted_apart() -> None:
    src, reader = source()
    # Two processes killed in a row (the OOM killer's lock orders their records), then the first pid
    # killed again in a later life, long after: three kills.
    reader.queue = [(1_000_000, KERNEL_5_GLOBAL[0]), (1_000_100, KERNEL_5_GLOBAL[1])]
    reader.queue += [(1_000_200, line.replace("4191", "4200")) for line in KERNEL_6[3:]]
    reader.queue += [(1_000_300, KERNEL_5_GLOBAL[2])]
    assert [e.pid for e in src.poll(1.0)] == [1234, 4200]
    reader.queue = [(200_000_000, KERNEL_5_GLOBAL[1])]  # 199 s later: the pid reused
    assert [e.pid for e in src.poll(2.0)] == [1234]


def test_a_restart_between_two_records_of_one_kill_does_not_count_it_twice() -> None:
    src, reader = source()
    reader.queue = [(1_000_000, KERNEL_6[3])]
    assert len(src.poll(1.0)) == 1
    saved = json.loads(json.dumps(src.state()["positions"]["kills"]))  # through the state file's JSON
    restarted, reader = source(saved)
    reader.queue = [(1_000_050, KERNEL_6[4])]
    assert restarted.poll(2.0) == []
    # A malformed saved entry is dropped, not fatal.
    assert KillDedupe([["x"], [[], 1, None], "no", [[5], 10, 7]]).state() == [[[5], 10, None]]


def test_the_reader_resumes_after_a_restart_and_reads_a_new_boot_from_its_start(tmp_path: Path, kmsg: Path) -> None:
    boot = tmp_path / "boot_id"
    boot.write_text("boot-a\n")
    kmsg.write_text(kmsg_record(10, "Linux version 6.18") + kmsg_record(11, KERNEL_6[3], usec=5_000_000))
    first = KmsgReader(str(kmsg), from_start=True, boot_id_path=str(boot))
    assert [m for _, m in first.poll()] == ["Linux version 6.18", KERNEL_6[3]]
    assert first.state() == {"last_seq": 11, "boot_id": "boot-a"}
    same_boot = KmsgReader(str(kmsg), state=first.state(), boot_id_path=str(boot))
    assert same_boot.poll() == []  # nothing read twice
    # Rebooted: the sequence starts again at 0, below the saved position; this boot's records all count.
    boot.write_text("boot-b\n")
    kmsg.write_text(kmsg_record(0, "Linux version 6.18") + kmsg_record(1, KERNEL_5_GLOBAL[1], usec=9_000_000))
    rebooted = KmsgReader(str(kmsg), state={**first.state(), "kills": [[[4191], 5_000_000, None]]},
                          boot_id_path=str(boot))  # fmt: skip
    assert [m for _, m in rebooted.poll()] == ["Linux version 6.18", KERNEL_5_GLOBAL[1]]
    assert rebooted.kills is None  # another boot's kills mean nothing here


def config(tmp_path: Path, kmsg: Path, targets: list[dict[str, Any]]) -> Any:
    return load_config(
        None,
        {
            "targets": targets,
            "state_dir": str(tmp_path / "state"),
            "discovery": {"local": "off"},
            "events": {"kernel_log": True, "kernel_log_path": str(kmsg), "quiet_seconds": 5},
        },
    )


POD = "6a1c3e1e-2b7f-4d1c-9a55-0c2f3e4d5a6b"


def test_a_kill_counts_for_the_target_whose_process_or_pod_it_killed(tmp_path: Path, kmsg: Path) -> None:
    kmsg.write_text(kmsg_record(1, "Linux version 6.18"))
    cgroup = tmp_path / "cg"
    cgroup.mkdir()
    (cgroup / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    targets = [
        {"url": "http://127.0.0.1:8000", "name": "local"},
        {"url": "http://10.0.0.9:8000", "name": "ns/pod", "local_process": "no"},
        {"url": "http://127.0.0.1:8001", "name": "caged", "cgroup": str(cgroup)},
    ]
    runner = EventRunner(config(tmp_path, kmsg, targets))
    runner.poll()
    runner.kill_owners.update("local", [4191, 4192])
    runner.kill_owners.update("ns/pod", [], POD)
    # 6.18 kills pid 4191 (local's), 4.19 a process of the pod, 5.x a process of nobody's.
    with kmsg.open("a") as f:
        for seq, line in enumerate(KERNEL_6[3:] + KERNEL_4_MEMCG + KERNEL_5_GLOBAL, start=2):
            f.write(kmsg_record(seq, line))
    runner.poll()
    assert runner.counts[HOST].total == {"kernel_oom_kill": 3}
    assert runner.counts["local"].total == {"cgroup_oom_kill": 1}
    assert runner.counts["ns/pod"].total == {"cgroup_oom_kill": 1}
    # A target with a cgroup: counts its kills from its counter (v1 here), never again from the kernel log.
    runner.kill_owners.update("caged", [9000])
    (cgroup / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    with kmsg.open("a") as f:
        f.write(kmsg_record(50, KERNEL_6[4].replace("4191", "9000"), usec=900_000_000))
    runner.poll()
    assert runner.counts[HOST].total == {"kernel_oom_kill": 4}
    assert runner.counts["caged"].total == {"cgroup_oom_kill": 1}
    runner.close()
    runner = EventRunner(config(tmp_path, kmsg, targets))  # restarted: nothing recounted
    runner.kill_owners.update("local", [4191, 4192])
    runner.poll()
    assert runner.counts[HOST].total == {"kernel_oom_kill": 4}
    assert runner.counts["caged"].total == {"cgroup_oom_kill": 1}
    assert runner.counts["local"].total == runner.counts["ns/pod"].total == {"cgroup_oom_kill": 1}
    runner.close()
    saved = json.loads((tmp_path / "state" / STATE_FILE).read_text())
    assert saved["positions"][f"caged|cgroup:{cgroup}"] == {"oom_kill": 1}


def test_owners_forget_old_processes_and_gone_targets() -> None:
    now = [0.0]
    owners = KillOwners(clock=lambda: now[0])
    owners.update("a", [1, 2], "uid-a")
    now[0] += REMEMBER_SECONDS / 2
    owners.update("a", [2])
    assert owners.owner_of(1, None) == "a"  # killed a moment ago: gone from the lookup, still its
    now[0] += REMEMBER_SECONDS + 1
    owners.update("a", [])
    assert owners.owner_of(1, None) is None and owners.owner_of(2, None) is None
    owners.keep_only(["b"])
    assert owners.owner_of(None, "/kubepods/poduid-a/x") is None


def test_cgroup_v1_and_v2_counters_and_what_check_config_says(tmp_path: Path) -> None:
    v1, v2, neither = tmp_path / "v1", tmp_path / "v2", tmp_path / "none"
    for d in (v1, v2, neither):
        d.mkdir()
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\noom_group_kill 0\n")
    reader = CgroupOomReader(str(v1))
    assert reader.read_new() == 0  # the baseline
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 1\noom_kill 5\n")
    assert reader.read_new() == 2 and reader.stats.read_errors == 0
    missing = CgroupOomReader(str(neither))
    assert missing.read_new() == 0 and missing.stats.read_errors == 1
    assert "memory controller" in missing.stats.last_error
    (neither / "memory.events").write_text("oom_kill 0\n")  # the cgroup made after the exporter started
    assert missing.read_new() == 0 and missing.stats.read_errors == 1
    (neither / "memory.events").write_text("oom_kill 1\n")
    assert missing.read_new() == 1
    cfg = load_config(None, {"discovery": {"local": "off"}, "targets": [
        {"url": "http://127.0.0.1:1", "name": "a", "cgroup": str(v1)},
        {"url": "http://127.0.0.1:2", "name": "b", "cgroup": str(v2)},
        {"url": "http://127.0.0.1:3", "name": "c", "cgroup": str(tmp_path / "typo")}]})  # fmt: skip
    said = describe(cfg)[0]
    assert f"oom_kill of {v1}/memory.oom_control (cgroup v1)" in said
    assert f"oom_kill of {v2}/memory.events (cgroup v2)" in said
    assert f"cgroup {tmp_path / 'typo'}: no memory.events (v2) or memory.oom_control (v1) there yet" in said


def test_the_boot_id_is_read() -> None:
    boot = read_boot_id()
    if boot is None:
        pytest.skip("/proc/sys/kernel/random/boot_id is not readable here")
    assert len(boot) == 36
