"""`oomguard backtest` as a user runs it: one run with every output (--json, --plot, --sweep) on a file, and bad
input: exit 2, a message naming the problem and the fix, never a traceback."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from support import REPO

from oomguard.cli import main
from oomguard.common.ports import free_port
from tests.backtest.histories import T0, synthetic_rows, write_csv


def backtest(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["backtest", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("command")
    write_csv(folder / "history.csv", synthetic_rows(hours=3, gpus=4, leak=(3, 1.0, 1.6)))
    (folder / "ooms.txt").write_text(f"{T0 + 1.6 * 3600:.0f} gpu=3 node=node-1\n")
    return folder


@pytest.fixture(scope="module")
def everything(files: Path) -> dict:
    """One run with --json, --plot and --sweep (pytest's capture is per test: the module runs it once, itself)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["backtest", "--history", str(files / "history.csv"), "--ooms", str(files / "ooms.txt"),
                       "--json", "--plot", str(files / "plots"), "--sweep"])  # fmt: skip
    assert status == 0, err.getvalue()
    return {"report": json.loads(out.getvalue()), "progress": err.getvalue(), "plots": files / "plots"}


def test_the_json_report(everything: dict) -> None:
    report = everything["report"]
    [oom] = report["ooms"]
    assert oom["gpu"] == "3" and oom["first_page"]["alert"] == "OomGuardGpuMemoryExhaustedSoon"
    assert oom["first_page"]["lead_seconds"] > 10 * 60
    assert report["summary"] == {"ooms": 1, "incidents": 1, "unforeseeable": 0, "incidents_paged_before": 1,
                                 "median_first_page_lead_seconds": oom["first_page"]["lead_seconds"]}  # fmt: skip
    assert report["outside_incidents"]["pages"] == 0
    assert report["outside_incidents"]["gpu_days"] == pytest.approx(4 * 3 / 24, rel=0.01)
    assert len(report["gpus"]) == 4 and not report["never_judged"]
    assert "replaying the history" in everything["progress"]


def test_the_plot_of_each_incident(everything: dict) -> None:
    [png] = everything["report"]["plots"]
    assert Path(png).parent == everything["plots"] and Path(png).read_bytes()[:4] == b"\x89PNG"


def test_the_sweep(everything: dict) -> None:
    rows = everything["report"]["sweep"]
    assert {row["alert"] for row in rows} == {"gpu_memory_critical", "exhausted_soon", "over_budget", "gpu_memory_high"}
    configured = [row for row in rows if row["configured"]]
    assert len(configured) == 4 and all(row["paged"] == 1 for row in configured)
    # A later time to full pages earlier; a larger margin over budget pages later or not at all.
    soon = {
        row["values"]["seconds"]: row
        for row in rows
        if row["alert"] == "exhausted_soon" and row["values"]["for"] == "1m"
    }
    assert soon[3600]["median_first_page_lead_seconds"] >= soon[900]["median_first_page_lead_seconds"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--history", "/nonexistent/h.csv"], "/nonexistent/h.csv: cannot read the history"),
        (["--history", "{files}/ooms.txt"], "line 1: no time, no gpu, no used_bytes"),
        (["--history", "{files}/history.csv", "--start", "1"], "--start is for --prometheus"),
        (["--prometheus", "http://127.0.0.1:1"], "--prometheus needs --start"),
        (["--prometheus", "http://127.0.0.1:{port}", "--start", "2024-05-01T00:00:00Z", "--end",
          "2024-05-01T01:00:00Z"], "cannot reach Prometheus at http://127.0.0.1:"),
        (["--history", "{files}/history.csv", "--evaluation-interval", "soon"], "--evaluation-interval 'soon': not a"),
        (["--history", "{files}/history.csv", "--gpu-memory-utilization", "90"], "a share of the GPU"),
        (["--history", "{files}/history.csv", "--incident-before", "1e300"], "--incident-before 1e300: at most 7d"),
        (["--history", "{files}/history.csv", "--ooms", "{files}/history.csv"], "is not a time"),
        (["--history", "{files}/history.csv", "--bundle-config", "{files}/ooms.txt"], "top level must be a mapping"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_with_the_fix(
    capsys: pytest.CaptureFixture[str], files: Path, argv: list[str], said: str
) -> None:
    argv = [a.format(files=files, port=free_port()) for a in argv]
    status, out, err = backtest(capsys, *argv, "--quiet")
    assert status == 2 and not out
    assert said in err and "Traceback" not in err


def test_without_prometheus_installed(
    capsys: pytest.CaptureFixture[str], files: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    status, _, err = backtest(capsys, "--history", str(files / "history.csv"), "--quiet")
    assert status == 2 and "apt-get install prometheus" in err and "Traceback" not in err
    assert os.environ["PATH"] == str(tmp_path)


def test_the_command_is_listed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "backtest" in capsys.readouterr().out


def descendants(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).children(recursive=True)
    return []


def name(process: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return process.name()
    return ""


def _where_it_hangs(process: subprocess.Popen[str], lines: queue.Queue[str]) -> str:
    """Each process of the tree (what it waits on in the kernel), then the Python ones' stacks: SIGABRT makes
    faulthandler (PYTHONFAULTHANDLER) write them to the stderr the test reads. It found the hang this test once had
    (a stop signal raised while a future's lock was held: tsdb.Backfill's docstring)."""
    tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    said = []
    for member in tree:
        with contextlib.suppress(psutil.Error, OSError):
            wchan = Path(f"/proc/{member.pid}/wchan").read_text()
            said.append(f"{member.pid} {member.name()} {member.status()} waits in {wchan}")
    for member in tree:
        with contextlib.suppress(psutil.Error, OSError):
            if member.name().startswith("python"):
                member.send_signal(signal.SIGABRT)
    with contextlib.suppress(queue.Empty):
        while True:
            said.append(lines.get(timeout=3).rstrip())
    return "\n".join(said)


@pytest.mark.parametrize(
    ("stage", "signum"),
    [("rules", signal.SIGTERM), ("rules", signal.SIGINT), ("replay on 2 processes", signal.SIGTERM)],
)
def test_a_signal_stops_what_the_backtest_started_and_removes_its_folder(
    tmp_path: Path, stage: str, signum: signal.Signals
) -> None:
    """A service manager's stop (SIGTERM) or ^C (SIGINT) while the rules are evaluated by its Prometheus, or while
    its workers replay and promtool backfills: nothing it started survives it, its temporary folder is removed, and it
    says so in one line."""
    history = tmp_path / "h.csv"
    if stage == "rules":
        # An hour of readings, then one a year later: the rules are evaluated over the year (some 20 s), time
        # enough to be stopped in the middle.
        rows = [f"{T0 + 15 * i},n,0,{1e9 + i * 1e6},8e10\n" for i in range(240)]
        rows.append(f"{T0 + 366 * 86400},n,0,1e9,8e10\n")
        argv = ["--history", str(history)]
    else:  # 2 GPUs for 80 hours: a worker each, a block for promtool every 2 hours
        rows = [f"{T0 + 15 * i},n,{g},{1e9 + i * 1e6},8e10\n" for i in range(20_000) for g in range(2)]
        argv = ["--history", str(history), "--jobs", "2"]
    history.write_text("time,node,gpu,used_bytes,total_bytes\n" + "".join(rows))
    temp = tmp_path / "tmp"
    temp.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "oomguard", "backtest", *argv], cwd=REPO, text=True, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, env={**os.environ, "TMPDIR": str(temp), "PYTHONFAULTHANDLER": "1"},
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stderr], daemon=True).start()  # type: ignore[union-attr]
    started: list[psutil.Process] = []
    try:
        said: list[str] = []
        # The moment to stop it: its Prometheus answering the rules, or a worker's promtool backfilling.
        waited_for = "prometheus" if stage == "rules" else "promtool"
        while not any(name(p) == waited_for for p in started):
            with contextlib.suppress(queue.Empty):
                said.append(lines.get(timeout=0.05))
            if stage == "rules" and not any("evaluating" in line for line in said):
                continue
            started = descendants(process.pid)
            assert process.poll() is None and not any("evaluating" in line for line in said[:-1]), said
        found = sorted(temp.iterdir())
        assert len(found) == 1 and found[0].name.startswith("oomguard-backtest-"), found
        process.send_signal(signum)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the backtest did not end after {signum.name}\n{_where_it_hangs(process, lines)}")
        while True:
            try:
                said.append(lines.get(timeout=10))
            except queue.Empty:
                break
        assert process.returncode == 128 + signum, (process.returncode, said)
        assert said[-1].startswith("oomguard backtest: ") and signum.name in said[-1], said
        assert not any("Traceback" in line for line in said), said
        assert not [name(p) for p in started if p.is_running()], "left running"
        assert not list(temp.iterdir()), "its temporary folder was left behind"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for leaked in started:
            with contextlib.suppress(psutil.Error):
                leaked.kill()
