"""The TLS half of the web configuration: an ssl.SSLContext from `tls_server_config`.

Go's client_auth_type maps onto OpenSSL's verify modes where they mean the same; where
Python's ssl cannot do what Go does, the mapping errs on the strict side (docs/security.md):

- RequestClientCert: Go asks for a certificate but neither verifies nor requires it, so
  anyone gets in; Python cannot ask without verifying, so it does not ask (CERT_NONE).
- RequireAnyClientCert: Go accepts any certificate, even self-signed; Python accepts only
  one that verifies (against client_ca_file, else the system's CAs), like RequireAndVerifyClientCert.
"""

from __future__ import annotations

import logging
import os
import ssl
import stat
from dataclasses import dataclass
from pathlib import Path

from oomguard.exporter.config import ConfigError
from oomguard.exporter.web_config.model import TlsServerConfig, resolve

log = logging.getLogger(__name__)

VERIFY_MODES: dict[str, ssl.VerifyMode] = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_NONE,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "RequireClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}


@dataclass(frozen=True)
class Handshake:
    """What OpenSSL copies into a connection from the listener's context when the connection begins.

    The certificate, key and client CAs are swapped per connection (see state.py); these are
    not, so a change to them needs a new listener."""

    verify_mode: ssl.VerifyMode
    minimum_version: ssl.TLSVersion
    maximum_version: ssl.TLSVersion
    server_cipher_preference: bool


def files(tls: TlsServerConfig, base: Path) -> list[Path]:
    """The files the TLS configuration reads, resolved against `base` (the web config's folder)."""
    return [resolve(base, name) for name in (tls.cert_file, tls.key_file, tls.client_ca_file) if name]


def handshake(tls: TlsServerConfig) -> Handshake:
    return Handshake(
        VERIFY_MODES[tls.client_auth_type or "NoClientCert"],
        _VERSIONS[tls.min_version],
        _VERSIONS[tls.max_version],
        tls.prefer_server_cipher_suites,
    )


def _encrypted_key() -> bytes:
    # Without a password callback OpenSSL would prompt on the terminal, and hang a reload.
    raise ConfigError("the key is encrypted; the toolkit's format takes an unencrypted key_file")


def _regular(path: Path, key: str, source: str) -> None:
    """OpenSSL reads the files itself, with blocking reads: a FIFO there would hang a reload for good."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ConfigError(f"{source}: tls_server_config.{key} ({path}): cannot read it: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{source}: tls_server_config.{key} ({path}): not a regular file; point at a PEM file")


def build_context(tls: TlsServerConfig, base: Path, source: str) -> ssl.SSLContext:
    """Reads the certificate, key and client CAs now (blocking: call it off the event loop)."""
    shape = handshake(tls)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.minimum_version = shape.minimum_version
        context.maximum_version = shape.maximum_version
    except ValueError as exc:
        raise ConfigError(f"{source}: tls_server_config.min_version/max_version: {exc}") from None
    if shape.server_cipher_preference:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    assert tls.cert_file and tls.key_file, "model.parse refuses TLS without them"
    cert, key = resolve(base, tls.cert_file), resolve(base, tls.key_file)
    _regular(cert, "cert_file", source)
    _regular(key, "key_file", source)
    try:
        context.load_cert_chain(cert, key, password=_encrypted_key)
    except ConfigError as exc:
        raise ConfigError(f"{source}: tls_server_config.key_file ({key}): {exc}") from None
    except OSError as exc:  # ssl.SSLError is an OSError
        raise ConfigError(
            f"{source}: tls_server_config.cert_file/key_file ({cert}, {key}): cannot load the pair: "
            f"{exc.strerror or exc}"
        ) from None
    if shape.verify_mode != ssl.CERT_NONE:
        if tls.client_ca_file:
            ca = resolve(base, tls.client_ca_file)
            _regular(ca, "client_ca_file", source)
            try:
                context.load_verify_locations(cafile=ca)
            except OSError as exc:
                raise ConfigError(
                    f"{source}: tls_server_config.client_ca_file ({ca}): cannot load it: {exc.strerror or exc}"
                ) from None
        else:
            # Go verifies against the system's roots when no CA is given; so does this.
            context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        context.verify_mode = shape.verify_mode
    return context


def describe(tls: TlsServerConfig) -> str:
    """One log line's worth: the policy in force, and where Python is stricter than Go."""
    auth = tls.client_auth_type or "NoClientCert"
    text = f"TLS {tls.min_version}-{tls.max_version}, client certificates: {auth}"
    if auth in ("RequireAnyClientCert", "RequireClientCert"):
        text += " (Python's ssl verifies every client certificate it accepts: it must chain to client_ca_file)"
    elif auth == "RequestClientCert":
        text += " (none is asked for: Python's ssl cannot ask without verifying, and Go never checks it)"
    return text
