"""Run a real llama.cpp `llama-server` (CPU build, tiny random GGUF model) for the test suite.

The binary is built by scripts/install-llamacpp.sh; the model is written by tiny_gguf.py with the
`gguf` package. Stdlib only besides those: the server runs as a child process group.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from tests.real import server as real_server
from tests.real.server import HOST, ServerProcess, post_json
from tests.real.server import free_port as free_port  # the tests' one import for the server's helpers

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


class LlamaServer(ServerProcess):
    """One `llama-server --metrics` process (its own process group)."""

    title = "llama-server"
    poll_seconds = 0.05  # it loads in about a second

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
        super().__init__(port, log_path, "oomguard-llamacpp")
        self.model = Path(model)
        self.slots = slots
        self.ctx_per_slot = ctx_per_slot
        self.extra_args = tuple(extra_args)

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

    def environment(self) -> dict[str, str]:
        # LLAMA_ARG_* variables set flags: one left in the environment would change the server under test.
        return {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}

    def wait_healthy(self, timeout: float = 60.0) -> float:
        return super().wait_healthy(timeout)


def completion(url: str, prompt: list[int], n_predict: int, timeout: float = 120.0) -> tuple[int, dict]:
    """POST /completion with token ids; ignore_eos makes it generate exactly n_predict tokens."""
    body = {"prompt": prompt, "n_predict": n_predict, "ignore_eos": True, "temperature": 0.0, "cache_prompt": False}
    status, answer = post_json(url + "/completion", json.dumps(body).encode(), timeout)
    return status, json.loads(answer) if status == 200 else {}


def run_load(url: str, n: int, prompt_tokens: int, n_predict: int, timeout: float = 120.0) -> real_server.LoadRun:
    """Fire n concurrent completions; prompts are token ids of the tiny vocabulary's byte tokens (3..258)."""

    def one(i: int) -> int:
        prompt = [3 + (i * 31 + j * 7) % 256 for j in range(prompt_tokens)]
        return completion(url, prompt, n_predict, timeout)[0]

    return real_server.run_load(n, one)
