"""The command line's errors as a new user meets them: the command's own usage, the flag or value meant, the fix,
each said once, and the exit status of "could not run" (2) wherever a command could not run."""

from __future__ import annotations

import errno
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from oomguard.cli import main
from oomguard.common.ports import free_port
from oomguard.exporter.web_config.server import _why


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`oomguard ARGV` in this process: its exit status, stdout and stderr (argparse's errors exit through
    SystemExit)."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "usage", "meant"),
    [
        (("serve", "--simulte", "incident"), "usage: oomguard serve", "--simulate"),
        (("serve", "--simulate.timescale=10"), "usage: oomguard serve", "--simulate.time-scale"),
        (("diagnose", "--prometheus", "http://p:9090", "--windw", "2h"), "usage: oomguard diagnose", "--window"),
        (("drill", "--scenaro", "incident"), "usage: oomguard drill", "--scenario"),
    ],
)
def test_an_unknown_flag_gets_its_commands_usage_and_the_flag_meant(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], usage: str, meant: str
) -> None:
    code, _, err = _run(capsys, *argv)
    assert code == 2, err
    assert err.startswith(usage), err
    assert f"did you mean {meant}?" in err.splitlines()[-1], err


def test_an_unknown_flag_far_from_any_names_none(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "serve", "--zzzzzz")
    assert code == 2 and err.startswith("usage: oomguard serve"), err
    assert "unrecognized arguments: --zzzzzz" in err and "did you mean" not in err, err


@pytest.mark.parametrize(
    "argv",
    [
        ("diagnose", "--prometheus", "localhost:9090"),
        ("diagnose", "--exporter", "localhost:9090"),
        ("backtest", "--prometheus", "localhost:9090"),
        ("drill", "--check", "localhost:9090"),
    ],
)
def test_a_url_without_its_scheme_says_to_add_it(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]) -> None:
    code, out, err = _run(capsys, *argv)
    assert code == 2, out + err
    last = err.splitlines()[-1]
    assert "write http://localhost:9090" in last and "unknown url type" not in err, err
    assert last.count("localhost:9090") == 2, last  # the value as given, and as it should be: no more


def test_drill_check_against_nothing_could_not_run(capsys: pytest.CaptureFixture[str]) -> None:
    """As diagnose: exit 2 and one line, not a gap of a deployment (exit 1) in urllib's words."""
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = _run(capsys, "drill", "--check", url)
    assert code == 2, out + err
    assert out == "" and len(err.splitlines()) == 1, out + err
    assert f"cannot reach Prometheus at {url}: Connection refused" in err, err
    assert "urlopen" not in err and "Errno" not in err, err


def _config(tmp_path: Path, target: str) -> Path:
    path = tmp_path / "oomguard.yaml"
    path.write_text(f"targets:\n  - {target}\n")
    return path


def test_an_unknown_engine_gets_the_engine_meant(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _run(capsys, "check-config", str(_config(tmp_path, "{url: 'http://h:8000', engine: vlm}")))
    assert code == 1, err
    line = next(line for line in err.splitlines() if ".engine:" in line)
    assert "unknown engine 'vlm'; did you mean 'vllm'?" in line, line
    assert line.count("'vlm'") == 1, line


def test_a_bad_url_is_said_once_with_its_fix(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _run(capsys, "check-config", str(_config(tmp_path, "{url: 'localhost:8000'}")))
    assert code == 1, err
    line = next(line for line in err.splitlines() if ".url" in line)
    assert "write http://localhost:8000" in line, line
    assert line.count("'localhost:8000'") == 1, line


def test_check_configs_gpu_line_reads_whole(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for setting, meaning in (("true", "each process's memory"), ("false", "no per-process memory")):
        path = tmp_path / "oomguard.yaml"
        path.write_text(f"nvml: {{per_process: {setting}}}\n")
        code, out, _ = _run(capsys, "check-config", str(path))
        assert code == 0, out
        gpus = next(line.strip() for line in out.splitlines() if line.strip().startswith("GPUs:"))
        assert gpus == f"GPUs: every GPU NVML finds, with {meaning} (nvml.per_process: {setting})", gpus


@pytest.fixture
def taken() -> Iterator[int]:
    """A port another process listens on, on every interface (as `make run LISTEN=:9848` asks for it)."""
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_the_port_in_use_hint_names_a_free_port_not_the_taken_one(taken: int) -> None:
    hint = _why(OSError(errno.EADDRINUSE, "in use"), "0.0.0.0", taken)
    suggested = {int(port) for port in re.findall(r":(\d+)", hint)}
    assert suggested and taken not in suggested, hint
    (port,) = suggested
    assert f"make run LISTEN=:{port}" in hint and f"--web.listen-address :{port}" in hint, hint
    with socket.socket() as sock:  # free when said
        sock.bind(("0.0.0.0", port))
