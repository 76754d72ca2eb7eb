"""A user's first minutes through the real command line: the mistakes and the waits they meet first.

Each test runs `oomguard` as a process, as a user does, and checks what the user sees: one clear line and an exit
status, never a traceback, and nothing left running.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

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
    # Nothing says it listens on a port it never had.
    assert "listening on" not in result.stderr and "serving http" not in result.stderr, result.stderr
    # The simulated engine was never started (or was stopped): no process of it is left.
    engine_port = int(re.search(r"engine at http://127\.0\.0\.1:(\d+)", result.stderr)[1])
    left = _simulators(engine_port)
    for proc in left:  # a failing test must not leak them either
        proc.kill()
    assert not left, [p.info["cmdline"] for p in left]
