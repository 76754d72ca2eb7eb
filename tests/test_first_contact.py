"""A user's first minutes through the real command line: the mistakes and the waits they meet first.

Each test runs `oomguard` as a process, as a user does, and checks what the user sees: one clear line and an exit
status, never a traceback, and nothing left running.
"""

from __future__ import annotations

import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import IO, Any

import psutil
import pytest

from oomguard.common.engine_client import EngineClient
from oomguard.exporter.config import TargetConfig
from oomguard.exporter.sources.targets import TargetScraper

OOMGUARD = [sys.executable, "-m", "oomguard"]


def _oomguard(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*OOMGUARD, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another process (this test) listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _simulators(port: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if any("simulator" in part for part in cmdline) and f"--port={port}" in "=".join(cmdline):
            found.append(proc)
    return found


def test_serve_on_a_port_in_use_is_one_line_and_leaves_nothing_running(held_port: int) -> None:
    result = _oomguard("serve", "--simulate", "leak", "--no-collector.nvml",
                       "--web.listen-address", f"127.0.0.1:{held_port}")  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and f"cannot listen on 127.0.0.1:{held_port}" in errors[0], result.stderr
    assert "already in use" in errors[0] and "Errno" not in errors[0], errors
    # The fix for both ways of starting it: the flag, and make run's variable (which the flag alone did not say),
    # with a port free now (a fixed example is the taken port itself for whoever followed it once).
    free = int(re.search(r"make run LISTEN=127\.0\.0\.1:(\d+)", errors[0])[1])
    assert free != held_port and f"--web.listen-address 127.0.0.1:{free}" in errors[0], errors
    # Nothing says it listens on a port it never had.
    assert "listening on" not in result.stderr and "serving http" not in result.stderr, result.stderr
    # The simulated engine was never started (or was stopped): no process of it is left.
    engine_port = int(re.search(r"engine at http://127\.0\.0\.1:(\d+)", result.stderr)[1])
    left = _simulators(engine_port)
    for proc in left:  # a failing test must not leak them either
        proc.kill()
    assert not left, [p.info["cmdline"] for p in left]


def _lines_of(stream: IO[str]) -> tuple[list[str], threading.Thread]:
    """The lines of a process's stream as they come (a thread reads them: the test waits on conditions)."""
    lines: list[str] = []

    def read() -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, reader


def _wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout:g} s: {what}")


def test_serve_logs_no_warning_while_its_simulated_engine_loads() -> None:
    """An engine refuses connections while it loads its model, by design: the first minutes of `serve --simulate`
    are one info line "loading", not a WARNING per engine start."""
    proc = subprocess.Popen(
        [*OOMGUARD, "serve", "--simulate", "steady", "--simulate.time-scale", "30", "--no-collector.nvml",
         "--web.listen-address", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    lines, reader = _lines_of(proc.stderr)
    try:
        serving = _wait_for(lambda: next((ln for ln in lines if "serving http on" in ln), None), 30, "serving")
        port = int(re.search(r"127\.0\.0\.1:(\d+)", serving)[1])

        def up() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    body = response.read().decode()
            except OSError:
                return False
            return re.search(r'oomguard_target_state\{[^}]*state="up",target="sim-vllm"\} 1', body) is not None

        _wait_for(up, 60, "the simulated engine up")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        reader.join(timeout=10)
    log = "\n".join(lines)
    assert "sim-vllm: loading" in log, log  # the one info line
    assert len([ln for ln in lines if " INFO " in ln and "sim-vllm: loading" in ln]) == 1, log
    # The target's warnings (other sources may warn on a host without, say, a readable kernel log).
    assert not [ln for ln in lines if " WARNING oomguard.exporter.sources.targets: target sim-vllm" in ln], log


async def test_a_refusal_while_loading_is_info_once_and_after_up_a_warning(
    zoo: Any, caplog: pytest.LogCaptureFixture
) -> None:
    closed = f"http://127.0.0.1:{_unused_port()}"
    target = TargetScraper(
        TargetConfig(url=closed, name="life", local_process="no"), timeout=1.0, max_body_bytes=1 << 20
    )
    caplog.set_level(logging.DEBUG, logger="oomguard.exporter.sources.targets")
    async with EngineClient() as session:
        for _ in range(3):  # loading: refused, then the same refusal again, then another error
            assert (await target.scrape(session)).state == "loading"
        target.config = target.config.model_copy(update={"url": f"{zoo.base}/500"})
        assert (await target.scrape(session)).state == "loading"
        records = [(r.levelname, r.getMessage()) for r in caplog.records]
        assert [level for level, _ in records] == ["INFO", "DEBUG"], records
        assert records[0][1].startswith("target life: loading (refused error until it serves: cannot connect")

        caplog.clear()
        target.config = target.config.model_copy(update={"url": f"{zoo.base}/good"})
        assert (await target.scrape(session)).state == "up"
        target.config = target.config.model_copy(update={"url": closed})
        reading = await target.scrape(session)
        assert reading.state == "down" and reading.error_kind == "refused"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("target life: refused error: cannot connect"), warnings


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_readme_names_every_dependency_and_engine() -> None:
    """The README's install and dependency list is what a user reads first: each main dependency of pyproject.toml
    is named there, and each engine package is listed (none as "next")."""
    import tomllib

    from support import REPO

    readme = (REPO / "README.md").read_text()
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.match(r"[A-Za-z0-9_.-]+", dependency)[0] for dependency in dependencies]
    assert [name for name in names if f"`{name}`" not in readme] == []
    engines = sorted(
        p.name
        for p in (REPO / "exporter" / "oomguard" / "exporter" / "engines").iterdir()
        if (p / "__init__.py").exists()
    )
    assert [engine for engine in engines if f"`{engine}/`" not in readme] == []
    assert "llama.cpp next" not in readme and "; llama.cpp next" not in readme


def test_the_readme_lists_make_runs_variables_with_their_defaults() -> None:
    """`make run SCENARIO=... TIME_SCALE=... LISTEN=...`: each variable the run target passes on is in the README's
    table with the Makefile's default, and the flag it becomes."""
    from support import REPO

    makefile = (REPO / "Makefile").read_text()
    run = re.search(r"(?m)^run: .*\n\t(.+)$", makefile)[1]
    used = re.findall(r"(--[\w.-]+) \$\((\w+)\)", run)
    assert {variable for _, variable in used} == {"SCENARIO", "TIME_SCALE", "LISTEN"}, run
    readme = (REPO / "README.md").read_text()
    for flag, variable in used:
        default = re.search(rf"(?m)^{variable} \?= (\S+)$", makefile)[1]
        assert f"| `{variable}` | `{default}` | `{flag}` |" in readme, variable


def test_the_readme_names_every_package_make_test_installs() -> None:
    """The README's list of what `make test` installs is the install script's: a package it installs that the README
    leaves out (chromium-headless-shell, tmux) is a surprise on a user's machine."""
    from support import REPO

    script = (REPO / "scripts" / "install-system-deps.sh").read_text()
    installed = set(re.findall(r"missing\+=\(([\w.+-]+)\)", script)) - {"build-essential"}  # "a C++ compiler"
    assert {"chromium-headless-shell", "tmux", "podman"} <= installed, installed
    readme = (REPO / "README.md").read_text()
    quick_start = readme[readme.index("## Quick start") : readme.index("`make run` needs no GPU")]
    left_out = sorted(name for name in installed if f"`{name}`" not in quick_start)
    assert not left_out, f"the README's quick start does not name {left_out}"
