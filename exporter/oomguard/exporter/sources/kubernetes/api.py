"""The API server: where it is, who we are, and its list and watch requests (two GETs, spoken with aiohttp).

Found the way Kubernetes clients find it: an explicit kubeconfig, else $KUBECONFIG, else the pod's service
account (KUBERNETES_SERVICE_HOST and the token and CA under /var/run/secrets), else ~/.kube/config. Of a
kubeconfig, the current context's server, CA (file or data, or insecure-skip-tls-verify), and a token (or
tokenFile) or client certificate; exec and auth-provider plugins are refused, naming the fix.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import ssl
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from oomguard import __version__
from oomguard.common import bounded_yaml
from oomguard.exporter.sources.kubernetes.log_budget import LogStreamBudget

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_SECONDS = 60.0  # bound service account tokens are rotated on disk by the kubelet
WATCH_SECONDS = 290  # the server ends each watch after this (its own limit is 30-60 min); we then resume


class ApiError(Exception):
    """The API refused or failed a request: `status` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Connection:
    server: str
    ssl: ssl.SSLContext | bool = True
    token: str = ""
    token_file: str = ""
    source: str = ""  # where it came from, for the log
    namespace: str = "default"  # the exporter's own: its service account's, or the kubeconfig context's
    _token_read_at: float = field(default=0.0, repr=False)

    def authorization(self) -> str:
        """The bearer token, re-read from its file now and then (blocking: call from a thread)."""
        if self.token_file and time.monotonic() - self._token_read_at > TOKEN_REREAD_SECONDS:
            self.token = Path(self.token_file).read_text().strip()
            self._token_read_at = time.monotonic()
        return self.token


def connect(kubeconfig: str = "") -> Connection:
    """Where the API is and how to authenticate (blocking: reads files)."""
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    if path:
        return from_kubeconfig(Path(path))
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if host and port and (SERVICE_ACCOUNT / "token").exists():
        context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
        server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        namespace_file = SERVICE_ACCOUNT / "namespace"
        namespace = namespace_file.read_text().strip() if namespace_file.exists() else "default"
        return Connection(
            server, context, token_file=str(SERVICE_ACCOUNT / "token"), source="service account", namespace=namespace
        )
    home = Path.home() / ".kube" / "config"
    if home.exists():
        return from_kubeconfig(home)
    raise ApiError(0, "no kubeconfig ($KUBECONFIG, ~/.kube/config) and not in a pod with a service account token")


def _named(items: list[dict[str, Any]] | None, name: str, what: str, path: Path) -> dict[str, Any]:
    for item in items or []:
        if item.get("name") == name:
            return item.get(what) or {}
    raise ApiError(0, f"{path}: no {what} named {name!r}")


def _file_or_data(entry: dict[str, Any], key: str, base: Path) -> str | None:
    """A kubeconfig's `key` (a path, relative to the file) or `key-data` (base64), as a file path."""
    if entry.get(f"{key}-data"):
        out = tempfile.NamedTemporaryFile("wb", prefix="oomguard-kube-", delete=False)  # noqa: SIM115
        with out:
            out.write(base64.b64decode(entry[f"{key}-data"]))
        return out.name
    if entry.get(key):
        return str(base / entry[key])
    return None


def from_kubeconfig(path: Path) -> Connection:
    try:  # bounded_yaml: an alias bomb is refused before it is built, as every YAML file oomguard is given
        config = bounded_yaml.load(path.read_text()) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ApiError(0, f"{path}: cannot read the kubeconfig: {exc}") from None
    except RecursionError:
        raise ApiError(0, f"{path}: cannot read the kubeconfig: YAML nested hundreds of levels deep") from None
    if not isinstance(config, dict):
        raise ApiError(0, f"{path}: the kubeconfig's top level must be a mapping (clusters:, contexts:, users:)")
    context = _named(config.get("contexts"), config.get("current-context", ""), "context", path)
    cluster = _named(config.get("clusters"), context.get("cluster", ""), "cluster", path)
    user = _named(config.get("users"), context.get("user", ""), "user", path) if context.get("user") else {}
    if "exec" in user or "auth-provider" in user:
        raise ApiError(0, f"{path}: exec and auth-provider credentials are not supported; use a token or certificate")
    server = cluster.get("server", "").rstrip("/")
    if not server:
        raise ApiError(0, f"{path}: the cluster has no server")
    tls: ssl.SSLContext | bool = True
    if server.startswith("https"):
        if cluster.get("insecure-skip-tls-verify"):
            tls = False
        else:
            tls = ssl.create_default_context(cafile=_file_or_data(cluster, "certificate-authority", path.parent))
        cert = _file_or_data(user, "client-certificate", path.parent)
        key = _file_or_data(user, "client-key", path.parent)
        if cert and key:
            if tls is False:
                tls = ssl.create_default_context()
                tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
            tls.load_cert_chain(cert, key)
    token_file = str(path.parent / user["tokenFile"]) if user.get("tokenFile") else ""
    return Connection(
        server, tls, token=user.get("token", ""), token_file=token_file, source=str(path),
        namespace=str(context.get("namespace") or "default"),
    )  # fmt: skip


class ApiClient:
    """List and watch requests on one connection; errors as ApiError."""

    def __init__(self, connection: Connection, log_budget: LogStreamBudget | None = None) -> None:
        """`log_budget`: how many log streams at once (by default the logs' share of the process's descriptors)."""
        self.connection = connection
        # Pod objects are kilobytes, but a watch line is one object: allow big ones (managedFields).
        self.session = aiohttp.ClientSession(
            headers={"User-Agent": f"oomguard/{__version__}", "Accept": "application/json"},
            connector=aiohttp.TCPConnector(ssl=connection.ssl, limit=8),
            read_bufsize=4 * 1024 * 1024,
        )
        # The cluster mode's log streams, one per engine container, each holding its connection for hours: a pool
        # of their own, so that they never hold up the lists and watches (HTTP/1.1: one stream per connection),
        # as large as the budget lets streams and short reads be open (its slots are taken before a request; the
        # pool's bound is a backstop, and keeps what it holds idle within it: one host).
        self.log_budget = log_budget or LogStreamBudget.of_process()
        self.log_session = aiohttp.ClientSession(
            headers={"User-Agent": f"oomguard/{__version__}"},
            connector=aiohttp.TCPConnector(ssl=connection.ssl, limit=self.log_budget.streams + self.log_budget.reads),
        )

    async def _headers(self) -> dict[str, str]:
        token = await asyncio.to_thread(self.connection.authorization)
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def list(self, path: str, params: dict[str, str], timeout: float = 30.0) -> dict[str, Any]:
        try:
            async with self.session.get(
                self.connection.server + path,
                params=params,
                headers=await self._headers(),
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                await _raise_for_status(response, path)
                return await response.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            raise ApiError(0, f"GET {path}: {exc or type(exc).__name__}") from None

    async def patch(self, path: str, body: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386) of one object: the keys it names set, those it sets to null removed."""
        try:
            async with self.session.patch(
                self.connection.server + path,
                data=json.dumps(body).encode(),
                headers={**await self._headers(), "Content-Type": "application/merge-patch+json"},
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                await _raise_for_status(response, path, "PATCH")
                return await response.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            raise ApiError(0, f"PATCH {path}: {exc or type(exc).__name__}") from None

    async def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
        """The watch's events (type, object), one JSON document a line, until the server ends it."""
        query = {**params, "watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": str(WATCH_SECONDS)}
        try:
            async with self.session.get(
                self.connection.server + path,
                params=query,
                headers=await self._headers(),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=WATCH_SECONDS + 30),
            ) as response:
                await _raise_for_status(response, path)
                async for line in response.content:
                    if line.strip():
                        yield json.loads(line)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            raise ApiError(0, f"watch {path}: {exc or type(exc).__name__}") from None

    async def log_lines(self, path: str, params: dict[str, str], max_line_bytes: int) -> AsyncIterator[str]:
        """A container's log (`pods/log`), line by line, as it is written while `follow` holds; a line longer than
        `max_line_bytes` is cut there (its head is what a log pattern reads), the rest of it skipped."""
        try:
            async with self.log_session.get(
                self.connection.server + path,
                params=params,
                headers=await self._headers(),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=None),
            ) as response:
                await _raise_for_status(response, path)
                held, cut = b"", False
                async for chunk in response.content.iter_any():
                    lines = (held + chunk).split(b"\n")
                    held = lines.pop()
                    for line in lines:
                        if not cut:
                            yield line[:max_line_bytes].decode("utf-8", errors="replace")
                        cut = False
                    if len(held) > max_line_bytes:
                        if not cut:
                            yield held[:max_line_bytes].decode("utf-8", errors="replace")
                        held, cut = b"", True
                if held and not cut:
                    yield held.decode("utf-8", errors="replace")
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ApiError(0, f"GET {path}: {exc or type(exc).__name__}") from None

    async def close(self) -> None:
        await self.session.close()
        await self.log_session.close()


async def _raise_for_status(response: aiohttp.ClientResponse, path: str, method: str = "GET") -> None:
    if response.status == 200:
        return
    message = ""
    with contextlib.suppress(ValueError, aiohttp.ClientError, AttributeError):  # a Status object, where there is one
        message = (await response.json(content_type=None)).get("message", "")
    raise ApiError(response.status, f"{method} {path}: HTTP {response.status} {message}".rstrip())
