"""One GET of an exporter's `/status.json` for `oomguard top`, trusting the answer no more than the exporter trusts
an engine's: one deadline over the whole exchange, no redirect followed, the body capped.

Why not urllib: its timeout bounds each socket operation, so a server that sends a byte every few seconds held a
fetch for as long as it liked; and it follows redirects with the request's headers, basic auth included, to any
host, from https to plain http. Here every wait (connection, TLS handshake, request, head, body) is given what is
left of one deadline, and a 3xx is an error that says where it pointed. The name's lookup (getaddrinfo) is the
system resolver's, with its own timeouts. No proxy is used: an exporter is reached directly.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from oomguard import __version__
from oomguard.common.excerpt import excerpt
from oomguard.common.visible import visible

READ_SIZE = 64 * 1024


class FetchError(Exception):
    """A fetch that gave no status document: said in one line, with its fix."""


@dataclass(frozen=True)
class Deadline:
    seconds: float
    end: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(seconds, time.monotonic() + seconds)

    def left(self) -> float:
        """The seconds left; TimeoutError once none are."""
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no complete answer within {self.seconds:g}s")
        return left


class _DeadlineSocket(socket.socket):
    """A socket whose every wait gets what is left of the fetch's deadline (a socket timeout is per call)."""

    deadline: Deadline | None = None

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        if self.deadline is not None:
            self.settimeout(self.deadline.left())
        return super().recv_into(buffer, nbytes, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        if self.deadline is not None:
            self.settimeout(self.deadline.left())
        super().sendall(data, flags)


class DeadlineSSLSocket(ssl.SSLSocket):
    """The same over TLS: the context's `sslsocket_class` (`tls_context`). Its handshake is bounded by the timeout
    the plain socket had when it was wrapped, which is set to what was left of the deadline."""

    deadline: Deadline | None = None

    def recv_into(self, buffer: Any, nbytes: int | None = None, flags: int = 0) -> int:
        if self.deadline is not None:
            self.settimeout(self.deadline.left())
        return super().recv_into(buffer, nbytes, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        if self.deadline is not None:
            self.settimeout(self.deadline.left())
        super().sendall(data, flags)


def tls_context(context: ssl.SSLContext) -> ssl.SSLContext:
    """`context`, its sockets bounded by a fetch's deadline."""
    context.sslsocket_class = DeadlineSSLSocket
    return context


def _connect(host: str, port: int, deadline: Deadline) -> _DeadlineSocket:
    """A connection to the first of the host's addresses that takes one, within the deadline."""
    error: OSError | None = None
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        sock = _DeadlineSocket(family, kind, proto)
        try:
            sock.settimeout(deadline.left())
            sock.connect(address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        sock.deadline = deadline
        return sock
    deadline.left()  # the deadline passed: say so, rather than the last address's "timed out"
    raise error or OSError(f"{host} has no address")


class _Connection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, deadline: Deadline) -> None:
        super().__init__(host, port)
        self.deadline = deadline

    def connect(self) -> None:
        self.sock = _connect(self.host, self.port, self.deadline)


class _TlsConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, deadline: Deadline, context: ssl.SSLContext) -> None:
        super().__init__(host, port, context=context)
        self.deadline = deadline
        self.tls = context

    def connect(self) -> None:
        plain = _connect(self.host, self.port, self.deadline)
        try:
            plain.settimeout(self.deadline.left())
            sock = self.tls.wrap_socket(plain, server_hostname=self.host)
        except BaseException:
            plain.close()
            raise
        if isinstance(sock, DeadlineSSLSocket):
            sock.deadline = self.deadline
        self.sock = sock


def get(url: str, headers: dict[str, str], context: ssl.SSLContext | None, timeout: float, max_bytes: int) -> bytes:
    """The body of a 200 answer to GET `url`, at most `max_bytes`, within `timeout` seconds in all; FetchError
    otherwise (a redirect, another status, a cut or late answer, no server)."""
    deadline = Deadline.after(timeout)
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname or "", parts.port
        if not host:
            raise ValueError("no host")
        if parts.scheme == "https":
            tls = context or tls_context(ssl.create_default_context())
            connection: http.client.HTTPConnection = _TlsConnection(host, port or 443, deadline, tls)
        else:
            connection = _Connection(host, port or 80, deadline)
    except (ValueError, http.client.HTTPException) as exc:  # a port that is no number, a space in the host, ...
        raise FetchError(
            f"{visible(excerpt(url))} is not a usable address ({exc}); write the exporter's, e.g. http://host:9847"
        ) from None
    try:
        connection.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""),
                           headers={"User-Agent": f"oomguard-top/{__version__}", **headers})  # fmt: skip
        response = connection.getresponse()
        if 300 <= response.status < 400:
            where = visible(excerpt(response.getheader("Location") or "nowhere", 200))
            raise FetchError(
                f"{url} answered HTTP {response.status}, a redirect to {where}: oomguard top follows none (the "
                "credentials would go with it); give the exporter's own address"
            )
        if response.status != 200:
            fix = {401: "give --username and --password-file", 404: "is it oomguard 0.1 or later?"}.get(response.status)
            raise FetchError(f"{url} answered HTTP {response.status}" + (f": {fix}" if fix else ""))
        return _body(response, url, max_bytes)
    except TimeoutError:  # the deadline's own, or a wait given what was left of it
        raise FetchError(
            f"{url}: no complete answer within {timeout:g}s (--timeout); is the exporter overloaded, or is it oomguard?"
        ) from None
    except ssl.SSLError as exc:
        raise FetchError(f"cannot read {url}: {exc}; check --ca-file (and --cert-file, --key-file)") from None
    except (OSError, http.client.HTTPException, ValueError, UnicodeError) as exc:
        raise FetchError(f"cannot read {url}: {exc}; is `oomguard serve` running there?") from None
    finally:
        connection.close()


def _body(response: http.client.HTTPResponse, url: str, max_bytes: int) -> bytes:
    too_large = FetchError(f"{url} answered more than {max_bytes // 2**20} MiB: not an exporter's status document")
    length = response.getheader("Content-Length") or ""
    if length.isdigit() and int(length) > max_bytes:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    while chunk := response.read(min(READ_SIZE, max_bytes + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise too_large
    return b"".join(chunks)
