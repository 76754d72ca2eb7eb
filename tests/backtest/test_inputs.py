"""The backtest's inputs without a Prometheus: history files, OOM lists, the rules' references and `for:`."""

from __future__ import annotations

import gzip
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from oomguard.backtest import BacktestError, parallel
from oomguard.backtest.files import MAX_ROWS_A_STEP, FileHistory
from oomguard.backtest.history import GpuRow, Step
from oomguard.backtest.ooms import read_ooms
from oomguard.backtest.rules import AlertRule, _machine, references, rule_set, runs_of
from oomguard.backtest.run import PEEK_ROWS, PEEK_STEPS, peek
from oomguard.bundle.bundle_config import load_bundle_config
from tests.backtest.histories import T0, synthetic_rows, write_csv

HEADER = "time,node,gpu,used_bytes,total_bytes\n"


def steps(path: Path) -> tuple[list, FileHistory]:
    history = FileHistory(path)
    return list(history), history


def test_a_csv_history_is_read_a_step_at_a_time(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "h.csv", synthetic_rows(hours=0.1, gpus=2))
    found, history = steps(path)
    assert len(found) == 24 and all(len(s.gpus) == 2 for s in found)
    first = found[0]
    assert first.t == T0 and first.gpus[0].gpu == "0" and first.gpus[0].node == "node-1"
    assert first.gpus[0].total == 85e9 and first.gpus[0].targets == ["vllm-0"]
    assert first.engines["vllm-0"].gpu_memory_utilization == 0.9 and first.engines["vllm-0"].running == 5
    assert not history.problems.lines()


def test_json_lines_gzip_rfc3339_and_mib(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl.gz"
    lines = [
        {"time": "2024-05-01T00:00:00Z", "hostname": "n", "gpu": "GPU-abc", "used_mib": 1024, "free_mib": 3072},
        {"time": "2024-05-01T02:00:15+02:00", "hostname": "n", "gpu": "GPU-abc", "used_mib": 2048, "free_mib": 2048},
    ]
    with gzip.open(path, "wt") as handle:
        handle.write("\n".join(json.dumps(line) for line in lines) + "\n")
    found, _ = steps(path)
    assert [s.t for s in found] == [T0, T0 + 15]
    assert found[0].gpus[0].used == 1024 * 2**20 and found[0].gpus[0].free == 3072 * 2**20
    assert found[0].gpus[0].gpu == "GPU-abc"


def test_a_clock_step_backwards_drops_the_rows_and_says_so(tmp_path: Path) -> None:
    times = [0, 15, 30, 45, 20, 25, 60]  # the clock stepped back 25 s after 45
    path = tmp_path / "h.csv"
    path.write_text(HEADER + "".join(f"{T0 + t},n,0,1e9,8e10\n" for t in times))
    found, history = steps(path)
    assert [s.t - T0 for s in found] == [0, 15, 30, 45, 60]
    assert history.problems.out_of_order == 2
    assert "2 rows dropped: their time went back" in history.problems.lines()[0]
    assert "line 6" in history.problems.lines()[0]


def test_a_gpu_twice_at_one_time_and_values_that_are_no_reading(tmp_path: Path) -> None:
    path = tmp_path / "h.csv"
    path.write_text(
        "time,gpu,used_bytes,total_bytes,kv_cache_usage,target\n"
        f"{T0},0,1e9,8e10,0.5,a\n{T0},0,2e9,8e10,1.5,a\n{T0},1,NaN,8e10,,\n{T0},2,-5,8e10,,\n"
    )
    [step], history = steps(path)
    assert [g.used for g in step.gpus] == [2e9, None, None]
    assert history.problems.duplicates == 1
    assert history.problems.rejected == {"kv_cache_usage": 1, "used_bytes": 2}
    assert step.engines["a"].kv_cache_usage == 0.5  # the first with figures of the engine at that time


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "no rows; a history file starts with a header"),
        ("time,gpu,used,total_bytes\n1,0,1,2\n", "no used_bytes (or used_mib) column ('used' -> 'used_bytes'?)"),
        ("time,used_bytes,total_bytes\n1,1,2\n", "no gpu column"),
        (HEADER + f"{T0},n,0,1e9\n", "line 2: 4 cells where the header has 5 columns"),
        (HEADER + f"{T0},n,0,lots,8e10\n", "line 2: used_bytes 'lots' is not a number"),
        (HEADER + "yesterday,n,0,1e9,8e10\n", "line 2: time: 'yesterday' is not a time"),
        (HEADER + "2024-05-01T00:00:00,n,0,1e9,8e10\n", "has no UTC offset; add one (Z for UTC"),
        (HEADER + f"{T0},n,,1e9,8e10\n", "line 2: no gpu"),
        ("time,gpu,used_bytes,total_bytes,state\n" + f"{T0},0,1,2,sleeping\n", "state 'sleeping': one of up"),
    ],
)
def test_a_bad_file_is_refused_naming_the_line_and_the_fix(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "h.csv"
    path.write_text(text)
    with pytest.raises(BacktestError) as caught:
        steps(path)
    assert said in str(caught.value)


def test_the_size_of_a_file_is_bounded(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "h.csv", synthetic_rows(hours=0.1, gpus=1))
    with pytest.raises(BacktestError, match="over the limit of a history file"):
        list(FileHistory(path, max_bytes=100))
    packed = tmp_path / "h.csv.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(BacktestError, match="more than 100 bytes of text"):
        list(FileHistory(packed, max_bytes=100))
    long_line = tmp_path / "long.csv"
    long_line.write_text(HEADER + "1" * 70_000 + "\n")
    with pytest.raises(BacktestError, match="longer than 65,536 characters"):
        list(FileHistory(long_line))
    with pytest.raises(BacktestError, match="cannot read the history"):
        list(FileHistory(tmp_path / "absent.csv"))
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"time,gpu\n\xff\xfe\n")
    with pytest.raises(BacktestError, match="not UTF-8"):
        list(FileHistory(binary))


def test_the_ooms_file(tmp_path: Path) -> None:
    path = tmp_path / "ooms.txt"
    path.write_text(
        "# from the engine's log\n"
        "2024-05-01T12:03:00Z gpu=3 node=gpu-node-7\n"
        "1714565000 3 gpu-node-7\n"
        "2024-05-02T08:00:00+02:00 target=vllm-llama  # a comment\n"
        "1714565000000\n"
    )
    ooms = read_ooms(path)
    assert [(o.gpu, o.node, o.target) for o in ooms] == [
        ("3", "gpu-node-7", ""), ("3", "gpu-node-7", ""), ("", "", ""), ("", "", "vllm-llama")
    ]  # fmt: skip
    assert ooms[1].t == ooms[2].t == 1714565000.0  # milliseconds read as such
    path.write_text("2024-05-01T12:03:00Z pod=x\n")
    with pytest.raises(BacktestError, match="line 1: 'pod': a place is gpu=, node= or target="):
        read_ooms(path)
    path.write_text("soon\n")
    with pytest.raises(BacktestError, match=r"line 1: time: 'soon' is not a time.*TIME \[gpu=G\]"):
        read_ooms(path)


def test_the_rules_read_the_families_the_replay_writes() -> None:
    found = references(
        'sum by (a, target) (rate(foo_total{x="y",job="j"}[5m])) > on(b) group_left bar offset 5m and x:y:z'
        ' unless label_replace(baz{state="climbing",w=~"a|b"}, "l", "v", "", "")'
    )
    assert found == {"foo_total": [{"x": "y"}], "bar": [{}], "x:y:z": [{}], "baz": [{"state": "climbing"}]}
    rules = rule_set(load_bundle_config(), 30.0)
    assert rules.wanted["oomguard_gpu_memory_trend_state"] == [{"state": "climbing"}]
    assert {"oomguard_gpu_memory_headroom_used_ratio", "oomguard_engine_preemptions_total"} <= set(rules.wanted)
    assert not rules.records  # the shipped alerts read no recording rule
    assert {r.group for r in rules.alerts} == {"oomguard-gpu-memory", "oomguard-engine"}
    assert all('job="backtest"' in r.expr for r in rules.alerts)


def rule(for_seconds: float = 60.0, keep: float = 0.0) -> AlertRule:
    return AlertRule("A", "g", "x", for_seconds, keep, {"severity": "critical"}, 30.0)


@pytest.mark.parametrize(
    ("present", "for_seconds", "keep", "want"),
    [
        # Pending at its first evaluation, firing once active for `for`, resolved at the first absent evaluation.
        ([0, 1, 2, 3], 60.0, 0.0, [(0, 2, 4)]),
        # Absent once before `for` held: pending dropped, active again from scratch.
        ([0, 1, 3, 4, 5], 60.0, 0.0, [(0, None, 2), (3, 5, 6)]),
        # for: 0 fires at the first evaluation.
        ([5], 0.0, 0.0, [(5, 5, 6)]),
        # keep_firing_for 60 s: two evaluations absent keep it firing; a third resolves it.
        ([0, 1, 2, 4, 5], 30.0, 60.0, [(0, 1, 8)]),
        ([0, 1, 2, 6], 30.0, 60.0, [(0, 1, 5), (6, None, 7)]),
        # Still firing at the end of the window: not resolved.
        ([7, 8, 9], 30.0, 0.0, [(7, 8, None)]),
    ],
)
def test_for_and_keep_firing_for_as_prometheus_applies_them(
    present: list[int], for_seconds: float, keep: float, want: list[tuple[int, int | None, int | None]]
) -> None:
    episodes = _machine(rule(for_seconds, keep), {}, runs_of(present), 0.0, 30.0, 10)
    got = [
        (int(e.active_at / 30), None if e.fired_at is None else int(e.fired_at / 30),
         None if e.resolved_at is None else int(e.resolved_at / 30))
        for e in episodes
    ]  # fmt: skip
    assert got == want


def fleet(gpus: int, taken: list[int]) -> Iterator[Step]:
    """Steps of `gpus` GPUs every 15 s, without end; `taken` counts those read."""
    rows = [GpuRow("n", str(i), 1e9, 8e10) for i in range(gpus)]
    for i in itertools.count():
        taken.append(i)
        yield Step(T0 + 15 * i, gpus=rows)


@pytest.mark.parametrize("gpus", [8, 2048, MAX_ROWS_A_STEP])
def test_the_replay_reads_a_few_steps_ahead_of_a_large_fleet(gpus: int) -> None:
    """To find the history's step, 64 steps are read ahead of the replay, and at most PEEK_ROWS rows (and the step
    that passes them): 64 steps of the largest fleet a step may hold were a million rows held at once."""
    taken: list[int] = []
    head, step = peek(fleet(gpus, taken), PEEK_STEPS)
    assert step == 15 and len(head) == len(taken)
    assert len(head) == min(PEEK_STEPS, -(-PEEK_ROWS // gpus)), f"{len(head)} steps of {gpus} GPUs read ahead"


@pytest.mark.parametrize("gpus", [8, MAX_ROWS_A_STEP])
def test_the_steps_dealt_to_the_replay_workers_are_sent_a_few_at_a_time(gpus: int) -> None:
    """Each batch sent to the workers (parallel.py) holds BATCH steps, or at most BATCH_ROWS rows and one step."""
    taken: list[int] = []
    batches = parallel.batches(fleet(gpus, taken), parallel.Dealer(2))
    steps = min(parallel.BATCH, -(-parallel.BATCH_ROWS // gpus))
    for _ in range(3):
        sent = next(batches)
        assert [len(part) for part in sent] == [steps, steps], f"{len(sent[0])} steps of {gpus} GPUs in a batch"
    assert len(taken) == 3 * steps


SHARED = "time,node,gpu,used_bytes,total_bytes,engine_used_bytes,target,gpu_memory_utilization\n"


def test_two_engines_on_one_gpu_are_one_gpu_row_with_both(tmp_path: Path) -> None:
    """Several engines on one GPU are a row each, of the same time and GPU: one GpuRow with both targets and each
    one's engine_used_bytes; rows that disagree on the GPU's figures keep the first's, counted and said."""
    path = tmp_path / "h.csv"
    path.write_text(
        SHARED
        + f"{T0},n,0,72e9,80e9,35e9,vllm-a,0.45\n{T0},n,0,72e9,80e9,37e9,vllm-b,0.45\n"
        + f"{T0 + 15},n,0,73e9,80e9,35e9,vllm-a,0.45\n{T0 + 15},n,0,74e9,80e9,39e9,vllm-b,0.45\n"
    )
    found, history = steps(path)
    assert [len(s.gpus) for s in found] == [1, 1]
    first, second = found[0].gpus[0], found[1].gpus[0]
    assert first.targets == ["vllm-a", "vllm-b"] and first.engine_used == {"vllm-a": 35e9, "vllm-b": 37e9}
    assert (first.used, first.total) == (72e9, 80e9)
    assert second.used == 73e9 and second.engine_used == {"vllm-a": 35e9, "vllm-b": 39e9}  # the first row's figures
    assert set(found[0].engines) == {"vllm-a", "vllm-b"}
    assert found[0].engines["vllm-b"].gpu_memory_utilization == 0.45
    assert (history.problems.disagreeing, history.problems.duplicates) == (1, 0)
    assert any("1 row of a GPU shared by several engines gave other memory figures" in line
               for line in history.problems.lines())  # fmt: skip


def test_the_same_engine_twice_on_a_gpu_at_one_time_is_a_duplicate_the_last_kept(tmp_path: Path) -> None:
    path = tmp_path / "h.csv"
    path.write_text(SHARED + f"{T0},n,0,72e9,80e9,35e9,vllm-a,0.45\n{T0},n,0,73e9,80e9,36e9,vllm-a,0.45\n")
    [step], history = steps(path)
    [gpu] = step.gpus
    assert (gpu.used, gpu.targets, gpu.engine_used) == (73e9, ["vllm-a"], {"vllm-a": 36e9})
    assert (history.problems.duplicates, history.problems.disagreeing) == (1, 0)


def test_a_duplicate_row_of_a_shared_gpu_keeps_its_other_engines(tmp_path: Path) -> None:
    """Engine a, engine b, then engine a again on GPU 0 at one time: a's last row is kept, b stays on the GPU."""
    path = tmp_path / "h.csv"
    path.write_text(
        SHARED + f"{T0},n,0,72e9,80e9,35e9,vllm-a,0.45\n{T0},n,0,72e9,80e9,37e9,vllm-b,0.45\n"
        f"{T0},n,0,72e9,80e9,36e9,vllm-a,0.45\n"
    )
    [step], history = steps(path)
    [gpu] = step.gpus
    assert sorted(gpu.targets) == ["vllm-a", "vllm-b"], gpu.targets
    assert gpu.engine_used == {"vllm-a": 36e9, "vllm-b": 37e9}
    assert history.problems.duplicates == 1


@pytest.mark.parametrize(
    ("cell", "state"),
    [("awake", "awake"), ("weights_offloaded", "weights_offloaded"), ("discard_all", "discard_all"), ("0", "awake"),
     ("1", "weights_offloaded"), ("2", "discard_all"), ("Discard_All", "discard_all"), ("", "")],
)  # fmt: skip
def test_the_sleep_state_column(tmp_path: Path, cell: str, state: str) -> None:
    path = tmp_path / "h.csv"
    path.write_text(
        f"time,gpu,used_bytes,total_bytes,target,kv_cache_usage,sleep_state\n{T0},0,1e9,8e10,a,0.1,{cell}\n"
    )
    [step], _ = steps(path)
    assert step.engines["a"].sleep_state == state


def test_the_sleep_state_in_json_lines_is_a_name_or_a_level(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    rows = [
        {"time": T0 + 15 * i, "gpu": 0, "used_bytes": used, "total_bytes": 8e10, "target": "a", "sleep_state": sleep}
        for i, (used, sleep) in enumerate([(1e9, 1), (1e9, 2.0), (7e10, "awake")])
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    found, _ = steps(path)
    assert [s.engines["a"].sleep_state for s in found] == ["weights_offloaded", "discard_all", "awake"]


@pytest.mark.parametrize("cell", ["sleeping", "3", "-1", "asleep", "1.5"])
def test_a_sleep_state_that_is_none_is_refused_in_one_line_naming_the_line(tmp_path: Path, cell: str) -> None:
    path = tmp_path / "h.csv"
    path.write_text(
        f"time,gpu,used_bytes,total_bytes,target,sleep_state\n{T0},0,1e9,8e10,a,awake\n{T0 + 15},0,1e9,8e10,a,{cell}\n"
    )
    with pytest.raises(BacktestError) as caught:
        steps(path)
    said = str(caught.value)
    assert "line 3" in said and f"sleep_state {cell!r}" in said and "awake, weights_offloaded, discard_all" in said
    assert "\n" not in said


def test_the_unforeseeable_word_in_the_ooms_file(tmp_path: Path) -> None:
    path = tmp_path / "ooms.txt"
    path.write_text(
        "2024-05-03T17:40:00Z gpu=1 node=gpu-node-2 unforeseeable   # a 200k-token prompt\n"
        "2024-05-03T18:00:00Z Unforeseeable 3 gpu-node-7\n"
        "2024-05-03T19:00:00Z 4 gpu-node-8 UNFORESEEABLE\n"
        "2024-05-03T20:00:00Z 5 gpu-node-9   # unforeseeable in a comment is a comment\n"
        "2024-05-03T21:00:00Z target=unforeseeable\n"
    )
    ooms = read_ooms(path)
    assert [(o.gpu, o.node, o.target, o.unforeseeable) for o in ooms] == [
        ("1", "gpu-node-2", "", True), ("3", "gpu-node-7", "", True), ("4", "gpu-node-8", "", True),
        ("5", "gpu-node-9", "", False), ("", "", "unforeseeable", False),
    ]  # fmt: skip
