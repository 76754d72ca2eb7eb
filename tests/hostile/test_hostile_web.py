"""Hostile web configuration and hostile network clients of the exporter's port.

The table is `CASES` below, and docs/faults.md prints it (`test_docs_table_is_current`). Every case runs
the real code: the file is written as an editor or a `>` redirect writes it (not atomically), the server
is the real listener on 127.0.0.1, the process cases start `oomguard serve`. Waits are on conditions with
a deadline, never a bare sleep. Each test fails without the guard it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from hostile_cases import Case, assert_documented
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from web_serving import PASSWORD, Pki, Serve, basic, bcrypt_hash, get, wait_until, write_atomically

from oomguard.common.ports import free_port
from oomguard.exporter.config import ConfigError
from oomguard.exporter.web_config import WebConfigState, load_web_config
from oomguard.exporter.web_config import auth as auth_module
from oomguard.exporter.web_config.auth import AuthBusy, BasicAuth

CASES = [
    Case(
        "reload",
        "the file emptied, or cut after `tls_server_config` (a `>` redirect, an editor mid-write), "
        "or a version without basic auth, TLS or client certificates",
        "refused as a weakening: the last good configuration serves, the reload gauge reads 0, one log line; "
        "only a restart lowers protection",
        "test_a_reload_never_weakens_protection",
    ),
    Case(
        "reload",
        "a non-UTF-8 byte, YAML nested 2000 deep, a FIFO at the path, 2 MB of text",
        "a clear one-line refusal; the reload loop lives on and the next good version is loaded",
        "test_a_hostile_reload_is_refused_and_the_loop_lives_on",
    ),
    Case(
        "reload",
        "random bytes, random YAML, the good file cut at a random byte (hypothesis)",
        "no exception escapes; TLS, client certificates and basic auth stay required",
        "test_fuzz_reloads_never_raise_and_never_weaken",
    ),
    Case(
        "start",
        "the same files at start, and a bcrypt hash of cost 31",
        "exit 1 with the problem on stderr, no traceback, no hang (cost above 14 is refused at load)",
        "test_a_hostile_file_at_start_exits_1_without_a_traceback",
    ),
    Case(
        "process",
        "a non-UTF-8 byte, then a FIFO, in the file of a running `serve --simulate`",
        "the process keeps serving; SIGTERM stops it, and the simulated engine's children are gone",
        "test_a_running_exporter_survives_hostile_reloads_and_cleans_up",
    ),
    Case(
        "TLS",
        "a client that saved a TLS 1.2 or 1.3 session resumes it after `client_ca_file` changed",
        "a new CA means a new listener (a new SSL context): the session is not resumed, the old certificate is refused",
        "test_a_client_ca_change_ends_resumable_sessions",
    ),
    Case(
        "auth",
        "wrong passwords for a cheap user, a costly user and a name that does not exist",
        "the same bcrypt work for every name (decoys top a cheaper hash up to the highest cost)",
        "test_failing_costs_the_same_for_every_name",
    ),
    Case(
        "auth",
        "a flood of wrong passwords right after a reload",
        "the verified-password cache outlives "
        "the reload (same hash): the scraper is let in while the guesses are still in bcrypt",
        "test_a_cached_scraper_never_waits_behind_guesses_after_a_reload",
    ),
    Case(
        "auth",
        "a flood of wrong passwords from one address right after start (nothing cached)",
        "bcrypt one per core, waits served address by address: another address waits at most one turn; "
        "excess guesses get 429 at once",
        "test_guesses_from_one_address_do_not_starve_another",
    ),
    Case(
        "auth",
        "`rate_limit: {interval, burst}` (the toolkit's key)",
        "one token bucket, 429 before any bcrypt; an unchanged bucket survives a reload",
        "test_rate_limit_as_the_toolkit",
    ),
    Case(
        "connections",
        "a client that sends half a request head, or half a TLS handshake, and waits",
        "closed after the header timeout (15 s)",
        "test_a_slow_client_is_closed_after_the_header_timeout",
    ),
    Case(
        "connections",
        "more connections than the limit (the server's share of the descriptors, a quarter: docs/security.md)",
        "each one over it closed at once, before any TLS; one log line per minute",
        "test_connections_over_the_limit_are_closed_at_once",
    ),
    Case(
        "connections",
        "one address opening more than an eighth of the limit",
        "each one over its share closed at once: other addresses still get in",
        "test_one_address_cannot_take_every_connection",
    ),
    Case(
        "connections",
        "a malformed request; any request",
        "`Server: oomguard`, no Python or aiohttp version",
        "test_no_versions_in_the_server_header",
    ),
]


def test_docs_table_is_current() -> None:
    assert_documented(CASES, globals())


# ---------------------------------------------------------------- helpers (fixtures pki and serve: tests/conftest.py)


def full_text(pki: Pki, ca_file: Path | None = None, **extra: Any) -> str:
    """TLS, a verified client certificate and basic auth: the most a file can ask for."""
    tls = {"cert_file": str(pki.server.cert), "key_file": str(pki.server.key),
           "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(ca_file or pki.ca.cert)}  # fmt: skip
    users = {"prometheus": bcrypt_hash(PASSWORD)}
    # TLS first, as the toolkit's example orders it: a write cut after its block leaves TLS and no auth.
    return yaml.safe_dump({"tls_server_config": tls, "basic_auth_users": users} | extra, sort_keys=False)


async def reload_refused(state: WebConfigState) -> None:
    await wait_until(lambda: not state.last_reload_successful, timeout=15, what="the reload to be refused")


def release_fifo_reader(fifo: Path) -> None:
    """Puts a regular file at the path, then lets go any reader blocked in open() on the FIFO (a reader that opens
    it unguarded blocks there for good: the test fails, not hangs): through a hard link, as the path is no longer
    the FIFO."""
    if not fifo.is_fifo():
        return
    keep = fifo.with_name(fifo.name + ".fifo")
    os.link(fifo, keep)
    scratch = fifo.with_name(fifo.name + ".tmp")
    scratch.write_text("")
    os.replace(scratch, fifo)
    for _ in range(100):  # until no reader waits (ENXIO): one may have been on its way in
        try:
            os.close(os.open(keep, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            break
        time.sleep(0.01)
    keep.unlink()


# ---------------------------------------------------------------- reloads


def _weakenings(pki: Pki) -> dict[str, str]:
    good = yaml.safe_load(full_text(pki))
    tls_only = {"tls_server_config": good["tls_server_config"]}
    no_client_cert = dict(good, tls_server_config={k: v for k, v in good["tls_server_config"].items()
                                                   if k not in ("client_auth_type", "client_ca_file")})  # fmt: skip
    text = full_text(pki)
    return {
        "emptied": "",
        "cut after tls_server_config": text[: text.index("basic_auth_users")],
        "no basic auth": yaml.safe_dump(tls_only),
        "no TLS": yaml.safe_dump({"basic_auth_users": good["basic_auth_users"]}),
        "no client certificates": yaml.safe_dump(no_client_cert),
    }


@pytest.mark.parametrize("kind", ["emptied", "cut after tls_server_config", "no basic auth", "no TLS",
                                  "no client certificates"])  # fmt: skip
async def test_a_reload_never_weakens_protection(serve: Serve, pki: Pki, kind: str) -> None:
    served = await serve(full_text(pki))
    assert served.state is not None
    client = pki.client_context(client=pki.client)
    served.file.write_text(_weakenings(pki)[kind])  # not atomic: what `: > file` or an editor leaves
    await reload_refused(served.state)
    assert served.state.current.ssl_context is not None and served.state.current.auth is not None
    assert (await get(served.url, client))[0] == 401  # auth still asked for
    with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
        await get(served.url.replace("https://", "http://"), False, ("prometheus", PASSWORD))  # TLS still on
    with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
        await get(served.url, pki.client_context(), ("prometheus", PASSWORD))  # a certificate still required
    status, _, body = await get(served.url, client, ("prometheus", PASSWORD))
    assert status == 200 and "oomguard_web_config_last_reload_successful 0" in body


def _hostile_file(kind: str, file: Path, pki: Pki) -> None:
    if kind == "non-UTF-8 byte":
        file.write_bytes(full_text(pki).encode() + b"# caf\xe9\n")
    elif kind == "nested 2000 deep":
        file.write_text(full_text(pki) + "rate_limit: " + "[" * 2000 + "]" * 2000 + "\n")
    elif kind == "2 MB":
        file.write_text(full_text(pki) + "#" + "x" * 2_000_000 + "\n")
    elif kind == "FIFO":
        file.unlink()
        os.mkfifo(file)


@pytest.mark.parametrize("kind", ["non-UTF-8 byte", "nested 2000 deep", "2 MB", "FIFO"])
async def test_a_hostile_reload_is_refused_and_the_loop_lives_on(serve: Serve, pki: Pki, kind: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    served = await serve(full_text(pki))
    assert served.state is not None
    try:
        _hostile_file(kind, served.file, pki)
        await reload_refused(served.state)
        refusals = [r for r in caplog.records if "did not change" in r.getMessage()]
        assert len(refusals) == 1 and "Traceback" not in refusals[0].getMessage()
        # Still polled: a good version (a new password) is loaded, and the gauge is back at 1.
        if not served.file.is_file():
            served.file.unlink()
        write_atomically(served.file, full_text(pki).replace("prometheus", "renamed"))
        await wait_until(lambda: served.state.last_reload_successful, timeout=15, what="the next good version")
        status, *_ = await get(served.url, pki.client_context(client=pki.client), ("renamed", PASSWORD))
        assert status == 200
    finally:
        if kind == "FIFO":
            release_fifo_reader(served.file)


def _hostile_start(kind: str, file: Path, pki: Pki) -> str:
    """Writes the file; returns what stderr must say."""
    if kind == "bcrypt cost 31":  # well-formed, not computed: checking it would take days
        file.write_text(yaml.safe_dump({"basic_auth_users": {"alice": "$2y$31$" + "a" * 53}}))
        return "bcrypt cost 31 is above 14"
    if kind == "FIFO":
        os.mkfifo(file)
        return "not a regular file"
    file.write_text(full_text(pki))
    _hostile_file(kind, file, pki)
    return {"non-UTF-8 byte": "not UTF-8", "nested 2000 deep": "nested too deep", "2 MB": "over 1048576 bytes"}[kind]


def oomguard(*args: str) -> list[str]:
    return [sys.executable, "-m", "oomguard", "serve", "--no-collector.nvml", *args]


@pytest.mark.parametrize("kind", ["non-UTF-8 byte", "nested 2000 deep", "2 MB", "FIFO", "bcrypt cost 31"])
def test_a_hostile_file_at_start_exits_1_without_a_traceback(tmp_path: Path, pki: Pki, kind: str) -> None:
    file = tmp_path / "web.yml"
    expected = _hostile_start(kind, file, pki)
    try:
        result = subprocess.run(oomguard("--web.config.file", str(file), "--web.listen-address", "127.0.0.1:0"),
                                capture_output=True, text=True, timeout=30)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"oomguard hung at start on a web configuration with a {kind}")
    finally:
        if kind == "FIFO":
            release_fifo_reader(file)
    assert result.returncode == 1, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr


def test_bcrypt_cost_above_the_bound_is_refused_at_load(tmp_path: Path) -> None:
    file = tmp_path / "web.yml"
    # A well-formed hash of cost 15, not computed (that would take seconds).
    file.write_text(yaml.safe_dump({"basic_auth_users": {"alice": "$2b$15$" + "a" * 53}}))
    with pytest.raises(ConfigError, match="bcrypt cost 15 is above 14"):
        load_web_config(file)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


def test_a_running_exporter_survives_hostile_reloads_and_cleans_up(tmp_path: Path, pki: Pki) -> None:
    file = tmp_path / "web.yml"
    file.write_text(full_text(pki))
    log = tmp_path / "oomguard.log"
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(oomguard("--simulate", "steady", "--web.config.file", str(file),
                                         "--web.listen-address", f"127.0.0.1:{port}"),
                                stdout=out, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    client = pki.client_context(client=pki.client)
    engines: list[int] = []

    def scrape() -> str:
        request = urllib.request.Request(f"https://127.0.0.1:{port}/metrics", headers=basic("prometheus", PASSWORD))
        try:
            with urllib.request.urlopen(request, context=client, timeout=10) as response:
                return response.read().decode()
        except OSError:
            return ""

    try:
        _wait(lambda: proc.poll() is None and bool(_children(proc.pid)) and bool(scrape()), "serving, engine up")
        engines += _children(proc.pid)
        with file.open("ab") as appended:  # printf '# caf\xe9\n' >> web.yml
            appended.write(b"# caf\xe9\n")
        _wait(lambda: "not UTF-8" in log.read_text() or proc.poll() is not None, "the refusal")
        assert proc.poll() is None, log.read_text()
        assert "oomguard_web_config_last_reload_successful 0" in scrape()
        file.unlink()
        os.mkfifo(file)
        _wait(lambda: "not a regular file" in log.read_text() or proc.poll() is not None, "the FIFO refused")
        assert proc.poll() is None, log.read_text()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("SIGTERM did not stop oomguard")
        assert proc.returncode == 0, log.read_text()
        _wait(lambda: not any(_alive(pid) for pid in engines), "the simulated engine to be gone", timeout=30)
        assert "Traceback" not in log.read_text()
    finally:
        release_fifo_reader(file)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in engines + _children(proc.pid):  # an orphaned engine too (an unguarded stop leaves one)
            if _alive(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- hypothesis: reloads of anything


def _cut_versions(text: str) -> st.SearchStrategy[bytes]:
    return st.integers(0, len(text)).map(lambda n: text.encode()[:n])


def _yaml_documents(pki: Pki) -> st.SearchStrategy[bytes]:
    scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20),
                        st.sampled_from([str(pki.server.cert), str(pki.server.key), str(pki.ca.cert), "1s", "0",
                                         "NoClientCert", "RequireAndVerifyClientCert", bcrypt_hash("x")]))  # fmt: skip
    values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                           st.dictionaries(st.text(max_size=12), inner, max_size=3)),
                          max_leaves=12)  # fmt: skip
    keys = st.sampled_from(["tls_server_config", "basic_auth_users", "http_server_config", "rate_limit",
                            "cert_file", "client_auth_type", "client_ca_file", "headers"])  # fmt: skip
    tls_keys = st.fixed_dictionaries({}, optional={
        "cert_file": st.sampled_from([str(pki.server.cert), "/nonexistent"]),
        "key_file": st.sampled_from([str(pki.server.key), str(pki.client.key)]),
        "client_auth_type": st.sampled_from(["NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"]),
        "client_ca_file": st.sampled_from([str(pki.ca.cert), str(pki.stranger_ca)]),
    })  # fmt: skip
    documents = st.one_of(
        st.dictionaries(keys, values, max_size=4),
        st.fixed_dictionaries(
            {},
            optional={
                "tls_server_config": tls_keys,
                "basic_auth_users": st.dictionaries(st.text(max_size=8), scalars, max_size=2),
            },
        ),
        values,
    )
    return documents.map(lambda d: yaml.safe_dump(d).encode())


@pytest.fixture(scope="module")
def fuzz_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "web.yml"


def _fuzz(pki: Pki, fuzz_file: Path, contents: bytes) -> None:
    fuzz_file.write_text(full_text(pki))
    state = WebConfigState(load_web_config(fuzz_file))
    fuzz_file.write_bytes(contents)  # not atomic, as an editor writes
    asyncio.run(state.poll())  # must not raise, whatever the bytes
    current = state.current
    assert current.ssl_context is not None, "TLS was turned off by a reload"
    assert current.auth is not None, "basic auth was turned off by a reload"
    assert current.handshake is not None and current.handshake.verify_mode == ssl.CERT_REQUIRED


_FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                 suppress_health_check=(HealthCheck.too_slow, HealthCheck.function_scoped_fixture))  # fmt: skip


@pytest.mark.parametrize("source", ["random bytes", "random YAML", "the good file cut"])
def test_fuzz_reloads_never_raise_and_never_weaken(pki: Pki, fuzz_file: Path, source: str) -> None:
    strategy = {"random bytes": st.binary(max_size=600), "random YAML": _yaml_documents(pki),
                "the good file cut": _cut_versions(full_text(pki))}[source]  # fmt: skip

    @_FUZZ
    @given(contents=strategy)
    def run(contents: bytes) -> None:
        _fuzz(pki, fuzz_file, contents)

    run()


# ---------------------------------------------------------------- TLS sessions


def _session_get(port: int, context: ssl.SSLContext, session: ssl.SSLSession | None) -> tuple[int | None, Any, bool]:
    """One request on a new connection offering `session`: (status or None if refused, the session, reused)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="127.0.0.1", session=session) as tls:
                reused = tls.session_reused
                auth = basic("prometheus", PASSWORD)["Authorization"]
                tls.sendall(f"GET /-/healthy HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n"
                            "Connection: close\r\n\r\n".encode())  # fmt: skip
                answer = b""
                while chunk := tls.recv(65536):
                    answer += chunk
                status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else None
                return status, tls.session, reused
        except (ssl.SSLError, ConnectionError, OSError):
            return None, None, False


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3], ids=["TLS1.2", "TLS1.3"])
async def test_a_client_ca_change_ends_resumable_sessions(serve: Serve, pki: Pki, tmp_path: Path,
                                                         version: ssl.TLSVersion) -> None:  # fmt: skip
    ca_file = tmp_path / "clients.crt"
    ca_file.write_bytes(pki.ca.cert.read_bytes())
    served = await serve(full_text(pki, ca_file))
    assert served.state is not None
    client = pki.client_context(client=pki.client)
    client.minimum_version = client.maximum_version = version
    port = served.server.port
    status, session, _ = await asyncio.to_thread(_session_get, port, client, None)
    assert status == 200 and session is not None
    status, session, reused = await asyncio.to_thread(_session_get, port, client, session)
    assert status == 200 and reused, "the server must resume sessions, or this test proves nothing"
    before = served.state.last_success_timestamp
    write_atomically(ca_file, pki.stranger_ca.read_text())  # the former client CA is revoked
    await wait_until(lambda: served.state.last_success_timestamp > before, what="the new client CA loaded")
    assert (await asyncio.to_thread(_session_get, port, client, None))[0] is None  # a full handshake is refused
    status, _, reused = await asyncio.to_thread(_session_get, port, client, session)
    assert not reused and status is None, "a session saved under the former CA was resumed"


async def test_a_new_client_ca_is_said_loaded_only_once_its_listener_serves(
    serve: Serve, pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reload's success (metrics, log) comes after the listener is replaced: said before, a client of the
    former CA could still connect to the old listener, or a client found no listener at all (the test above
    met a refused connection once, right after the new CA read as loaded)."""
    ca_file = tmp_path / "clients.crt"
    ca_file.write_bytes(pki.ca.cert.read_bytes())
    served = await serve(full_text(pki, ca_file))
    assert served.state is not None
    seen: list[tuple[bool, bool]] = []  # at each adoption: (the listener is the new one's, a connect is answered)
    adopt = WebConfigState._adopt

    def watched(state: WebConfigState, settings: Any) -> None:
        key = served.server._listener_key  # which configuration the listener serves
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", served.server.port), timeout=2):
            seen.append((key == settings.listener_key, True))
            return adopt(state, settings)
        seen.append((key == settings.listener_key, False))
        return adopt(state, settings)

    monkeypatch.setattr(WebConfigState, "_adopt", watched)
    before = served.state.last_success_timestamp
    write_atomically(ca_file, pki.stranger_ca.read_text())
    await wait_until(lambda: served.state.last_success_timestamp > before, what="the new client CA loaded")
    assert seen == [(True, True)], "the reload was put in force before its listener served"


# ---------------------------------------------------------------- basic auth


@pytest.fixture
def bcrypt_work(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """bcrypt's work per check, in units of cost 0 (2^cost), as each hash is run."""
    work: list[int] = []
    real = auth_module._bcrypt_matches

    def measured(hashed: bytes, password: bytes) -> bool:
        work.append(2 ** int(hashed[4:6]))
        return real(hashed, password)

    monkeypatch.setattr(auth_module, "_bcrypt_matches", measured)
    return work


def header(user: str, password: str) -> str:
    return basic(user, password)["Authorization"]


def _hash(password: str, cost: int) -> str:
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()


async def test_failing_costs_the_same_for_every_name(bcrypt_work: list[int]) -> None:
    auth = BasicAuth({"cheap": _hash("right", 4), "costly": _hash("right", 6)})
    costs = {}
    for user in ("cheap", "costly", "nobody"):
        bcrypt_work.clear()
        assert not await auth.check(header(user, "wrong"))
        costs[user] = sum(bcrypt_work)
    assert costs == {"cheap": 2**6, "costly": 2**6, "nobody": 2**6}


class Gate:
    """Holds every bcrypt run for a wrong password until opened; records the passwords in the order bcrypt ran."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open = threading.Event()
        self.ran: list[bytes] = []
        self.lock = threading.Lock()
        real = auth_module._bcrypt_matches

        def gated(hashed: bytes, password: bytes) -> bool:
            with self.lock:
                self.ran.append(password)
            if password != PASSWORD.encode():
                self.open.wait(30)
            return real(hashed, password)

        monkeypatch.setattr(auth_module, "_bcrypt_matches", gated)


async def test_a_cached_scraper_never_waits_behind_guesses_after_a_reload(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = await serve(yaml.safe_dump({"basic_auth_users": {"prometheus": bcrypt_hash(PASSWORD)}}))
    assert served.state is not None
    assert (await get(served.url, False, ("prometheus", PASSWORD), "/-/healthy"))[0] == 200  # now cached
    before = served.state.last_success_timestamp
    text = served.file.read_text()
    write_atomically(served.file, text + "http_server_config: {headers: {X-Frame-Options: deny}}\n")
    await wait_until(lambda: served.state.last_success_timestamp > before, what="the reload")
    gate = Gate(monkeypatch)
    guesses = [asyncio.ensure_future(get(served.url, False, ("prometheus", f"guess{i}"), "/-/healthy"))
               for i in range(20)]  # fmt: skip
    try:
        await wait_until(lambda: len(gate.ran) >= 1, what="a guess in bcrypt")
        try:
            status, *_ = await asyncio.wait_for(get(served.url, False, ("prometheus", PASSWORD), "/-/healthy"), 10)
        except TimeoutError:
            pytest.fail("the scraper waited behind the guesses")
        assert status == 200
    finally:
        gate.open.set()
        await asyncio.gather(*guesses, return_exceptions=True)


async def test_guesses_from_one_address_do_not_starve_another(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = BasicAuth({"prometheus": _hash(PASSWORD, 4)})
    gate = Gate(monkeypatch)
    slots = auth.slots.slots
    guesses = [asyncio.ensure_future(auth.check(header("prometheus", f"guess{i}"), "192.0.2.66")) for i in range(50)]
    await wait_until(lambda: len(gate.ran) >= slots, what="the guesses in bcrypt")
    scraper = asyncio.ensure_future(auth.check(header("prometheus", PASSWORD), "192.0.2.1"))
    queued = auth_module.WAITING_PER_PEER + 1  # the guesses' share of the queue, and the scraper
    await wait_until(lambda: auth.slots.waiting == queued, what="the scraper's check queued behind the guesses")
    gate.open.set()
    assert await asyncio.wait_for(scraper, 30)
    results = await asyncio.gather(*guesses, return_exceptions=True)
    position = gate.ran.index(PASSWORD.encode())
    assert position <= slots + 1, f"the scraper's check ran after {position} guesses"
    assert any(isinstance(r, AuthBusy) for r in results)  # the excess was refused at once, not queued
    assert all(r is False or isinstance(r, AuthBusy) for r in results)


async def test_rate_limit_as_the_toolkit(serve: Serve, bcrypt_work: list[int]) -> None:
    text = yaml.safe_dump({"basic_auth_users": {"prometheus": bcrypt_hash(PASSWORD)},
                           "rate_limit": {"interval": "1h", "burst": 2}})  # fmt: skip
    served = await serve(text)
    assert served.state is not None
    assert (await get(served.url, False, ("prometheus", PASSWORD), "/-/healthy"))[0] == 200
    assert (await get(served.url, False, ("prometheus", "wrong"), "/-/healthy"))[0] == 401
    work = len(bcrypt_work)
    status, headers, _ = await get(served.url, False, ("prometheus", "wrong"), "/-/healthy")
    assert status == 429 and headers.get("Retry-After") == "1"
    assert len(bcrypt_work) == work  # refused before any bcrypt
    assert served.server.counters.requests_refused == {"unauthorized": 1, "rate_limit": 1}
    # An unchanged rate_limit keeps its bucket over a reload (a fresh one would hand out a fresh burst).
    before = served.state.last_success_timestamp
    write_atomically(served.file, text + "http_server_config: {headers: {X-Frame-Options: deny}}\n")
    await wait_until(lambda: served.state.last_success_timestamp > before, what="the reload")
    assert (await get(served.url, False, ("prometheus", PASSWORD), "/-/healthy"))[0] == 429


# ---------------------------------------------------------------- connections


async def _closed_by_server(port: int, send: bytes, timeout: float = 15) -> bool:
    """Connects, sends `send`, and waits for the server to close the connection (True) within `timeout`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(send)
        await writer.drain()
        try:
            while await asyncio.wait_for(reader.read(65536), timeout):
                pass
        except TimeoutError:
            return False
        return True
    finally:
        writer.close()


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_a_slow_client_is_closed_after_the_header_timeout(serve: Serve, pki: Pki, scheme: str) -> None:
    text = None if scheme == "http" else full_text(pki)
    served = await serve(text, header_timeout=0.5)
    # Half a request head (over http), or half a ClientHello's record header (over https), then nothing.
    half = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" if scheme == "http" else b"\x16\x03\x01"
    assert await _closed_by_server(served.server.port, half), "a slow client kept its connection"


async def test_connections_over_the_limit_are_closed_at_once(serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    served = await serve(None, max_connections=4, max_connections_per_address=4)
    held = [await asyncio.open_connection("127.0.0.1", served.server.port) for _ in range(4)]
    try:
        await wait_until(lambda: served.server.connections == 4, what="4 connections open")
        for _ in range(3):
            assert await _closed_by_server(served.server.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", timeout=5)
        assert served.server.refused_connections == 3
        refusals = [r for r in caplog.records if "refused a connection" in r.getMessage()]
        assert len(refusals) == 1  # once per interval, not per connection
    finally:
        for _, writer in held:
            writer.close()
    await wait_until(lambda: served.server.connections == 0, what="the held connections to close")
    status, _, body = await get(served.url, False)
    assert status == 200 and "oomguard_web_connections_refused_total 3.0" in body


@pytest.mark.parametrize("with_file", [False, True], ids=["no web config", "web config"])
async def test_no_versions_in_the_server_header(serve: Serve, with_file: bool) -> None:
    served = await serve(
        yaml.safe_dump({"http_server_config": {"headers": {"X-Frame-Options": "deny"}}}) if with_file else None
    )
    _, headers, _ = await get(served.url, False, path="/-/healthy")
    assert headers["Server"] == "oomguard"
    reader, writer = await asyncio.open_connection("127.0.0.1", served.server.port)
    try:
        writer.write(b"GARBAGE\x01 / HTTP/1.1\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()
    assert answer.split(b" ", 2)[1] == b"400" and b"Server: oomguard\r\n" in answer, answer[:300]
    assert b"Python" not in answer and b"aiohttp" not in answer


async def test_one_address_cannot_take_every_connection(serve: Serve) -> None:
    served = await serve(None, max_connections=8, max_connections_per_address=2)
    held = [await asyncio.open_connection("127.0.0.1", served.server.port) for _ in range(2)]
    try:
        await wait_until(lambda: served.server.connections == 2, what="2 connections open")
        assert await _closed_by_server(served.server.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", timeout=5)
        assert served.server.refused_connections == 1 and served.server.connections == 2
        assert served.server.refusal("192.0.2.1") is None  # another address still gets in (6 places left)
    finally:
        for _, writer in held:
            writer.close()


def test_the_connection_limit_is_a_quarter_of_the_descriptors() -> None:
    from oomguard.exporter.web_config.server import connection_limit

    # The rest is the engines', the log streams' and the files' (descriptors.py, tests/test_descriptors.py).
    assert connection_limit(256) == 64
    assert connection_limit(1024) == 256
    assert connection_limit(65536) == 16384
    assert connection_limit(100) == 25


def test_the_engines_connections_are_an_eighth_of_the_descriptors() -> None:
    from oomguard.exporter.web_config.server import connection_limit, scrape_connection_limit

    assert scrape_connection_limit(1024) == 128
    assert scrape_connection_limit(20000) == 2500
    assert scrape_connection_limit(1 << 30) == 4096
    assert scrape_connection_limit(100) == 32
    for soft in (256, 1024, 4096, 65536, 1 << 20):  # at least an eighth, and 64, stay for NVML, /proc and files
        assert connection_limit(soft) + scrape_connection_limit(soft) <= soft - max(64, soft // 8)
