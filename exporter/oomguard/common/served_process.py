"""A child process that serves HTTP (a real Prometheus or Alertmanager), started until its readiness URL answers.

The drill's services and the backtest's Prometheus are the Debian packages' binaries run on loopback: each is
started with its output kept in a log file, is ready once its readiness URL answers 200, and is said to have failed
with the end of that log.
"""

from __future__ import annotations

import ssl
import subprocess
import time
import urllib.request
from pathlib import Path


class ServedProcess:
    def __init__(
        self, command: list[str], log_path: Path, ready_url: str, *, error: type[Exception] = RuntimeError,
        ready_context: ssl.SSLContext | None = None, ready_headers: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        """`error`: what a failed start raises. Under a web configuration the readiness check needs the CA
        (`ready_context`) and the credentials (`ready_headers`) too."""
        self.command = command
        self.log_path = log_path
        self.ready_url = ready_url
        self.error = error
        self.ready_context = ready_context
        self.ready_headers = ready_headers or {}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0, poll_seconds: float = 0.1) -> None:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise self.error(f"{self.command[0]} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                request = urllib.request.Request(self.ready_url, headers=self.ready_headers)
                with urllib.request.urlopen(request, timeout=1, context=self.ready_context) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(poll_seconds)
        self.stop()
        raise self.error(f"{self.command[0]} not ready after {timeout:g}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
