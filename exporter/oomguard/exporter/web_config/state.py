"""The loaded web configuration and its reloads.

`load_web_config` reads the file and the files it names (blocking). `WebConfigState` holds
the one in force: the middleware reads its users and headers per request, and each new TLS
connection is switched to its SSL context in the handshake's server-name callback (which
OpenSSL calls with or without SNI), so a renewed certificate is served without restarting
the listener. `poll` re-reads when the contents of the file or of a file it names changed.
A change that fails for any reason (unreadable, not UTF-8, not YAML, a FIFO, a bad key) or
that would weaken the protection in force (TLS, client certificates or basic auth gone:
what an empty or half-written file says) is logged once and refused; the last good
configuration keeps serving and the reload gauge reads 0. Only a restart lowers protection.
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

from oomguard.exporter.config import ConfigError
from oomguard.exporter.web_config import tls as tls_
from oomguard.exporter.web_config.auth import BasicAuth
from oomguard.exporter.web_config.limit import TokenBucket, bucket
from oomguard.exporter.web_config.model import WebConfigFile, parse, read_regular, read_yaml, resolve

log = logging.getLogger(__name__)

# How strict each verify mode is: a reload may raise it, never lower it.
_VERIFY_STRENGTH = {ssl.CERT_NONE: 0, ssl.CERT_OPTIONAL: 1, ssl.CERT_REQUIRED: 2}


@dataclass(frozen=True)
class WebSettings:
    path: Path
    model: WebConfigFile
    ssl_context: ssl.SSLContext | None  # None: plain HTTP
    handshake: tls_.Handshake | None
    auth: BasicAuth | None  # None: no basic auth
    headers: Mapping[str, str]
    fingerprint: bytes  # of the files as they were before this load read them
    limiter: TokenBucket | None = None  # rate_limit; None: no limit
    client_ca_digest: bytes = b""  # a new client CA needs a new listener: see listener_key

    @property
    def listener_key(self) -> tuple[tls_.Handshake | None, bytes]:
        """What only a new listener applies: the handshake's settings, and the client CAs. A session saved
        under the old CAs resumes without a certificate; a new listener (a new SSL context, with its own
        session cache and ticket keys) has none of them."""
        return self.handshake, self.client_ca_digest

    def weakened_by(self, new: WebSettings) -> list[str]:
        """What `new` would take away: TLS, client certificate checks, basic auth."""
        lost = []
        if self.ssl_context is not None and new.ssl_context is None:
            lost.append("TLS (it would serve plain HTTP)")
        old_verify = _VERIFY_STRENGTH[self.handshake.verify_mode] if self.handshake else 0
        new_verify = _VERIFY_STRENGTH[new.handshake.verify_mode] if new.handshake else 0
        if new.ssl_context is not None and new_verify < old_verify:
            lost.append("client certificate checks (client_auth_type is laxer)")
        if self.auth is not None and new.auth is None:
            lost.append("basic auth (no basic_auth_users)")
        return lost

    def describe(self) -> str:
        tls = self.model.tls_server_config
        parts = [tls_.describe(tls) if tls is not None and tls.enabled else "plain HTTP (no TLS)"]
        if self.auth:
            clear = " (over plain HTTP: passwords cross the network in clear text)" if self.ssl_context is None else ""
            parts.append(f"basic auth for {len(self.auth)} user(s){clear}")
        else:
            parts.append("no basic auth")
        if self.limiter:
            limit = self.limiter.config
            parts.append(f"rate limit: a request every {limit.interval}, burst {limit.burst}")
        if self.headers:
            parts.append("headers: " + ", ".join(self.headers))
        return "; ".join(parts)


def fingerprint(path: Path) -> bytes:
    """A digest of the file and of every file it names, read leniently (a bad file still has one)."""
    digest = hashlib.sha256()
    names: list[Path] = []
    try:
        digest.update(read_regular(path, "web configuration file"))
        tls = read_yaml(path).get("tls_server_config")
        if isinstance(tls, dict):
            keys = ("cert_file", "key_file", "client_ca_file")
            names = [resolve(path.parent, str(tls[k])) for k in keys if isinstance(tls.get(k), str)]
    except (OSError, ConfigError, ValueError):
        digest.update(b"\0unreadable")
    for name in names:
        digest.update(b"\0" + str(name).encode())
        digest.update(_file_digest(name))
    return digest.digest()


def _file_digest(path: Path) -> bytes:
    """A named file's digest, read as the file itself is (regular files only, bounded): never blocks."""
    try:
        return hashlib.sha256(read_regular(path, "file")).digest()
    except (OSError, ConfigError, ValueError):
        return b"\0missing"


def load_web_config(path: Path, previous: WebSettings | None = None) -> WebSettings:
    """Read and check the file and build what it asks for; ConfigError names the key and the fix. Blocking.

    `previous`, the configuration in force, hands over what must outlive a reload: the cache of
    verified passwords (for unchanged hashes), the bcrypt slots and the rate limit's bucket."""
    # absolute(), not resolve(): a Kubernetes secret swaps a symlink, which must be followed afresh each time.
    path = path.absolute()
    before = fingerprint(path)
    model = parse(path)
    tls = model.tls_server_config
    context = handshake = None
    ca_digest = b""
    if tls is not None and tls.enabled:
        context = tls_.build_context(tls, path.parent, str(path))
        handshake = tls_.handshake(tls)
        if tls.client_ca_file and handshake.verify_mode != ssl.CERT_NONE:
            ca_digest = _file_digest(resolve(path.parent, tls.client_ca_file))
    users = model.basic_auth_users or {}
    headers = model.http_server_config.headers if model.http_server_config else {}
    auth = BasicAuth(users, previous.auth if previous else None) if users else None
    limiter = bucket(model.rate_limit, previous.limiter if previous else None)
    return WebSettings(
        path, model, context, handshake, auth, MappingProxyType(dict(headers)), before, limiter, ca_digest
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

    async def poll(self) -> WebSettings | None:
        """The file's new configuration, checked and not weaker, or None (unchanged or refused). Never raises.

        It is not yet in force: the caller adopts it, after closing a listener it makes stale (a new client CA
        is not taken by connections accepted on the old listener, so success must not be said before)."""
        try:
            return await self._poll()
        except Exception as exc:  # whatever a hostile file does, the reload loop and the process live on
            self._refuse(f"{self.path}: {type(exc).__name__}: {exc}")
            return None

    async def _poll(self) -> WebSettings | None:
        seen = await asyncio.to_thread(fingerprint, self.path)
        if seen == self._seen:
            return None
        self._seen = seen
        try:
            settings = await asyncio.to_thread(load_web_config, self.path, self.current)
        except ConfigError as exc:  # names the key and the fix
            self._refuse(str(exc))
            return None
        lost = self.current.weakened_by(settings)
        if lost:
            self._refuse(
                f"{self.path}: this version would take away {', '.join(lost)}; a reload never lowers "
                "protection (an empty or half-written file says the same). To serve with less, restart oomguard"
            )
            return None
        self._seen = settings.fingerprint
        return settings

    def adopt(self, settings: WebSettings) -> None:
        """Put a configuration from poll() in force and say so (the reload metrics, the log)."""
        self._adopt(settings)
        self.last_reload_successful = True
        self.last_success_timestamp = time.time()
        log.info("web configuration reloaded from %s: %s", self.path, settings.describe())

    def _refuse(self, message: str) -> None:
        """Once per version of the file: the next poll sees the same contents and does not come here."""
        self.last_reload_successful = False
        log.error("%s\nthe web configuration did not change: the last good one still serves", message)
