"""Run a real llama.cpp `llama-server` (CPU build, tiny random GGUF model) for the test suite.

The binary is built by scripts/install-llamacpp.sh; the model is written by tiny_gguf.py with the
`gguf` package. Stdlib only besides those: the server runs as a child process group.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

HOST = "127.0.0.1"
VERSION = "11434"  # LLAMACPP_VERSION of scripts/install-llamacpp.sh, which builds the binary where this looks


def server_binary() -> Path:
    """The llama-server binary; RuntimeError when it is not built."""
    default_dir = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "oomguard" / f"llamacpp-b{VERSION}"
    build_dir = Path(os.environ.get("OOMGUARD_LLAMACPP_DIR") or default_dir)
    path = Path(os.environ.get("OOMGUARD_LLAMACPP_SERVER") or build_dir / "bin" / "llama-server")
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise RuntimeError(
            f"no llama-server at {path}: run scripts/install-llamacpp.sh "
            "(or point OOMGUARD_LLAMACPP_SERVER at a llama-server binary)"
        )
    return path


def free_port() -> int:
    """A port nothing listens on now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body); status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return 0, ""


def metric_value(text: str, name: str) -> float:
    """The value of an unlabelled metric in Prometheus text format (KeyError when absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


class LlamaServer:
    """One `llama-server --metrics` process (its own process group)."""

    def __init__(
        self,
        model: Path,
        port: int,
        *,
        slots: int = 2,
        ctx_per_slot: int = 4096,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
    ) -> None:
        self.model = Path(model)
        self.port = port
        self.slots = slots
        self.ctx_per_slot = ctx_per_slot
        self.extra_args = tuple(extra_args)
        self.log_path = Path(log_path) if log_path else Path(tempfile.gettempdir()) / f"oomguard-llamacpp-{port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.launched_at = 0.0  # time.time() at launch
        self._launched_mono = 0.0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("server not started")
        return self.proc.pid

    def command(self) -> list[str]:
        return [
            str(server_binary()),
            "--model", str(self.model),
            "--host", HOST,
            "--port", str(self.port),
            "--metrics",
            "--ctx-size", str(self.slots * self.ctx_per_slot),
            "--parallel", str(self.slots),
            "--threads", "1",
            "--threads-http", "4",
            # An f32 KV cache and direct reads of the weights (past the page cache): real loading work that
            # lasts about a second with the test model, so a scrape sees /health 503 "Loading model".
            "--cache-type-k", "f32",
            "--cache-type-v", "f32",
            "--load-mode", "dio",
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> LlamaServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
        self.launched_at = time.time()
        self._launched_mono = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        return self

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_healthy(self, timeout: float = 60.0) -> float:
        """Seconds from launch to the first 200 on /health."""
        if self.proc is None:
            raise RuntimeError("server not started")
        deadline = self._launched_mono + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}:\n{self.log_tail()}")
            status, _ = http_get(self.url + "/health", timeout=1.0)
            if status == 200:
                return time.monotonic() - self._launched_mono
            time.sleep(0.05)
        raise TimeoutError(f"llama-server not healthy after {timeout:.0f} s:\n{self.log_tail()}")

    def wait_exit(self, timeout: float) -> int:
        """The exit code (subprocess.TimeoutExpired if it lives on)."""
        if self.proc is None:
            raise RuntimeError("server not started")
        return self.proc.wait(timeout=timeout)

    def _signal_group(self, sig: int) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def _wait_port_closed(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not port_open(self.port):
                return
            time.sleep(0.05)
        raise TimeoutError(f"port {self.port} still open")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, SIGKILL after `grace` s, wait for the port to close."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace)
        self._signal_group(signal.SIGKILL)
        self.proc.wait()
        self._wait_port_closed(10.0)

    def kill(self) -> None:
        """SIGKILL at once, as a crash (an OOM kill) would."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGKILL)
        self.proc.wait()
        self._wait_port_closed(10.0)

    def __enter__(self) -> LlamaServer:
        return self.start() if self.proc is None else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class LoadRun:
    """Concurrent completions running in threads; see run_load()."""

    def __init__(self, threads: list[threading.Thread], statuses: list[int]) -> None:
        self._threads = threads
        self.statuses = statuses  # HTTP status per request; 0 = no answer

    def done(self) -> bool:
        return not any(t.is_alive() for t in self._threads)

    def wait(self, timeout: float = 120.0) -> list[int]:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if not self.done():
            raise TimeoutError(f"load still running after {timeout:.0f} s")
        return list(self.statuses)


def completion(url: str, prompt: list[int], n_predict: int, timeout: float = 120.0) -> tuple[int, dict]:
    """POST /completion with token ids; ignore_eos makes it generate exactly n_predict tokens."""
    body = json.dumps(
        {"prompt": prompt, "n_predict": n_predict, "ignore_eos": True, "temperature": 0.0, "cache_prompt": False}
    ).encode()
    req = urllib.request.Request(url + "/completion", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, {}
    except (OSError, http.client.HTTPException):
        return 0, {}


def run_load(url: str, n: int, prompt_tokens: int, n_predict: int, timeout: float = 120.0) -> LoadRun:
    """Fire n concurrent completions; prompts are token ids of the tiny vocabulary's byte tokens (3..258)."""
    statuses = [0] * n

    def one(i: int) -> None:
        prompt = [3 + (i * 31 + j * 7) % 256 for j in range(prompt_tokens)]
        statuses[i] = completion(url, prompt, n_predict, timeout)[0]

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return LoadRun(threads, statuses)
