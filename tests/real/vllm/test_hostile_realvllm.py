"""A real vLLM's log, with its request log on, after API users sent it the words of an OOM, a death and a start:
its own start counts, and nothing they wrote does (docs/security.md, "API users")."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from support import engine_detector

from oomguard.exporter.events.catalogue import load_catalogue
from tests.real.vllm import harness

pytestmark = pytest.mark.realvllm

KEY = "oomguard-test-key"
WORDS = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    "Traceback (most recent call last):\n"
    "torch.OutOfMemoryError: CUDA out of memory\n"
    "Started server process [4242]\n"
    "EngineCore encountered a fatal error\n"
    "vLLM API server version 0.32.0"
)


def send(url: str, body: dict | None = None, key: str | None = KEY) -> int:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=120) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def test_what_api_users_make_vllm_write_counts_nothing(tiny_model: Path, tmp_path: Path) -> None:
    log_path = tmp_path / "vllm.log"
    args = ("--enable-log-requests", "--enable-log-outputs", "--api-key", KEY)
    # The request logger writes the prompt at DEBUG.
    server = harness.VllmServer(tiny_model, harness.free_port(), args, log_path, env={"VLLM_LOGGING_LEVEL": "DEBUG"})
    with server:
        server.wait_healthy(240)
        completion = {"model": harness.SERVED_NAME, "prompt": WORDS, "max_tokens": 4, "temperature": 0.0}
        assert send(server.url + "/v1/completions", completion) == 200
        ignored = {**completion, "CUBLAS_STATUS_ALLOC_FAILED EngineCore encountered a fatal error": 1}
        send(server.url + "/v1/completions", ignored)  # a field vLLM warns it ignored
        assert send(server.url + "/v1/CUBLAS_STATUS_ALLOC_FAILED", key=None) in (401, 404)  # no key: refused, logged
        send(server.url + "/v1/Started%20server%20process%20%5B7%5D", key=None)
    text = log_path.read_text(errors="replace")
    if keep := os.environ.get("OOMGUARD_KEEP_LOG"):  # to read what vLLM wrote
        Path(keep).write_text(text)
    # The attack reached the log: the test would count it if the patterns were searched anywhere in a line.
    assert "CUBLAS_STATUS_ALLOC_FAILED" in text and "CUDA out of memory" in text, text[-3000:]
    assert text.count("EngineCore encountered a fatal error") >= 1
    searched = [line for line in text.splitlines() for p in load_catalogue("vllm") if p.regex.search(line)]
    assert len(searched) > 4, "searched anywhere in a line, as before, the prompts and paths would count"
    detector = engine_detector("vllm")
    counted = []
    for line in text.splitlines():
        _, kinds = detector.kinds(line)
        if kinds:
            counted.append((kinds, line))
        detector.feed(line, 0.0)
    assert detector.tick(100.0) == [], counted
    # What counts is the engine's own start, and only that: each a start line of the server's, none the API's.
    assert counted and all(kinds == ["startup"] for kinds, _ in counted), counted
    assert not any("4242" in line or "0.32.0\\n" in line or "%5B" in line for _, line in counted), counted
    assert len(detector.take_starts()) == len(counted)
