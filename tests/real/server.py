"""What the real-server tests share: one engine server as a child process group, its load, a recording proxy.

The real vLLM (tests/real/vllm/harness.py) and the real llama-server (tests/real/llamacpp/harness.py)
differ in their command line, environment and how they are known to be gone; starting, health, signals,
the load they are put under and the exporter's scrapes until the target is up are the same. The servers run from
their own venv or binary; this runs in the tests' venv.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from support import value  # the tests' one exposition reader

from oomguard.common.ports import free_port as free_port  # the harnesses take it from here, with the server's helpers
from oomguard.exporter.config_loader import load_config
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app

HOST = "127.0.0.1"


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


class ServerProcess:
    """One engine server: its process group, its log, its /health. Subclasses give `command()`."""

    title = "server"  # in error messages
    poll_seconds = 0.1  # between /health polls while it starts
    gone_timeout = 10.0  # after SIGKILL, until it is gone

    def __init__(self, port: int, log_path: Path | None, log_name: str) -> None:
        self.port = port
        # Out of the work tree by default: these logs are megabytes of noise.
        self.log_path = Path(log_path) if log_path else Path(tempfile.gettempdir()) / f"{log_name}-{port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.launched_at = 0.0  # time.time() at launch, for reports
        self._launched_mono = 0.0

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.title} not started")
        return self.proc.pid

    def start(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command, env = self.command(), self.environment()
        self.launched_at = time.time()
        self._launched_mono = time.monotonic()
        # Appended to: a restart's lines follow the first life's, as an orchestrator's log would hold them.
        with open(self.log_path, "ab") as log:
            # A new session makes the server and its children one process group: stop()/kill() reach them all.
            self.proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        return self

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_healthy(self, timeout: float) -> float:
        """Seconds from launch to the first 200 on /health."""
        if self.proc is None:
            raise RuntimeError(f"{self.title} not started")
        deadline = self._launched_mono + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise RuntimeError(f"{self.title} exited with {code} before healthy:\n{self.log_tail()}")
            status, _ = http_get(self.url + "/health", timeout=1.0)
            if status == 200:
                return time.monotonic() - self._launched_mono
            time.sleep(self.poll_seconds)
        raise TimeoutError(f"{self.title} not healthy after {timeout:.0f} s:\n{self.log_tail()}")

    def wait_exit(self, timeout: float) -> int:
        """Exit code of the server process (subprocess.TimeoutExpired if it lives on)."""
        if self.proc is None:
            raise RuntimeError(f"{self.title} not started")
        return self.proc.wait(timeout=timeout)

    def _signal_group(self, sig: int) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def gone(self) -> bool:
        """Whether the server is gone for good: by default, its port is closed."""
        return not port_open(self.port)

    def _wait_gone(self) -> None:
        deadline = time.monotonic() + self.gone_timeout
        while time.monotonic() < deadline:
            if self.gone():
                return
            time.sleep(0.05)
        raise TimeoutError(f"{self.title} (group {self.pid}, port {self.port}) still alive")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the group, SIGKILL after `grace` s, wait until it is gone."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace)
        # The server may be gone while children linger (e.g. after a failed start): the group is swept either way.
        self._signal_group(signal.SIGKILL)
        self.proc.wait()
        self._wait_gone()

    def kill(self) -> None:
        """SIGKILL the whole group at once, as a crash (an OOM kill) would."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGKILL)
        self.proc.wait()
        self._wait_gone()

    def __enter__(self) -> ServerProcess:
        return self.start() if self.proc is None else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class LoadRun:
    """Requests running on threads, `slots` at a time; see run_load()."""

    def __init__(self, n: int, request: Callable[[int], int], slots: int) -> None:
        self._request = request
        self._n = n
        self._issued = 0
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._statuses = [0] * n  # HTTP status per request issued; 0 = no answer
        self._threads = [threading.Thread(target=self._slot, daemon=True) for _ in range(min(slots, n))]
        for t in self._threads:
            t.start()

    def _slot(self) -> None:
        while not self._stopped.is_set():
            with self._lock:
                if self._issued == self._n:
                    return
                i, self._issued = self._issued, self._issued + 1
            self._statuses[i] = self._request(i)

    @property
    def statuses(self) -> list[int]:
        with self._lock:
            return self._statuses[: self._issued]

    def stop(self) -> None:
        """No request starts after this; those in flight run to their end."""
        self._stopped.set()

    def done(self) -> bool:
        return not any(t.is_alive() for t in self._threads)

    def wait(self, timeout: float) -> list[int]:
        """The statuses of every request issued, once all have ended."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if not self.done():
            raise TimeoutError(f"load still running after {timeout:.0f} s")
        return self.statuses


def run_load(n: int, request: Callable[[int], int], slots: int | None = None) -> LoadRun:
    """Fire `request(i)` for i in range(n) (it returns the HTTP status, 0: no answer): all at once, or `slots` at a
    time, each slot starting the next as its last ends, until n are issued or the run is stopped."""
    return LoadRun(n, request, n if slots is None else slots)


def post_json(url: str, body: bytes, timeout: float) -> tuple[int, bytes]:
    """(status, body) of a JSON POST; status 0 when nothing answered."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except (OSError, http.client.HTTPException):
        return 0, b""


class RecordingProxy:
    """Forwards to the server and keeps the last /metrics body it handed on: the exporter's figures can then
    be compared with the very body it read, not with one read a moment later."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.last_metrics = ""
        self.session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{path:.*}", self.forward)
        return app

    async def forward(self, request: web.Request) -> web.Response:
        self.session = self.session or aiohttp.ClientSession()
        try:
            async with self.session.get(self.upstream + "/" + request.match_info["path"]) as response:
                body = await response.read()
        except aiohttp.ClientError:
            return web.Response(status=502, text="upstream refused")
        if request.path == "/metrics" and response.status == 200:
            self.last_metrics = body.decode()
        return web.Response(body=body, status=response.status, content_type="text/plain")

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


# -- the exporter's view of a real server -------------------------------------------------------------------------
Scrape = tuple[str, "float | None", str]  # (the target's state, its /health code or None, the whole exposition)


def target_state(text: str, target: str) -> str:
    """The state the exporter gives `target` in its exposition `text`."""
    return next(s for s in ("up", "loading", "down") if value(text, "oomguard_target_state", target=target, state=s))


def health_code(text: str, target: str) -> float | None:
    try:
        return value(text, "oomguard_target_health_status_code", target=target)
    except KeyError:
        return None


async def scrapes_until_up(
    client: Any, server: ServerProcess, target: str, *, seconds: float, poll_seconds: float
) -> list[Scrape]:
    """Each scrape of the exporter (`client`, an aiohttp test client) until `target` reads "up" with its /metrics
    read (the last one). The state is /health's word: a scrape whose /metrics request left just before the server
    listened, or got /metrics' 503 at the end of a load, reads "up" with nothing read."""
    seen: list[Scrape] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = await (await client.get("/metrics")).text()
        seen.append((target_state(text, target), health_code(text, target), text))
        if seen[-1][0] == "up" and value(text, "oomguard_target_up", target=target) == 1.0:
            return seen
        assert server.proc is not None and server.proc.poll() is None, server.log_tail()
        await asyncio.sleep(poll_seconds)
    raise AssertionError(f"not up after {seconds:g} s; states {[s for s, _, _ in seen[-5:]]}\n{server.log_tail()}")


def assert_restart_measured(text: str, target: str, outside: float, launched_at: float) -> float:
    """The exporter counted one restart, its startup within a second of the one measured from outside (launch
    to the first /health 200), stamped at the launch; the startup it measured."""
    assert value(text, "oomguard_target_restarts_total", target=target) == 1.0
    measured = value(text, "oomguard_target_startup_seconds", target=target)
    assert abs(measured - outside) <= 1.0, (measured, outside)
    assert value(text, "oomguard_target_last_restart_timestamp_seconds", target=target) == pytest.approx(
        launched_at, abs=1.0
    )
    return measured


async def exporter_before_the_server(
    server: ServerProcess, log_path: Path, state_dir: Path, aiohttp_client: Any, **target: str
) -> Any:
    """An exporter (an aiohttp test client) whose one target, "tiny", is `server`, its log followed (events quiet after
    2 s), started first: it takes the end of the (empty) log as its start, so every line the server writes afterwards
    must be read, and the failure in them counted once. `target`: more of the target's settings (its `engine`)."""
    config = load_config(
        None,
        {
            "state_dir": str(state_dir),
            "events": {"quiet_seconds": 2, "poll_interval_seconds": 0.2, "kernel_log": False},
            "nvml": {"enabled": False},
            "targets": [{"name": "tiny", "url": server.url, **target, "logs": [str(log_path)]}],
        },
    )
    log_path.touch()
    client = await aiohttp_client(make_app(Runtime(config, nvml_lib=None)))
    await asyncio.sleep(0.5)
    return client


async def events_once_quiet(client: Any, first: str, kinds: tuple[str, ...], *, seconds: float) -> tuple[dict, str]:
    """The target "tiny"'s counts of `kinds` once `first` is counted (or `seconds` have passed) and the events' quiet
    spell is over: a second event, if any, would be counted by then. With the exposition they were read from."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = await (await client.get("/metrics")).text()
        if value(text, "oomguard_target_events_total", target="tiny", kind=first) >= 1:
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(2.5)  # quiet_seconds 2
    text = await (await client.get("/metrics")).text()
    return {k: value(text, "oomguard_target_events_total", target="tiny", kind=k) for k in kinds}, text
