"""Hostile strings and hostile exporters against the status page, /status.json and `oomguard top`.

A model, target, pod or GPU name is whatever an engine, a pod or a log says it is; `oomguard top` reads whatever
answers at the URL it is given. Each case runs the real code: the exporter behind make_app scraping a real engine
server on 127.0.0.1 (and a real Prometheus scraping the exporter), `oomguard top` through its command line against
real HTTP servers that answer as an attacker would. The table of cases is `CASES`; docs/faults.md prints it, and
`test_docs_table_is_current` keeps the two equal. Each case failed on the code before its fix.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.server
import json
import re
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from hostile_cases import Case, assert_documented
from support import promtool_check_metrics, samples, vllm_body
from web_serving import Pki

from oomguard.common.ports import free_port
from oomguard.common.served_process import ServedProcess
from oomguard.exporter.config_loader import load_config
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.status import top
from oomguard.exporter.status.view import GpuRow, Holding, StatusView, TargetRow
from oomguard.exporter.web import make_app
from oomguard.simulate.fake_nvml import GIB, FakeGpu, FakeNvml

CASES = [
    Case("names", "a served model name holding U+2028, U+2029, NEL, CR, FF, VT, FS or ESC (the engine's /metrics)",
         "`/`, `/status.json` and `oomguard top` answer as for any name: the view is built from the snapshot, not "
         "from the text; /metrics writes each such character as a visible escape (`\\u2028`, `\\x1b`), text that "
         "promtool and any line splitter read as one line",
         "test_a_model_name_with_line_separators_keeps_the_status_page_up"),
    Case("names", "the same name, scraped by a real Prometheus 2.42", "the target up, no scrape error; the label "
         "stored as its visible escapes", "test_a_real_prometheus_reads_the_escaped_name"),
    Case("top", "names holding an OSC 52 clipboard write, a window title, colours, CR, U+2028, a bidi override",
         "every control character (C0, DEL, C1), line or paragraph separator and bidi control shown escaped "
         "(`\\x1b]52;...`); only the frame's own line feeds reach the terminal",
         "test_top_shows_control_characters_escaped"),
    Case("top", "a redirect to another host, or from https to plain http, with basic auth", "no redirect followed: "
         "one line naming where it pointed, exit 2; the other host gets no request", "test_top_follows_no_redirect"),
    Case("top", "a slow drip: the head or the body one byte every 0.2 s", "one deadline per fetch (`--timeout`: "
         "connection, TLS, head and body together): one line, exit 2", "test_top_has_one_deadline_per_fetch"),
    Case("top", "JSON that is no status document: a field of the wrong type, a row without its name, "
         "nesting 100,000 deep, 5 MB", "one line naming what is wrong (the field's path), exit 2, no traceback",
         "test_top_refuses_a_body_that_is_not_the_status_document"),
    Case("top", "figures no GPU has: NaN, ±Infinity, ±1e308 in every number field, the sparkline included",
         "drawn as they are or as full, never a traceback", "test_top_draws_any_number"),
    Case("top", "120,000 targets, 5,000 GPUs, 5,000 conditions", "`--once` prints at most 64 of each, each line "
         "cut to the width, and how many were left out", "test_top_output_is_bounded"),
    Case("top", "`--username` to a plain http address", "a warning on stderr before the password is sent "
         "(loopback addresses excepted)", "test_top_warns_before_credentials_go_over_plain_http"),
    Case("headers", "`/status.json` read as another type", "`X-Content-Type-Options: nosniff` on `/` and "
         "`/status.json`", "test_the_status_answers_say_nosniff"),
]  # fmt: skip


def test_docs_table_is_current() -> None:
    assert_documented(CASES, globals())


OOMGUARD = Path(sys.executable).with_name("oomguard")
# What a terminal or a line splitter acts on: C0 but the frame's line feed, DEL, C1, the line and paragraph
# separators, the bidi embeddings, overrides and isolates.
ACTED_ON = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
SEPARATORS = {"LS": "\u2028", "PS": "\u2029", "NEL": "\x85", "CR": "\r", "FF": "\x0c", "VT": "\x0b", "FS": "\x1c",
              "ESC": "\x1b"}  # fmt: skip
HOSTILE_MODEL = "tiny" + "".join(SEPARATORS.values()) + "[2J"
VISIBLE_MODEL = r"tiny\u2028\u2029\x85\x0d\x0c\x0b\x1c\x1b[2J"


# --- the exporter: a hostile model name through the scrape, the exposition, the view ---------------------------


async def _exporter(aiohttp_server, aiohttp_client, model: str):  # type: ignore[no-untyped-def]
    body = vllm_body("vllm-0.32.0-cpu-under-load.txt").replace('model_name="tiny"', f'model_name="{model}"')
    assert model in body

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=body)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    engine = web.Application()
    engine.router.add_get("/metrics", metrics)
    engine.router.add_get("/health", health)
    server = await aiohttp_server(engine)
    config = load_config(None, {
        "targets": [{"name": "hostile", "url": f"http://127.0.0.1:{server.port}", "gpus": [0]}],
        "scrape": {"timeout_seconds": 2},
        "events": {"kernel_log": False, "xid": False},
    })  # fmt: skip
    return await aiohttp_client(make_app(Runtime(config, nvml_lib=FakeNvml([FakeGpu(0, used_bytes=70 * GIB)]))))


async def test_a_model_name_with_line_separators_keeps_the_status_page_up(
    aiohttp_server, aiohttp_client, promtool: str
) -> None:
    client = await _exporter(aiohttp_server, aiohttp_client, HOSTILE_MODEL)
    metrics = await (await client.get("/metrics")).text()
    # The model's series are there, its name as visible escapes: no character a line splitter breaks at.
    assert ("oomguard_engine_requests_waiting", (("model_name", VISIBLE_MODEL), ("target", "hostile"))) in samples(
        metrics
    )
    assert not ACTED_ON.search(metrics), ascii(ACTED_ON.search(metrics))
    assert metrics.splitlines() == metrics.split("\n")[:-1]
    assert promtool_check_metrics(promtool, metrics.encode()) == ""
    for path in ("/", "/status.json"):
        response = await client.get(path)
        assert response.status == 200, (path, await response.text())
    view = await (await client.get("/status.json")).json()
    assert [t["name"] for t in view["targets"]] == ["hostile"] and view["targets"][0]["waiting"] == 1.0
    # `oomguard top` reads it (blocking: in a thread, while this loop serves).
    code, out, err = await asyncio.to_thread(run_top, str(client.make_url("")), "--once")
    assert code == 0 and "hostile" in out, err


async def test_a_real_prometheus_reads_the_escaped_name(aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    client = await _exporter(aiohttp_server, aiohttp_client, HOSTILE_MODEL)
    prometheus_port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        f"scrape_configs: [{{job_name: oomguard, static_configs: [{{targets: ['127.0.0.1:{client.server.port}']}}]}}]\n"
    )
    prometheus = ServedProcess(
        ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{prometheus_port}"],
        tmp_path / "prometheus.log", f"http://127.0.0.1:{prometheus_port}/-/ready",
    )  # fmt: skip
    api = f"http://127.0.0.1:{prometheus_port}/api/v1"
    await asyncio.to_thread(prometheus.start)
    try:
        deadline = time.monotonic() + 60
        while True:
            found = await asyncio.to_thread(_api, f"{api}/query?query=oomguard_engine_requests_waiting")
            if found["data"]["result"]:
                break
            assert time.monotonic() < deadline, prometheus.log_tail()
            await asyncio.sleep(0.2)
        assert [r["metric"]["model_name"] for r in found["data"]["result"]] == [VISIBLE_MODEL]
        targets = (await asyncio.to_thread(_api, f"{api}/targets"))["data"]["activeTargets"]
        assert [(t["health"], t["lastError"]) for t in targets] == [("up", "")]
    finally:
        await asyncio.to_thread(prometheus.stop)


def _api(url: str) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


async def test_the_status_answers_say_nosniff(aiohttp_server, aiohttp_client) -> None:
    client = await _exporter(aiohttp_server, aiohttp_client, "tiny")
    for path in ("/", "/status.json"):
        response = await client.get(path)
        assert response.status == 200 and response.headers.get("X-Content-Type-Options") == "nosniff", path


# --- oomguard top against servers that answer as an attacker would -------------------------------------------


def run_top(*argv: str) -> tuple[int, str, str]:
    """`oomguard top ARGV` in this process, through its own argument parser: (exit code, stdout, stderr)."""
    parser = argparse.ArgumentParser()
    top.add_arguments(parser)
    args = parser.parse_args(list(argv))
    out, err = _Capture(), _Capture()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err  # type: ignore[assignment]
    try:
        code = top.main(args)
    finally:
        sys.stdout, sys.stderr = saved
    return code, out.text(), err.text()


class _Capture:
    """A stream for print(): what was written, in order (capsys is per test, and a thread prints here)."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def text(self) -> str:
        return "".join(self.parts)


Answer = Callable[[http.server.BaseHTTPRequestHandler], None]


@dataclass
class Server:
    """A real HTTP(S) server on 127.0.0.1 that answers every GET with `answer`, and notes what it was sent."""

    answer: Answer
    context: ssl.SSLContext | None = None
    requests: list[dict[str, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests.append({"path": self.path, **dict(self.headers)})
                # The client may give up first: what the slow answers wait for.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    owner.answer(self)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self  # type: ignore[attr-defined]
        if self.context is not None:
            self.httpd.socket = self.context.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        scheme = "https" if self.context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers() -> Iterator[Callable[..., Server]]:
    made: list[Server] = []

    def make(answer: Answer, context: ssl.SSLContext | None = None) -> Server:
        made.append(Server(answer, context))
        return made[-1]

    yield make
    for server in made:
        server.close()


def json_answer(document: object) -> Answer:
    body = document if isinstance(document, bytes) else json.dumps(document).encode()

    def answer(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return answer


def status_document(name: str = "sim-vllm", node: str = "", why: str = "full in 24s") -> dict:  # type: ignore[type-arg]
    gpu = GpuRow(node, "0", 80 * GIB, 74 * GIB, 72 * GIB, 2 * GIB, 0.25, "climbing", 24.0, [name], [0.9, 0.92])
    target = TargetRow(name, engine="vllm", pod=f"ns/{name}", state="up", kv_cache=1.0, waiting=48, running=16,
                       last_oom_at=time.time() - 60, last_oom_kind=name, gpus=["0"])  # fmt: skip
    holding = Holding("OomGuardGpuMemoryExhaustedSoon", "critical", f"GPU {name}", why)
    return StatusView(time.time(), [gpu], [target], {name: False, "nvml": True}, [holding], thresholds=name).to_json()


TERMINAL_ATTACKS = {  # the name, and how it is shown
    "OSC 52 clipboard write": ("\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07", r"\x1b]52;c;Y3VybCBl"),
    "window title": ("\x1b]0;root@prod\x07", r"\x1b]0;root@prod\x07"),
    "colours and a cleared screen": ("\x1b[31m\x1b[2Jred", r"\x1b[31m\x1b[2Jred"),
    "C1 CSI": ("\x9b2J", r"\x9b2J"),
    "CR over the line": ("ok\rPAGE", r"ok\x0dPAGE"),
    "line separator": ("a\u2028b", r"a\u2028b"),
    "bidi override": ("\u202egpj.exe", r"\u202egpj.exe"),
    "DEL and NUL": ("a\x7f\x00b", r"a\x7f\x00b"),
}


@pytest.mark.parametrize("attack", TERMINAL_ATTACKS)
def test_top_shows_control_characters_escaped(servers: Callable[..., Server], attack: str) -> None:
    name, shown = TERMINAL_ATTACKS[attack]
    server = servers(json_answer(status_document(name, node=name, why=name)))
    code, out, err = run_top(server.url, "--once")
    assert code == 0, err
    assert not ACTED_ON.search(out), ascii(out)
    assert shown in out, (shown, out)


def _redirect_to(location: Callable[[], str]) -> Answer:
    def answer(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(302)
        handler.send_header("Location", location())
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_top_follows_no_redirect(servers: Callable[..., Server], pki: Pki, tmp_path: Path, scheme: str) -> None:
    elsewhere = servers(json_answer(status_document()))
    context = None
    if scheme == "https":
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(pki.server.cert, pki.server.key)
    redirecting = servers(_redirect_to(lambda: elsewhere.url + "/status.json"), context)
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    code, out, err = run_top(redirecting.url, "--once", "--username", "sre", "--password-file", str(password),
                             "--ca-file", str(pki.ca.cert))  # fmt: skip
    assert code == 2 and "redirect" in err and elsewhere.url in err, (out, err)
    assert len(err.strip().splitlines()) == 1, err  # one line (to a loopback address: no warning)
    assert elsewhere.requests == []
    assert [r.get("Authorization", "").startswith("Basic ") for r in redirecting.requests] == [True]


def _drip(where: str) -> Answer:
    def answer(handler: http.server.BaseHTTPRequestHandler) -> None:
        owner: Server = handler.server.owner  # type: ignore[attr-defined]
        handler.wfile.write(b"HTTP/1.1 200 OK\r\n")
        if where == "body":
            handler.wfile.write(b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
        else:
            handler.wfile.write(b"X-Slow: ")
        handler.wfile.flush()
        while not owner.stop.wait(0.2):  # a byte every 0.2 s, until the test ends
            handler.wfile.write(b" ")
            handler.wfile.flush()

    return answer


@pytest.mark.parametrize("where", ["head", "body"])
def test_top_has_one_deadline_per_fetch(servers: Callable[..., Server], where: str) -> None:
    server = servers(_drip(where))
    # In a child process: before the fix this read for as long as the drip lasts (a byte resets a per-read
    # timeout); the 60 s here only bounds the test, the deadline asked for is 1 s.
    done = subprocess.run([str(OOMGUARD), "top", server.url, "--once", "--timeout", "1"], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, done
    assert "within 1s" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


NOT_THE_DOCUMENT = {
    "a GPU that is a number": (b'{"taken_at": 1, "gpus": [1], "targets": [], "sources": {}, "holding": []}',
                               "gpus[0]"),
    "a condition without its fields": (b'{"taken_at": 1, "gpus": [], "targets": [], "sources": {}, "holding": [{}]}',
                                       "holding[0]"),
    "a target without its name": (b'{"taken_at": 1, "gpus": [], "targets": [{"state": "up"}], "sources": {}, '
                                  b'"holding": []}', "targets[0].name"),
    "a name that is a number": (b'{"taken_at": 1, "gpus": [], "targets": [{"name": 7}], "sources": {}, '
                                b'"holding": []}', "targets[0].name"),
    "a time that is text": (b'{"taken_at": "noon", "gpus": [], "targets": [], "sources": {}, "holding": []}',
                            "taken_at"),
    "restarts as text": (b'{"taken_at": 1, "gpus": [], "targets": [{"name": "t", "restarts": "many"}], '
                         b'"sources": {}, "holding": []}', "targets[0].restarts"),
    "nested 100,000 deep": (b"[" * 100_000 + b"]" * 100_000, "nested"),
    "5 MB": (b'{"pad": "' + b"x" * 5_000_000 + b'"}', "MiB"),
}  # fmt: skip


@pytest.mark.parametrize("kind", NOT_THE_DOCUMENT)
def test_top_refuses_a_body_that_is_not_the_status_document(servers: Callable[..., Server], kind: str) -> None:
    body, named = NOT_THE_DOCUMENT[kind]
    server = servers(json_answer(body))
    code, out, err = run_top(server.url, "--once")
    assert code == 2 and out == "", (out, err)
    assert named in err and "status" in err and len(err.strip().splitlines()) == 1, err


NUMBERS = ("total_bytes", "used_bytes", "reserved_bytes", "beyond_bytes", "headroom_used", "seconds_to_full",
           "kv_cache", "waiting", "running", "last_oom_at", "restarts", "startup_seconds", "taken_at")  # fmt: skip


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e308", "-1e308"])
def test_top_draws_any_number(servers: Callable[..., Server], number: str) -> None:
    document = json.dumps(status_document())
    for key in NUMBERS:
        document = re.sub(rf'"{key}": [^,\]}}]+', f'"{key}": {number}', document)
    document = re.sub(r'"spark": \[[^\]]*\]', f'"spark": [0.5, {number}, 1e-308, {number}]', document)
    server = servers(json_answer(document.encode()))
    code, out, err = run_top(server.url, "--once")
    assert code == 0 and "Traceback" not in err, err
    assert "sim-vllm" in out


def test_top_output_is_bounded(servers: Callable[..., Server], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    document = status_document()
    document["targets"] = [{"name": f"t{i:06d}" + "x" * (2000 if i == 0 else 0)} for i in range(120_000)]
    document["gpus"] = [{"node": "n", "gpu": str(i), "targets": ["t"] * 5} for i in range(5_000)]
    document["holding"] = [{"alert": "A", "severity": "critical", "subject": str(i), "why": "w"} for i in range(5_000)]
    server = servers(json_answer(document))
    code, out, err = run_top(server.url, "--once")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) < 300 and max(len(line) for line in lines) <= 120, len(lines)
    assert "119,936 more targets" in out and "4,936 more GPUs" in out and "4,936 more conditions" in out, out[-800:]


def test_top_warns_before_credentials_go_over_plain_http(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    # TEST-NET-1 (RFC 5737): no one answers; the warning comes first all the same.
    code, _, err = run_top("http://192.0.2.1:9847", "--once", "--timeout", "0.5", "--username", "sre",
                             "--password-file", str(password))  # fmt: skip
    assert code == 2
    first = err.splitlines()[0]
    assert "warning" in first and "plain http" in first and "https://" in first, err
