"""`oomguard healthcheck`, the image's HEALTHCHECK, against a real `oomguard serve`: plain, and https with
basic auth under a web configuration it has, or has not, been told of."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from oomguard.common.ports import free_port
from oomguard.drill.tls import make_drill_tls


def serve(port: int, *extra: str) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(
        [sys.executable, "-m", "oomguard", "serve", "--simulate", "steady", "--no-collector.nvml",
         "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "error", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"oomguard serve exited: {server.stderr.read().decode() if server.stderr else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server
        except OSError:
            time.sleep(0.05)  # polling the port, with the deadline above
    server.kill()
    raise AssertionError("oomguard serve did not listen within 20 s")


@contextmanager
def serving(*extra: str) -> Iterator[int]:
    """`oomguard serve` at a free port, stopped at the end; its port."""
    port = free_port()
    server = serve(port, *extra)
    try:
        yield port
    finally:
        server.terminate()
        server.wait(timeout=10)


def healthcheck(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oomguard", "healthcheck", *args], capture_output=True, text=True, timeout=30,
        env={"PATH": "/usr/bin:/bin"},  # none of the OOMGUARD_* variables of the test's environment
    )  # fmt: skip


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_drill_tls(tmp_path_factory.mktemp("healthcheck-tls"), bcrypt_cost=4).web_config


@pytest.fixture(scope="module")
def https_port(tls: Path) -> Iterator[int]:
    with serving("--web.config.file", str(tls)) as port:
        yield port


def test_plain_http(tmp_path: Path) -> None:
    with serving() as port:
        result = healthcheck("--web.listen-address", f"127.0.0.1:{port}")
    assert result.returncode == 0, result
    assert result.stdout.strip() == f"http://127.0.0.1:{port}/-/healthy: 200, healthy"


def test_https_with_basic_auth_under_its_web_config(https_port: int, tls: Path) -> None:
    # The password is not the healthcheck's to know: the exporter's 401 is its answer.
    result = healthcheck("--web.listen-address", f"127.0.0.1:{https_port}", "--web.config.file", str(tls))
    assert result.returncode == 0, result
    assert result.stdout.strip() == f"https://127.0.0.1:{https_port}/-/healthy: 401, answering behind basic auth"


def test_https_found_without_the_web_config(https_port: int) -> None:
    """The server had --web.config.file as a flag, which a HEALTHCHECK does not see: http fails, https answers."""
    result = healthcheck("--web.listen-address", f"127.0.0.1:{https_port}")
    assert result.returncode == 0, result
    assert f"https://127.0.0.1:{https_port}/-/healthy: 401" in result.stdout


def test_the_address_from_the_configuration_file(https_port: int, tls: Path, tmp_path: Path) -> None:
    config = tmp_path / "oomguard.yaml"
    config.write_text(f'web:\n  listen_address: "127.0.0.1:{https_port}"\n')
    result = healthcheck("--config", str(config), "--web.config.file", str(tls))
    assert result.returncode == 0, result


def test_nothing_listening_fails() -> None:
    port = free_port()
    result = healthcheck("--web.listen-address", f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert f"http://127.0.0.1:{port}/-/healthy: ConnectionRefusedError" in result.stdout
    assert f"https://127.0.0.1:{port}/-/healthy: ConnectionRefusedError" in result.stdout


def test_a_plain_server_is_not_healthy_as_https(tmp_path: Path, tls: Path) -> None:
    """Told https (the web config) while the server speaks http: a failure, not a pass."""
    with serving() as port:
        result = healthcheck("--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(tls))
    assert result.returncode == 1, result


def test_https_asking_for_a_client_certificate(tls: Path, tmp_path: Path) -> None:
    """RequireAndVerifyClientCert: the healthcheck has no client certificate; the server's TLS alert is its answer."""
    web_config = tmp_path / "web-config.yml"
    web_config.write_text(
        f"tls_server_config:\n  cert_file: {tls.parent / 'server.crt'}\n  key_file: {tls.parent / 'server.key'}\n"
        f"  client_ca_file: {tls.parent / 'ca.crt'}\n  client_auth_type: RequireAndVerifyClientCert\n"
    )
    with serving("--web.config.file", str(web_config)) as port:
        result = healthcheck("--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(web_config))
    assert result.returncode == 0, result
    assert "the TLS listener answered with server.crt (it requires client certificates)" in result.stdout
