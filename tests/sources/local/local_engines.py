"""Stand-in engines for the discovery tests: real processes whose command lines are an engine's.

`vllm_stub(tmp)` writes a package `vllm.entrypoints.openai.api_server` into a folder for PYTHONPATH: run as
`python -m vllm.entrypoints.openai.api_server --port N ...` it waits LOAD_SECONDS without listening (as vLLM
does while it loads its model), then serves /health and, on /metrics, the body of a real vLLM 0.32.0.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from support import VLLM_BODIES

API_SERVER = """
import argparse, os, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, default=8000)
args, _ = parser.parse_known_args()
time.sleep(float(os.environ.get("LOAD_SECONDS", "0")))
with open(os.environ["METRICS_BODY"], "rb") as f:
    body = f.read()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        payload = body if self.path == "/metrics" else b"" if self.path == "/health" else None
        self.send_response(200 if payload is not None else 404)
        self.send_header("Content-Length", str(len(payload or b"")))
        self.end_headers()
        self.wfile.write(payload or b"")

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
"""


def vllm_stub(folder: Path) -> Path:
    """The stub package under `folder`; returns the folder (for PYTHONPATH)."""
    package = folder / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for part in (folder / "vllm", folder / "vllm" / "entrypoints", package):
        (part / "__init__.py").write_text("")
    (package / "api_server.py").write_text(API_SERVER)
    return folder


class StubVllm:
    """One stand-in vLLM; `start()` again relaunches it with the same command line."""

    def __init__(self, folder: Path, port: int, *flags: str, python: str = sys.executable) -> None:
        self.folder, self.port = folder, port
        self.argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", "facebook/opt-125m",
                     "--port", str(port), *flags]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, load_seconds: float = 0.0) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": str(self.folder),
            "LOAD_SECONDS": str(load_seconds),
            "METRICS_BODY": str(VLLM_BODIES / "vllm-0.32.0-cpu-idle.txt"),
        }
        self.proc = subprocess.Popen(self.argv, env=env)

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None


def wait_listening(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port} after {timeout}s")
