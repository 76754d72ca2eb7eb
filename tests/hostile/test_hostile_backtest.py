"""Hostile input to `oomguard backtest`: its history file, its OOM list and the other files it is given.

Each case goes through the real reader (files.FileHistory, ooms.read_ooms) and the real command (`main`, or
`python -m oomguard backtest` in a subprocess where a hang or the memory is at stake, with a timeout that only
guards against a hang). The bounds are held by counting (rows built, bytes of text decompressed, steps read), never
by timing. The table of cases is `CASES`; docs/faults.md prints it, and `test_docs_table_is_current` keeps the two
equal. Each case fails without the guard it holds.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from hostile_cases import Case, assert_documented
from support import REPO

from oomguard.backtest import BacktestError, files
from oomguard.backtest.files import GZIP_FLOOR_BYTES, GZIP_RATIO, FileHistory
from oomguard.backtest.ooms import read_ooms
from oomguard.backtest.replay import MAX_GPUS, MAX_TARGETS
from oomguard.backtest.source import MAX_STEPS
from oomguard.cli import main

CASES = [
    Case("backtest", "a time far beyond any date in a history file, the OOM list or `--start`: `9.9e299` (it ended "
         "in a traceback, `File name too long`), `1e15` milliseconds (the year 33658)",
         "refused where it is parsed, a time after the year 9999 being no time: one line naming the file's line, "
         "exit 2", "test_a_time_beyond_any_date_is_refused_at_its_line"),
    Case("backtest", "one row years after the others in a history file (the rules are evaluated over the whole "
         "span: a row a year after an hour of readings added 22 s)",
         "the window's steps bounded as `--prometheus` bounds them (5,000,000 steps of the history's step, or of the "
         "evaluation interval where that is finer): refused at that row while the file is read, one line naming its "
         "line and the fix", "test_a_row_far_after_the_others_is_refused_where_it_is_read"),
    Case("backtest", "a history of ever new GPUs, or of ever new engines on one GPU (64 steps of 15,000 new GPUs: "
         "the 960,000 rows read ahead took 387 MB, 14.6 s, before the replay's cap was checked)",
         "the distinct GPUs and engines counted while the file is read: the 16,385th refused at its line, before "
         "more rows are built (that file: 55 MB, 1.2 s)",
         "test_a_flood_of_distinct_gpus_or_engines_is_refused_while_read"),
    Case("backtest", "a gzip bomb as the history (2.3 GB of text in 5.6 MB of gzip was read up to the 2 GiB limit "
         "of text, some 3 MB a second)",
         "text beyond 4 MiB refused once it is more than 100 times the compressed bytes read: one line saying "
         "so, after at most 4 MiB and a buffer of text (2.2 s, the start included, for 2.3 GB in 5.6 MB of gzip)",
         "test_a_gzip_bomb_is_refused_after_little_text"),
    Case("backtest", "a FIFO or a device (`/dev/zero`) as `--history`, `--ooms`, `--mapping`, `--bundle-config` or "
         "`--config` (a FIFO hung the command; `/dev/zero` was read into memory without end), or a file over its "
         "size", "each file checked to be a regular file within its size before it is read: one line naming the "
         "file, exit 2", "test_a_file_that_is_no_file_is_refused_at_once"),
]  # fmt: skip


def test_docs_table_is_current() -> None:
    assert_documented(CASES, globals())


HEADER = "time,node,gpu,used_bytes,total_bytes\n"
T0 = 1_714_521_600  # 2024-05-01 00:00:00 UTC
YEAR = 365 * 86400


def row(t: float | str, gpu: str = "0", node: str = "n") -> str:
    return f"{t},{node},{gpu},1e9,8e10\n"


def refused(path: Path, **kwargs: object) -> str:
    """The one-line error of reading `path` as a history."""
    with pytest.raises(BacktestError) as caught:
        for _ in FileHistory(path, **kwargs):  # type: ignore[arg-type]
            pass
    message = str(caught.value)
    assert "\n" not in message, message
    return message


def backtest(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    status = main(["backtest", *argv, "--quiet"])
    captured = capsys.readouterr()
    assert not captured.out
    return status, captured.err


# -- times -------------------------------------------------------------------------------------------------------
BEYOND = ["9.9e299", "1e300", "1e15", "253402300800000"]  # milliseconds above 1e11: the last is 10000-01-01


@pytest.mark.parametrize("written", BEYOND)
def test_a_time_beyond_any_date_is_refused_at_its_line(tmp_path: Path, written: str) -> None:
    path = tmp_path / "h.csv"
    path.write_text(HEADER + row(T0) + row(written))
    message = refused(path)
    assert message.startswith(f"{path} line 3: ") and "after the year 9999" in message, message
    jsonl = tmp_path / "h.jsonl"
    jsonl.write_text("".join(json.dumps({"time": t, "gpu": 0, "used_bytes": 1, "total_bytes": 2}) + "\n"
                             for t in (T0, float(written))))  # fmt: skip
    assert refused(jsonl).startswith(f"{jsonl} line 2: ")
    ooms = tmp_path / "ooms.txt"
    ooms.write_text(f"{T0} gpu=0\n{written} gpu=0\n")
    with pytest.raises(BacktestError, match=r"line 2: time: .* is after the year 9999"):
        read_ooms(ooms)


def test_the_command_refuses_a_time_beyond_any_date_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history, ooms = tmp_path / "h.csv", tmp_path / "ooms.txt"
    history.write_text(HEADER + "".join(row(T0 + 15 * i) for i in range(8)) + row("9.9e299"))
    ooms.write_text("9.9e299\n")
    runs = [
        (["--history", str(history)], f"{history} line 10: "),
        (["--history", str(history.with_name("ok.csv")), "--ooms", str(ooms)], f"{ooms} line 1: "),
        (["--prometheus", "http://127.0.0.1:9", "--start", "9.9e299"], "--start: "),
    ]
    history.with_name("ok.csv").write_text(HEADER + row(T0))
    for argv, said in runs:
        status, err = backtest(capsys, *argv)
        assert status == 2 and len(err.strip().splitlines()) == 1, (argv, err)
        assert said in err and "after the year 9999" in err and "Traceback" not in err, (argv, err)


# -- the window --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("before", "jump", "evaluation"),
    [
        (256, 3 * YEAR, 30.0),  # 256 steps of 15 s, then 3 years: 6.3 million steps of 15 s
        (1, 5 * YEAR, 30.0),  # the second row 5 years on: the step is unknown, the rules' grid of 30 s holds it
        (1, 60 * 86400, 1.0),  # 60 days on an evaluation grid of 1 s
    ],
)
def test_a_row_far_after_the_others_is_refused_where_it_is_read(
    tmp_path: Path, before: int, jump: float, evaluation: float
) -> None:
    path = tmp_path / "h.csv"
    times = [T0 + 15 * i for i in range(before)]
    path.write_text(HEADER + "".join(row(t) for t in times) + row(times[-1] + jump) + row(times[-1] + jump + 15))
    read: list[float] = []
    with pytest.raises(BacktestError) as caught:
        for step in FileHistory(path, evaluation_interval=evaluation):
            read.append(step.t)
    message = str(caught.value)
    assert message.startswith(f"{path} line {before + 2}: "), message
    assert f"over {MAX_STEPS:,}" in message and "split the history" in message, message
    assert read == times  # the steps before it, and not that one
    # The same gap within the bound is read.
    near = tmp_path / "near.csv"
    near.write_text(HEADER + "".join(row(t) for t in times) + row(times[-1] + 7 * 86400))
    assert len(list(FileHistory(near, evaluation_interval=evaluation))) == before + 1


def test_the_command_refuses_a_far_row_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "h.csv"
    path.write_text(HEADER + "".join(row(T0 + 15 * i) for i in range(100)) + row(T0 + 1500 + 3 * YEAR))
    status, err = backtest(capsys, "--history", str(path))
    assert status == 2 and len(err.strip().splitlines()) == 1 and f"{path} line 102: " in err, err


# -- GPUs and engines --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("what", ["gpus", "engines"])
def test_a_flood_of_distinct_gpus_or_engines_is_refused_while_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    path = tmp_path / "h.csv"
    with path.open("w") as handle:
        if what == "gpus":  # 3 steps of 8,192 GPUs each, every GPU a new one
            handle.write(HEADER)
            handle.writelines(row(T0 + 15 * (i // 8192), gpu=f"GPU-{i}") for i in range(3 * 8192))
        else:  # one GPU at one time, 20,000 engines on it
            handle.write("time,gpu,used_bytes,total_bytes,target\n")
            handle.writelines(f"{T0},0,1e9,8e10,engine-{i}\n" for i in range(20_000))
    built = {"GpuRow": 0, "EngineRow": 0}
    for name in built:
        real = getattr(files, name)

        def counting(*args: object, _real: type = real, _name: str = name, **kwargs: object) -> object:
            built[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(files, name, counting)
    message = refused(path)
    limit, noun = (MAX_GPUS, "GPUs") if what == "gpus" else (MAX_TARGETS, "engines")
    assert message.startswith(f"{path} line {limit + 2}: ") and f"more than {limit:,} {noun}" in message, message
    assert built["GpuRow" if what == "gpus" else "EngineRow"] <= limit + 1, built


# -- gzip ----------------------------------------------------------------------------------------------------------
def gzip_bomb(path: Path, text_bytes: int) -> int:
    """A history whose rows repeat (one GPU at one time): `text_bytes` of text in a few hundred KiB of gzip."""
    line = row(T0).encode()
    block = line * (1024**2 // len(line))
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # a gzip member
    with path.open("wb") as handle:
        handle.write(packer.compress(HEADER.encode()))
        for _ in range(text_bytes // len(block)):
            handle.write(packer.compress(block))
        handle.write(packer.flush())
    return path.stat().st_size


def counted_text(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes of text the history's reader decompresses, as they are read."""
    read: list[int] = []
    real = files._Counted.readinto

    def counting(self: files._Counted, buffer: object) -> int:
        n = real(self, buffer)
        read.append(n or 0)
        return n

    monkeypatch.setattr(files._Counted, "readinto", counting)
    return read


def test_a_gzip_bomb_is_refused_after_little_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "h.csv.gz"
    size = gzip_bomb(path, 4 * GZIP_FLOOR_BYTES)
    assert size * GZIP_RATIO < 4 * GZIP_FLOOR_BYTES  # a bomb: more than the ratio
    read = counted_text(monkeypatch)
    message = refused(path)
    assert message.startswith(f"{path}: ") and f"more than {GZIP_RATIO} times" in message, message
    assert sum(read) <= GZIP_FLOOR_BYTES + 1024**2, f"{sum(read):,} bytes of text read before the refusal"


def test_a_gzip_history_at_a_history_s_ratio_is_read_past_the_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "GZIP_FLOOR_BYTES", 64 * 1024)
    text = HEADER + "".join(row(T0 + 15 * (i // 8), gpu=str(i % 8)) for i in range(40_000))
    path = tmp_path / "h.csv.gz"
    path.write_bytes(gzip.compress(text.encode()))
    assert len(text) > 10 * files.GZIP_FLOOR_BYTES
    assert len(list(FileHistory(path))) == 5000


# -- files that are no files -------------------------------------------------------------------------------------
FLAGS = {
    "--history": [],
    "--ooms": ["--history", "{ok}"],
    "--mapping": ["--prometheus", "http://127.0.0.1:9", "--start", "1700000000", "--end", "1700003600"],
    "--bundle-config": ["--history", "{ok}"],
    "--config": ["--history", "{ok}"],
}


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 * 1024**3, 2 * 1024**3))  # a read without end fails, not the machine


# The history's size (2 GiB) is held in tests/backtest/test_inputs.py, with a smaller limit given.
NO_FILES = [
    (flag, kind)
    for flag in FLAGS
    for kind in ("fifo", "device", "too large")
    if (flag, kind) != ("--history", "too large")
]


@pytest.mark.parametrize(("flag", "kind"), NO_FILES)
def test_a_file_that_is_no_file_is_refused_at_once(tmp_path: Path, flag: str, kind: str) -> None:
    ok = tmp_path / "ok.csv"
    ok.write_text(HEADER + row(T0))
    if kind == "fifo":
        given = tmp_path / "fifo"
        os.mkfifo(given)
    elif kind == "device":
        given = Path("/dev/zero")
    else:  # over each file's size: comments and blank lines, valid as each kind of file
        given = tmp_path / "large"
        with given.open("w") as handle:
            handle.write(("# " + "x" * 1000 + "\n") * 17_000)  # 17 MB: over 16 MiB (OOMs), 1 MiB (YAML)
    argv = [*(a.format(ok=ok) for a in FLAGS[flag]), flag, str(given), "--quiet"]
    try:
        result = subprocess.run(
            [sys.executable, "-m", "oomguard", "backtest", *argv], capture_output=True, text=True, cwd=REPO,
            timeout=60, preexec_fn=_limit_memory,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"backtest {flag} hung on a {kind}")
    err = result.stderr.strip()
    assert result.returncode == 2 and len(err.splitlines()) == 1 and str(given) in err, (result.returncode, err)
    assert "Traceback" not in err
