"""`oomguard healthcheck`: is the exporter on this host answering? The container image's HEALTHCHECK.

It asks the local listener for `/-/healthy` the way the listener serves: plain HTTP, or https under the
web configuration (`--web.config.file`). The check runs beside the server, which it has no name for and no
password of (the web configuration holds only bcrypt hashes), so:
- the server's certificate is not verified (liveness, not trust: nothing secret is sent);
- behind basic auth, a 401 is an answer of the exporter's own HTTP stack: alive;
- when the server requires a client certificate, the handshake showing the configured certificate is the answer.
Without a web configuration given (the server had it as a flag, which a HEALTHCHECK does not see) it tries
plain HTTP, then https.
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from oomguard.exporter.config import DEFAULT_PORT, Config, ConfigError, parse_listen_address
from oomguard.exporter.config_loader import load_config

Load = Callable[[Path], Config]  # a configuration file -> its configuration (config_loader.load_config or serve's)
# What a status of /-/healthy says about the exporter.
ALIVE_STATUSES = {200: "healthy", 401: "answering behind basic auth"}
_REQUIRES_CLIENT_CERTIFICATE = ("RequireAnyClientCert", "RequireAndVerifyClientCert")


@dataclass(frozen=True)
class Result:
    ok: bool
    line: str


def _unverified() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _ask(host: str, port: int, tls: bool, timeout: float) -> Result:
    scheme = "https" if tls else "http"
    url = f"{scheme}://{host}:{port}/-/healthy"
    connection: http.client.HTTPConnection = (
        http.client.HTTPSConnection(host, port, timeout=timeout, context=_unverified())
        if tls
        else http.client.HTTPConnection(host, port, timeout=timeout)
    )
    try:
        connection.request("GET", "/-/healthy")
        status = connection.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        return Result(False, f"{url}: {type(exc).__name__}: {exc}")
    finally:
        connection.close()
    if status in ALIVE_STATUSES:
        return Result(True, f"{url}: {status}, {ALIVE_STATUSES[status]}")
    return Result(False, f"{url}: {status}")


def _handshake(host: str, port: int, cert_file: Path, timeout: float) -> Result:
    """A server that requires a client certificate answers no request without one: the TLS handshake, and the
    certificate it shows being the web configuration's, are the answer."""
    url = f"https://{host}:{port}"
    try:
        pem = cert_file.read_text()
        expected = ssl.PEM_cert_to_DER_cert(pem[: pem.index("-----END CERTIFICATE-----") + 25])
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            _unverified().wrap_socket(raw, server_hostname=None) as tls,
        ):
            shown = tls.getpeercert(binary_form=True)
    except (OSError, ValueError) as exc:
        return Result(False, f"{url}: {type(exc).__name__}: {exc}")
    if shown != expected:
        return Result(False, f"{url}: the TLS listener shows another certificate than {cert_file}")
    return Result(True, f"{url}: the TLS listener answered with {cert_file.name} (it requires client certificates)")


def check(address: str, web_config_file: Path | None, timeout: float = 4.0) -> Result:
    """One check of the listener at `address` (HOST:PORT, as --web.listen-address), under that web configuration."""
    host, port = parse_listen_address(address)
    if host in ("", "0.0.0.0", "::"):  # listening everywhere: ask the loopback
        host = "127.0.0.1"
    if web_config_file is not None:
        from oomguard.exporter.web_config.model import parse, resolve

        tls = parse(web_config_file).tls_server_config
        if tls is not None and tls.cert_file and tls.client_auth_type in _REQUIRES_CLIENT_CERTIFICATE:
            return _handshake(host, port, resolve(web_config_file.absolute().parent, tls.cert_file), timeout)
        return _ask(host, port, tls is not None and tls.enabled, timeout)
    plain = _ask(host, port, False, timeout)
    if plain.ok:
        return plain
    secure = _ask(host, port, True, timeout)
    return secure if secure.ok else Result(False, f"{plain.line}; {secure.line}")


def listen_address(flag: str | None, config_file: str | None, load: Load = load_config) -> str:
    """As `serve` reads it: the flag or $OOMGUARD_WEB_LISTEN_ADDRESS, else the configuration file's (read with `load`,
    serve's: cli.py gives the one with the simulation's checks), else :9847."""
    if flag:
        return flag
    if os.environ.get("OOMGUARD_WEB_LISTEN_ADDRESS"):
        return os.environ["OOMGUARD_WEB_LISTEN_ADDRESS"]
    config = config_file or os.environ.get("OOMGUARD_CONFIG")
    if config:
        try:
            return load(Path(config)).web.listen_address
        except ConfigError:
            pass  # serve refuses it and stops: the connection below fails and says so
    return f":{DEFAULT_PORT}"


def main(address: str | None, config_file: str | None, web_config_file: str | None, load: Load = load_config) -> int:
    web_config = web_config_file or os.environ.get("OOMGUARD_WEB_CONFIG_FILE")
    try:
        result = check(listen_address(address, config_file, load), Path(web_config) if web_config else None)
    except ConfigError as exc:
        result = Result(False, str(exc))
    print(result.line)
    return 0 if result.ok else 1
