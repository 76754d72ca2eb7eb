"""Certificates made for the tests (a CA, a server certificate for 127.0.0.1, client certificates),
web configuration files, and oomguard served in-process under one: helpers of tests/web_config/ and
tests/hostile/test_hostile_web.py, whose fixtures `pki` and `serve` tests/conftest.py gives."""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import bcrypt
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from oomguard.exporter.config_loader import load_config
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app
from oomguard.exporter.web_config import WebConfigState, load_web_config
from oomguard.exporter.web_config.server import Server
from oomguard.simulate.fake_nvml import FakeGpu, FakeNvml

PASSWORD = "s3cret scrape"


def bcrypt_hash(password: str, prefix: str = "$2y$") -> str:
    """Cost 4 (the least) keeps the tests fast; `prefix` as htpasswd ($2y$) or other tools write it."""
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()
    return prefix + hashed[4:]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


@dataclass
class Issued:
    cert: Path
    key: Path


class Authority:
    """A CA writing PEM files into `folder`."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder = folder
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
            ), critical=True)
            .sign(self._key, hashes.SHA256())
        )  # fmt: skip
        self.cert = folder / f"{name}.crt"
        self.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, stem: str, *, server: bool) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(stem))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
                ),
                critical=False,
            )
        cert = builder.sign(self._key, hashes.SHA256())
        issued = Issued(self.folder / f"{stem}.crt", self.folder / f"{stem}.key")
        issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        issued.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return issued


@dataclass
class Pki:
    ca: Authority
    server: Issued
    client: Issued
    stranger: Issued  # a client certificate from a CA the server does not trust
    stranger_ca: Path

    def client_context(self, *, client: Issued | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca.cert))
        if client is not None:
            context.load_cert_chain(client.cert, client.key)
        return context


def make_pki(folder: Path) -> Pki:
    """A CA with a server and a client certificate, and a stranger's client certificate from another CA."""
    ca = Authority(folder, "ca")
    other = Authority(folder, "other-ca")
    return Pki(ca, ca.issue("server", server=True), ca.issue("client", server=False),
               other.issue("stranger", server=False), other.cert)  # fmt: skip


def write_atomically(path: Path, text: str) -> None:
    """As a deploy tool (or a Kubernetes secret) replaces a file: never half-written when read."""
    scratch = path.with_name(path.name + ".tmp")
    scratch.write_text(text)
    os.replace(scratch, path)


def web_config_text(pki: Pki, *, password: str = PASSWORD, client_auth: str | None = "RequireAndVerifyClientCert",
                    **extra: Any) -> str:  # fmt: skip
    tls: dict[str, Any] = {"cert_file": str(pki.server.cert), "key_file": str(pki.server.key)}
    if client_auth:
        tls |= {"client_auth_type": client_auth, "client_ca_file": str(pki.ca.cert)}
    document: dict[str, Any] = {"tls_server_config": tls, "basic_auth_users": {"prometheus": bcrypt_hash(password)}}
    return yaml.safe_dump(document | extra)


@dataclass
class Served:
    url: str
    state: WebConfigState | None  # None: served without a web configuration file
    server: Server
    file: Path


Serve = Callable[..., Awaitable[Served]]


async def wait_until(condition: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> None:
    """Polls an async or plain condition until true: the reload runs on its own schedule."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.05)


@asynccontextmanager
async def serving(folder: Path) -> AsyncIterator[Serve]:
    """`await serve(text, **server_options)`: oomguard (fake GPU, no targets) on a free port under that web
    configuration, written to `folder`; text None: no file. Every server started is stopped on leaving."""
    servers: list[Server] = []

    async def start(text: str | None, **options: Any) -> Served:
        file = folder / "web-config.yml"
        state = None
        if text is not None:
            file.write_text(text)
            state = WebConfigState(await asyncio.to_thread(load_web_config, file))
        config = load_config(None, {
            "events": {"kernel_log": False, "xid": False}, "trend": {"enabled": False},
            "discovery": {"local": "off"},  # no engine: not one another test runs on this host
        })  # fmt: skip
        app = make_app(Runtime(config, nvml_lib=FakeNvml([FakeGpu(0)])), state)
        server = Server(app, "127.0.0.1", 0, state, poll_seconds=0.1, **options)
        await server.start()
        servers.append(server)
        scheme = "https" if state and state.current.ssl_context else "http"
        return Served(f"{scheme}://127.0.0.1:{server.port}", state, server, file)

    try:
        yield start
    finally:
        for server in servers:
            await server.stop()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def get(url: str, ssl_context: ssl.SSLContext | bool, auth: tuple[str, str] | None = None,
              path: str = "/metrics") -> tuple[int, dict[str, str], str]:  # fmt: skip
    """One request on a new connection (so each sees the configuration in force)."""
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session,
        session.get(url + path, ssl=ssl_context, headers=basic(*auth) if auth else None,
                    timeout=aiohttp.ClientTimeout(total=10)) as response,
    ):  # fmt: skip
        return response.status, dict(response.headers), await response.text()


async def peer_certificate(url: str, ssl_context: ssl.SSLContext) -> x509.Certificate:
    """The certificate the server presents to a new connection."""
    host, port = url.removeprefix("https://").rsplit(":", 1)
    _, writer = await asyncio.open_connection(host, int(port), ssl=ssl_context)
    try:
        return x509.load_der_x509_certificate(writer.get_extra_info("ssl_object").getpeercert(binary_form=True))
    finally:
        writer.close()
