"""The loaded web configuration and its reloads.

`load_web_config` reads the file and the files it names (blocking). `WebConfigState` holds
the one in force: the middleware reads its users and headers per request, and each new TLS
connection is switched to its SSL context in the handshake's server-name callback (which
OpenSSL calls with or without SNI), so a renewed certificate is served without restarting
the listener. `poll` re-reads when the contents of the file or of a file it names changed;
a bad change is logged and refused, and the last good configuration keeps serving.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from oomguard.config import ConfigError
from oomguard.web_config import tls as tls_
from oomguard.web_config.auth import BasicAuth
from oomguard.web_config.model import WebConfigFile, parse, read_yaml, resolve

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WebSettings:
    path: Path
    model: WebConfigFile
    ssl_context: ssl.SSLContext | None  # None: plain HTTP
    handshake: tls_.Handshake | None
    auth: BasicAuth | None  # None: no basic auth
    headers: Mapping[str, str]
    fingerprint: bytes  # of the files as they were before this load read them

    def describe(self) -> str:
        tls = self.model.tls_server_config
        parts = [tls_.describe(tls) if tls is not None and tls.enabled else "plain HTTP (no TLS)"]
        if self.auth:
            clear = " (over plain HTTP: passwords cross the network in clear text)" if self.ssl_context is None else ""
            parts.append(f"basic auth for {len(self.auth)} user(s){clear}")
        else:
            parts.append("no basic auth")
        if self.headers:
            parts.append("headers: " + ", ".join(self.headers))
        return "; ".join(parts)


def fingerprint(path: Path) -> bytes:
    """A digest of the file and of every file it names, read leniently (a bad file still has one)."""
    digest = hashlib.sha256()
    names: list[Path] = []
    try:
        digest.update(path.read_bytes())
        tls = read_yaml(path).get("tls_server_config")
        if isinstance(tls, dict):
            keys = ("cert_file", "key_file", "client_ca_file")
            names = [resolve(path.parent, str(tls[k])) for k in keys if isinstance(tls.get(k), str)]
    except (OSError, ConfigError):
        digest.update(b"\0unreadable")
    for name in names:
        digest.update(b"\0" + str(name).encode())
        try:
            digest.update(hashlib.sha256(name.read_bytes()).digest())
        except OSError:
            digest.update(b"\0missing")
    return digest.digest()


def load_web_config(path: Path) -> WebSettings:
    """Read and check the file and build what it asks for; ConfigError names the key and the fix. Blocking."""
    # absolute(), not resolve(): a Kubernetes secret swaps a symlink, which must be followed afresh each time.
    path = path.absolute()
    before = fingerprint(path)
    model = parse(path)
    tls = model.tls_server_config
    context = handshake = None
    if tls is not None and tls.enabled:
        context = tls_.build_context(tls, path.parent, str(path))
        handshake = tls_.handshake(tls)
    users = model.basic_auth_users or {}
    headers = model.http_server_config.headers if model.http_server_config else {}
    return WebSettings(
        path, model, context, handshake, BasicAuth(users) if users else None, MappingProxyType(dict(headers)), before
    )


class WebConfigState:
    def __init__(self, settings: WebSettings) -> None:
        self.current = settings
        self.last_reload_successful = True
        self.last_success_timestamp = time.time()
        self._seen = settings.fingerprint  # the last contents tried, good or bad: a bad file is reported once
        self._adopt(settings)

    @property
    def path(self) -> Path:
        return self.current.path

    def _adopt(self, settings: WebSettings) -> None:
        if settings.ssl_context is not None:
            settings.ssl_context.sni_callback = self._switch_context
        self.current = settings

    def _switch_context(self, connection: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> None:
        # Swaps the certificate, key and client CAs; not the verify mode or versions (state.Handshake).
        current = self.current.ssl_context
        if current is not None and current is not context:
            connection.context = current

    async def poll(self) -> bool:
        """Reload if anything changed; True when a new configuration was put in force."""
        seen = await asyncio.to_thread(fingerprint, self.path)
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            settings = await asyncio.to_thread(load_web_config, self.path)
        except Exception as exc:  # ConfigError names the key; anything else is logged whole
            self.last_reload_successful = False
            message = str(exc) if isinstance(exc, ConfigError) else f"{self.path}: {exc!r}"
            log.error("%s\nthe web configuration did not change: the last good one still serves", message)
            return False
        self._seen = settings.fingerprint
        self._adopt(settings)
        self.last_reload_successful = True
        self.last_success_timestamp = time.time()
        log.info("web configuration reloaded from %s: %s", self.path, settings.describe())
        return True
