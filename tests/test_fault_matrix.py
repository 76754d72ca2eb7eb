"""The fault matrix: each fault injected on the real code path, what the exporter must show, what it must keep.

The table is `MATRIX` below, and docs/faults.md prints it (a test keeps the two equal). Targets are
real aiohttp servers on 127.0.0.1 scraped by the real Runtime behind make_app; NVML is FakeNvml with its
faults; logs are real files followed by the real EventRunner; the state file is written by its real
write path, with the failing system call injected by monkeypatch (root ignores permissions, and there
is no tiny filesystem to fill here). Waits are on conditions with a deadline, never a bare sleep.
"""

from __future__ import annotations

import asyncio
import datetime
import errno
import ipaddress
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from support import REPO, Clock, samples, settle, until_sync, value
from targets_zoo import Zoo

from oomguard.exporter.config_loader import load_config
from oomguard.exporter.events.runner import STATE_FILE, EventRunner
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app
from oomguard.simulate.fake_nvml import GIB, FakeGpu, FakeNvml, FakeProcess


@dataclass(frozen=True)
class Fault:
    area: str
    fault: str
    shows: str  # what the exporter must show
    keeps: str  # what it must keep
    test: str  # the test below that injects it


MATRIX = [
    Fault("target", "hang: no answer within the target's timeout", 'up 0, `scrape_errors_total{kind="timeout"}`',
          "/metrics answers within the timeout; the other targets; the GPU series", "test_target_faults"),
    Fault("target", "HTTP 500", 'up 0, `kind="http_status"`', "the same", "test_target_faults"),
    Fault("target", "a 20 MB body (over `scrape.max_body_bytes`)", 'up 0, `kind="too_large"`', "the same",
          "test_target_faults"),
    Fault("target", "slowloris: one byte a second", 'up 0, `kind="timeout"`', "the same", "test_target_faults"),
    Fault("target", "connection reset in mid-body", 'up 0, `kind="other"` (a transport failure after the answer began)',
          "the same", "test_target_faults"),
    Fault("target", "HTTPS with a certificate of an unknown CA", 'up 0, `kind="tls"`', "the same",
          "test_target_faults"),
    Fault("nvml", "a GPU falls off the bus (GPU_IS_LOST)", '`oomguard_gpu_up{gpu}` 0 for that GPU',
          "the other GPUs' series; the targets", "test_nvml_lost_gpu"),
    Fault("nvml", "library missing", "`oomguard_nvml_up` 0, `source_success{source=\"nvml\"}` 0",
          "the targets", "test_nvml_missing_library"),
    Fault("nvml", "a call that hangs", '`source_success{source="nvml"}` 0 within `nvml.timeout_seconds`',
          "the targets; no second read stacked behind the hung one; the GPU series back once it returns",
          "test_nvml_hung_call"),
    Fault("logs", "the followed file vanishes", "nothing counted from it, no error out of the poll",
          "the other targets' counts; its count goes on when it comes back", "test_log_vanished"),
    Fault("logs", "a file without read permission", "`event_source_read_errors_total` +1",
          "the other targets' counts; its lines once readable", "test_log_without_permission"),
    Fault("logs", "rotation storm: 100 renames a second for 2 s, polled meanwhile", "N incidents written: N counted",
          "every count", "test_log_rotation_storm"),
    Fault("state_dir", "full (ENOSPC on write)", "`event_state_write_errors_total` +1",
          "the counts in memory; the previous state file, intact; no temporary file left", "test_state_dir_full"),
    Fault("state_dir", "read-only (EROFS)", "`event_state_write_errors_total` +1",
          "the counts in memory; the next write once writable", "test_state_dir_read_only"),
    Fault("state_dir", "a corrupt state file at start", "an error in the log; "
          "`event_state_read_errors_total` 1; the file kept aside as `events-state.json.corrupt`",
          "nothing recounted (every log from its end), counting afresh, visibly", "test_state_file_corrupt"),
    Fault("state_dir", "SIGTERM in the middle of a write", "-",
          "the state file always valid JSON (temporary file, then rename); no temporary files pile up",
          "test_sigterm_mid_write"),
]  # fmt: skip


def table() -> str:
    rows = ["| area | fault | the exporter shows | and keeps | test |", "|---|---|---|---|---|"]
    rows += [f"| {f.area} | {f.fault} | {f.shows} | {f.keeps} | `{f.test}` |" for f in MATRIX]
    return "\n".join(rows) + "\n"


def test_docs_table_is_current() -> None:
    assert table() in (REPO / "docs" / "faults.md").read_text(), "docs/faults.md: paste tests/test_fault_matrix.table()"
    names = {name for name in globals() if name.startswith("test_")}
    assert {f.test for f in MATRIX} <= names


# -- targets ------------------------------------------------------------------------------------------
def self_signed(tmp_path: Path) -> ssl.SSLContext:
    """A server context with a certificate no CA of the system signed."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "unknown-ca.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    return context


def runtime_app(targets: dict[str, str], lib: FakeNvml | None, *, timeout: float = 1.0) -> web.Application:
    config = load_config(
        None,
        {
            "targets": [{"name": name, "url": "http://127.0.0.1:9", "gpus": [0]} for name in targets],
            "scrape": {"timeout_seconds": timeout},
            "nvml": {"timeout_seconds": 0.5, "enabled": lib is not None},
            "events": {"kernel_log": False, "xid": False},
        },
    )
    # Tests only: each target's URL gets its behaviour's path (configured URLs take no path).
    config = config.model_copy(
        update={"targets": tuple(t.model_copy(update={"url": targets[t.name]}) for t in config.targets)}
    )
    return make_app(Runtime(config, nvml_lib=lib))


def gpus() -> FakeNvml:
    return FakeNvml(
        [FakeGpu(0, used_bytes=70 * GIB, processes=[FakeProcess(4242, 69 * GIB)]), FakeGpu(1, used_bytes=10 * GIB)]
    )


async def test_target_faults(aiohttp_client, aiohttp_server, tmp_path: Path) -> None:
    engines = Zoo()
    server = await aiohttp_server(engines.app())
    base = f"http://127.0.0.1:{server.port}"
    tls_runner = web.AppRunner(engines.app())
    await tls_runner.setup()
    tls_site = web.TCPSite(tls_runner, "127.0.0.1", 0, ssl_context=self_signed(tmp_path))
    await tls_site.start()
    tls_port = tls_runner.addresses[0][1]
    kinds = {"hang": "timeout", "500": "http_status", "huge": "too_large", "slowloris": "timeout",
             "reset": "other", "unknown-ca": "tls"}  # fmt: skip
    targets = {"good": f"{base}/good", **{k: f"{base}/{k}" for k in kinds if k != "unknown-ca"}}
    targets["unknown-ca"] = f"https://127.0.0.1:{tls_port}/good"
    client = await aiohttp_client(runtime_app(targets, gpus()))
    try:
        for scrape in range(2):  # the second scrape: the faults are still there, nothing stuck from the first
            started = time.monotonic()
            response = await client.get("/metrics")
            text = await response.text()
            elapsed = time.monotonic() - started
            assert response.status == 200
            assert elapsed < 1.0 + 1.5, f"scrape {scrape} took {elapsed:.2f}s: a fault held it past the timeout"
            assert value(text, "oomguard_target_up", target="good") == 1.0
            assert value(text, "oomguard_engine_requests_waiting", target="good", model_name="tiny") == 1.0
            assert value(text, "oomguard_gpu_memory_used_bytes", gpu="0") == 70 * GIB
            assert value(text, "oomguard_gpu_memory_used_bytes", gpu="1") == 10 * GIB
            assert value(text, "oomguard_source_success", source="nvml") == 1.0
            for name, kind in kinds.items():
                assert value(text, "oomguard_target_up", target=name) == 0.0, name
                errors = {
                    labels["kind"]: v
                    for (metric, labels_), v in samples(text).items()
                    if metric == "oomguard_target_scrape_errors_total"
                    and (labels := dict(labels_))["target"] == name
                    and v
                }
                assert errors == {kind: scrape + 1}, (name, errors)
    finally:
        engines.hang.set()
        await tls_runner.cleanup()


# -- NVML ---------------------------------------------------------------------------------------------
@pytest.fixture
async def good_target(aiohttp_server) -> str:
    server = await aiohttp_server(Zoo().app())
    return f"http://127.0.0.1:{server.port}/good"


async def test_nvml_lost_gpu(aiohttp_client, good_target: str) -> None:
    lib = gpus()
    client = await aiohttp_client(runtime_app({"good": good_target}, lib))
    text = await (await client.get("/metrics")).text()
    assert value(text, "oomguard_gpu_up", gpu="1") == 1.0
    lib.gpus[1].lost = True
    text = await (await client.get("/metrics")).text()
    assert value(text, "oomguard_gpu_up", gpu="1") == 0.0
    assert ("oomguard_gpu_memory_used_bytes", (("gpu", "1"),)) not in samples(text)
    assert value(text, "oomguard_gpu_up", gpu="0") == 1.0
    assert value(text, "oomguard_gpu_memory_used_bytes", gpu="0") == 70 * GIB
    assert value(text, "oomguard_target_up", target="good") == 1.0


async def test_nvml_missing_library(aiohttp_client, good_target: str) -> None:
    client = await aiohttp_client(runtime_app({"good": good_target}, FakeNvml(library_present=False)))
    text = await (await client.get("/metrics")).text()
    assert value(text, "oomguard_nvml_up") == 0.0
    assert value(text, "oomguard_source_success", source="nvml") == 0.0
    assert value(text, "oomguard_target_up", target="good") == 1.0


async def test_nvml_hung_call(aiohttp_client, good_target: str) -> None:
    release = threading.Event()
    lib = gpus()
    lib.before_call = lambda call: release.wait(20) if call.startswith("nvmlDeviceGetMemoryInfo") else None
    client = await aiohttp_client(runtime_app({"good": good_target}, lib))
    try:
        for _ in range(2):
            started = time.monotonic()
            text = await (await client.get("/metrics")).text()
            assert time.monotonic() - started < 0.5 + 1.5
            assert value(text, "oomguard_source_success", source="nvml") == 0.0
            assert value(text, "oomguard_target_up", target="good") == 1.0
        assert lib.calls["nvmlDeviceGetMemoryInfo_v2"] == 1  # waited on, not stacked
    finally:
        release.set()
    last: list[str] = [""]

    async def gpu_back() -> bool:
        last[0] = await (await client.get("/metrics")).text()
        return value(last[0], "oomguard_source_success", source="nvml") == 1.0

    deadline = time.monotonic() + 5
    while not await gpu_back():
        assert time.monotonic() < deadline, "NVML never came back after the hung call returned"
        await asyncio.sleep(0.02)
    assert value(last[0], "oomguard_gpu_memory_used_bytes", gpu="0") == 70 * GIB


# -- logs -----------------------------------------------------------------------------------------
OOM = [
    "(EngineCore pid={i}) ERROR 12-02 12:00:00 [core.py:701] EngineCore encountered a fatal error.",
    "(EngineCore pid={i}) Traceback (most recent call last):",
    "(EngineCore pid={i}) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    # The engine starts again: the next fatal error is a new death (events/detector.py).
    "(APIServer pid={i}) INFO 12-02 12:00:05 [api_server.py:1000] vLLM server version 0.32.0, serving model m",
]


def events_runner(tmp_path: Path, clock: Clock, logs: dict[str, list[str]]) -> EventRunner:
    config = load_config(
        None,
        {
            "state_dir": str(tmp_path / "state"),
            "events": {"kernel_log": False, "quiet_seconds": 5},
            "targets": [
                {"name": name, "url": f"http://127.0.0.1:{8000 + i}", "logs": globs}
                for i, (name, globs) in enumerate(logs.items())
            ],
        },
    )
    return EventRunner(config, clock=clock)


def oom(path: Path, i: int) -> None:
    with path.open("a") as f:
        f.write("".join(line.format(i=i) + "\n" for line in OOM))


def counted(r: EventRunner, target: str) -> int:
    c = r.counts.get(target)
    return c.total.get("cuda_oom", 0) if c else 0


def read_errors(r: EventRunner, target: str) -> int:
    return sum(h.read_errors for h in r.health() if h.target == target)


def test_log_vanished(tmp_path: Path) -> None:
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.touch()
    b.touch()
    clock = Clock()
    r = events_runner(tmp_path, clock, {"a": [str(a)], "b": [str(b)]})
    r.poll()
    oom(a, 1)
    settle(r, clock)
    a.unlink()
    oom(b, 2)
    settle(r, clock)
    assert (counted(r, "a"), counted(r, "b")) == (1, 1)
    oom(a, 3)  # it comes back
    settle(r, clock)
    assert (counted(r, "a"), counted(r, "b")) == (2, 1)
    r.close()


def test_log_without_permission(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As root, permission checks do not apply: PermissionError is injected where the OS raises it."""
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    clock = Clock()
    r = events_runner(tmp_path, clock, {"a": [str(a)], "b": [str(b)]})
    r.poll()
    real_open = os.open

    def open_(path: str, flags: int, *args: int) -> int:
        if str(path) == str(a):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", open_)
    oom(a, 1)  # created after start: read from its beginning once readable
    oom(b, 2)
    settle(r, clock)
    assert read_errors(r, "a") >= 1
    assert (counted(r, "a"), counted(r, "b")) == (0, 1)
    monkeypatch.undo()
    settle(r, clock)
    assert (counted(r, "a"), counted(r, "b")) == (1, 1)
    r.close()


def test_log_rotation_storm(tmp_path: Path) -> None:
    """100 rotations a second for 2 s (rename to a new numbered name, as logrotate with dateext does), an
    incident written around each, split across the rotation; a poller polls all the while."""
    log = tmp_path / "vllm.log"
    log.touch()
    clock = Clock()
    r = events_runner(tmp_path, clock, {"vllm": [str(tmp_path / "vllm.log*")]})
    r.poll()
    stop = threading.Event()
    polls = [0]

    def poller() -> None:
        while not stop.is_set():
            r.poll()
            polls[0] += 1

    thread = threading.Thread(target=poller)
    thread.start()
    written = 0
    try:
        started = time.monotonic()
        while time.monotonic() - started < 2.0:
            lines = [line.format(i=written) + "\n" for line in OOM]
            with log.open("a") as f:
                f.write("".join(lines[:2]))
            os.replace(log, tmp_path / f"vllm.log.{written:05d}")
            with log.open("a") as f:  # the rest of the traceback lands in the new file
                f.write("".join(lines[2:]))
            written += 1
            clock.now += 1
            time.sleep(0.01)  # the storm's pace: 100 rotations a second
    finally:
        stop.set()
        thread.join()
    assert written >= 100 and polls[0] >= 10
    # Lines split across a rotation are per stream: the detector still ties them by pid.
    settle(r, clock)
    settle(r, clock)
    assert counted(r, "vllm") == written
    assert read_errors(r, "vllm") == 0
    r.close()


# -- state_dir ------------------------------------------------------------------------------------------
def state_runner(tmp_path: Path, clock: Clock) -> tuple[EventRunner, Path]:
    log = tmp_path / "a.log"
    log.touch()
    return events_runner(tmp_path, clock, {"a": [str(log)]}), log


def saved_count(tmp_path: Path) -> int:
    return json.loads((tmp_path / "state" / STATE_FILE).read_text())["counts"]["a"]["total"]["cuda_oom"]


def temporaries(tmp_path: Path) -> list[str]:
    return [p.name for p in (tmp_path / "state").iterdir() if p.name != STATE_FILE]


def test_state_dir_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    r, log = state_runner(tmp_path, clock)
    r.poll()
    oom(log, 1)
    settle(r, clock)
    assert saved_count(tmp_path) == 1
    real_fdopen = os.fdopen

    class Full:
        """The real temporary file, on a disk that fills up at the first write."""

        def __init__(self, f) -> None:
            self.f = f

        def write(self, _: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: Full(real_fdopen(fd, *a, **k)))
    oom(log, 2)
    settle(r, clock)
    assert r.state_write_errors >= 1
    assert counted(r, "a") == 2  # kept in memory
    assert saved_count(tmp_path) == 1  # the previous file, intact
    assert temporaries(tmp_path) == []
    monkeypatch.undo()
    oom(log, 3)
    settle(r, clock)
    assert saved_count(tmp_path) == 3
    r.close()


def test_state_dir_read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    r, log = state_runner(tmp_path, clock)
    r.poll()

    def read_only(*_: object, **__: object) -> tuple[int, str]:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    oom(log, 1)
    settle(r, clock)
    assert r.state_write_errors >= 1
    assert counted(r, "a") == 1
    monkeypatch.undo()
    oom(log, 2)
    settle(r, clock)
    assert saved_count(tmp_path) == 2
    r.close()


def test_state_file_corrupt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    state = tmp_path / "state"
    state.mkdir()
    (state / STATE_FILE).write_text('{"counts": {"a": {"total": {"cuda_oom": 7}}')  # cut short
    log = tmp_path / "a.log"
    oom(log, 0)  # before the start: not recounted (no position is known)
    r, _ = state_runner(tmp_path, clock)
    assert "cannot read" in caplog.text and ".corrupt" in caplog.text
    assert (state / (STATE_FILE + ".corrupt")).read_text().startswith('{"counts"')
    assert r.state_read_errors == 1
    r.poll()
    oom(log, 1)
    settle(r, clock)
    assert counted(r, "a") == 1
    assert saved_count(tmp_path) == 1
    r.close()


WRITER = """
import sys
from oomguard.exporter.config_loader import load_config
from oomguard.exporter.events.runner import EventRunner
from oomguard.exporter.model import Counts
config = load_config(None, {"state_dir": sys.argv[1], "events": {"kernel_log": False},
                            "targets": [{"name": "a", "url": "http://127.0.0.1:8000", "logs": []}]})
r = EventRunner(config)
r.counts["a"] = Counts({"cuda_oom": 1}, {"cuda_oom": 1.0})
for i in range(2000):  # a state file of some size, so that a kill can land in the middle of a write
    r.counts[f"t{i}"] = Counts({"cuda_oom": i}, {"cuda_oom": float(i)})
print("writing", flush=True)
while True:
    r.counts["a"].total["cuda_oom"] += 1
    r._save()
"""


def test_sigterm_mid_write(tmp_path: Path) -> None:
    state = tmp_path / "state"
    seen = []
    for attempt in range(4):
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(state)], stdout=subprocess.PIPE, text=True, cwd=REPO
        )
        try:
            assert child.stdout is not None and child.stdout.readline() == "writing\n"
            until_sync(lambda: (state / STATE_FILE).exists(), 10, "the first state file")
            before = saved_count_of(state)
            until_sync(lambda: saved_count_of(state) > before + 3 * (attempt + 1), 10, "a few writes")  # noqa: B023
        finally:
            child.send_signal(signal.SIGTERM)
            child.wait(10)
        assert child.returncode == -signal.SIGTERM
        seen.append(saved_count_of(state))  # valid JSON, or this raises
    assert seen == sorted(seen)
    # The temporary files of the writes the kills cut short are cleared at the next start.
    load_config_runner = subprocess.run(
        [sys.executable, "-c", WRITER.replace("while True:", "while False:"), str(state)],
        capture_output=True, text=True, cwd=REPO, timeout=30,
    )  # fmt: skip
    assert load_config_runner.returncode == 0, load_config_runner.stderr
    assert [p.name for p in state.iterdir()] == [STATE_FILE]


def saved_count_of(state: Path) -> int:
    return json.loads((state / STATE_FILE).read_text())["counts"]["a"]["total"]["cuda_oom"]
