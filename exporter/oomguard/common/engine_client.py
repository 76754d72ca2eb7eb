"""Every request oomguard sends an engine: `get`, a GET with the timeout, no redirect followed, and a body cap,
over `EngineClient`, a small HTTP/1.1 client of our own.

An engine's answers are tenant-controlled: each is bounded in time (the whole exchange, body included, within
the target's timeout), in size (the head to MAX_HEAD_BYTES, the body read up to a cap, never further) and in
where it goes (a redirect is not followed: its status is the answer). The scraper's /metrics and /health and
every fetch an engine plugin adds (engines/<name>/) go through `get`; tests/hostile/test_hostile_engines.py
holds that no other module of the engines or the scraper sends a request of its own.

Why not aiohttp's client (the exporter's server stays aiohttp): a scrape sends two requests a target, and its
client cost 0.26 ms of CPU a target for them against 0.14 for this one (bench/bench_client.py;
docs/performance.md, "The scrape-cost issue, second round"): its general machinery (cookie jar, redirects,
traces, a stream reader per response, decompression) is what a node agent with 500 targets pays for on every
scrape. What this one speaks: GET only, kept-alive connections (at most PER_HOST_IDLE idle per address, closed
after KEEPALIVE_SECONDS unused), a body by Content-Length, chunks or the connection's end, identity encoding
only (none other is asked for), TLS with the system's certificate authorities.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

MAX_HEAD_BYTES = 64 * 1024  # status line and headers; a server's are a few hundred bytes
MAX_CHUNK_LINE_BYTES = 1024  # a chunk's size line (hex digits and extensions)
SHORT_ANSWER_BYTES = 4096  # another status's body read (and dropped) to keep its connection, up to this length
# Chunks a body may come in: each costs a few microseconds of Python, so a body of one-byte chunks would cost
# seconds of CPU where its bytes alone cost milliseconds. Servers send a write or a buffer a chunk (kB each).
MIN_CHUNKS, BYTES_PER_CHUNK = 1024, 64
PER_HOST_IDLE = 4  # idle connections kept per address
KEEPALIVE_SECONDS = 15.0  # an idle connection unused this long is closed (servers close theirs after 5 to 75 s)
_URLS_MAX = 4096  # parsed URLs kept (targets' /metrics and /health, the plugins' paths)


class BodyTooLarge(Exception):
    """The body is longer than the cap (its Content-Length says so, or the bytes read do)."""

    def __init__(self, url: str, cap: int) -> None:
        super().__init__(f"{url} sent more than {cap} bytes")
        self.url = url
        self.cap = cap


class EngineHttpError(Exception):
    """The exchange failed: no connection, or an answer that is no HTTP/1.x answer, or one cut short."""


class ConnectError(EngineHttpError):
    """No connection: refused, unreachable, a name that does not resolve. `os_error` says which."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(str(os_error))
        self.os_error = os_error


class TlsError(ConnectError):
    """The TLS handshake failed (a certificate not trusted, a name it does not hold, no TLS at all)."""


class ProtocolError(EngineHttpError):
    """An answer that breaks HTTP/1.1 (a bad status line, an oversized head, a bad chunk) or is cut short."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes  # read only on a 200; empty otherwise
    truncated: bool = False  # a `truncate` read stopped at its cap


async def get(client: EngineClient, url: str, *, timeout: float, cap: int, truncate: bool = False) -> Answer:
    """GET url within `timeout` seconds (TimeoutError past it), the body of a 200 read up to `cap` bytes.
    Over the cap: BodyTooLarge, or with `truncate` the first `cap` bytes (the rest is never read: the
    connection is closed rather than drained). Other statuses' bodies are not read."""
    async with asyncio.timeout(timeout):
        return await client.get(url, cap, truncate)


@dataclass(frozen=True, slots=True)
class _Url:
    key: tuple[str, str, int]  # scheme, host, port: the pool's key
    request: bytes  # the whole request, built once


class EngineClient:
    """Kept-alive connections to the engines, shared by every target for the life of the runtime.

    `limit` bounds the connections open, in use and idle together (the scrapes' share of the process's descriptors,
    descriptors.py): the requests in flight at once, each on one connection, and the idle ones kept, at most
    PER_HOST_IDLE per address; a request that needs a new connection while `limit` are open closes the longest kept
    address's oldest first (500 targets kept 1,000 idle connections: more than a limit of 256 descriptors allows).
    One request per connection at a time, no pipelining."""

    def __init__(
        self, *, limit: int = 64, user_agent: str = "oomguard", idle_per_host: int = PER_HOST_IDLE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        """`idle_per_host` 0: no connection kept (each request on a new one)."""
        self._slots = asyncio.Semaphore(limit)
        self._limit = limit
        self._active = 0  # requests holding a slot: each holds one connection at most
        self._idle_count = 0
        self._idle_per_host = idle_per_host
        self._user_agent = user_agent
        self._clock = clock
        # By address, oldest first; the addresses in the order their first kept connection came (the first is
        # the one closed from when `limit` are open).
        self._idle: OrderedDict[tuple[str, str, int], list[tuple[_Connection, float]]] = OrderedDict()
        self._urls: dict[str, _Url] = {}
        self._tls: ssl.SSLContext | None = None
        self._swept = clock()
        self._closed = False

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        for connections in self._idle.values():
            for connection, _ in connections:
                connection.close()
        self._idle.clear()
        self._idle_count = 0

    def idle_connections(self) -> int:
        return self._idle_count

    async def get(self, url: str, cap: int, truncate: bool = False) -> Answer:
        target = self._urls.get(url) or self._parse(url)
        async with self._slots:
            self._active += 1
            try:
                connection = self._take_idle(target.key)
                if connection is not None:
                    try:
                        return await self._exchange(connection, target, url, cap, truncate)
                    except _Stale:
                        pass  # the server closed the kept connection as we sent: once more on a new one
                self._make_room()
                connection = await self._connect(target.key)
                try:
                    return await self._exchange(connection, target, url, cap, truncate)
                except _Stale:
                    raise ProtocolError(f"{url} closed the connection without an answer") from None
            finally:
                self._active -= 1

    async def _exchange(self, connection: _Connection, target: _Url, url: str, cap: int, truncate: bool) -> Answer:
        done = False
        try:
            answer, reusable = await connection.exchange(target.request, url, cap, truncate)
            done = True
        finally:
            if not done:  # an error, a timeout or a cancel in the middle: the connection's state is unknown
                connection.close()
        if reusable and not self._closed:
            self._put_idle(target.key, connection)
        else:
            connection.close()
        return answer

    def _take_idle(self, key: tuple[str, str, int]) -> _Connection | None:
        now = self._clock()
        if now - self._swept > KEEPALIVE_SECONDS:
            self._sweep(now)
        connections = self._idle.get(key)
        taken = None
        while connections:
            connection, since = connections.pop()
            self._idle_count -= 1
            if _fresh(connection, since, now):
                taken = connection
                break
            connection.close()
        if connections is not None and not connections:
            del self._idle[key]
        return taken

    def _make_room(self) -> None:
        """Before a new connection: kept ones closed until it keeps the open ones within `limit` (each request in
        flight holds one at most, this one none yet)."""
        while self._idle_count and self._active + self._idle_count > self._limit:
            key, connections = next(iter(self._idle.items()))
            connection, _ = connections.pop(0)
            self._idle_count -= 1
            if not connections:
                del self._idle[key]
            connection.close()

    def _put_idle(self, key: tuple[str, str, int], connection: _Connection) -> None:
        connections = self._idle.get(key)
        if connections is None:
            if self._idle_per_host <= 0:
                connection.close()
                return
            connections = self._idle[key] = []
        elif len(connections) >= self._idle_per_host:
            connection.close()
            return
        connections.append((connection, self._clock()))
        self._idle_count += 1

    def _sweep(self, now: float) -> None:
        """Closes what was left idle too long, forgets closed ones and addresses with none (pods come and go)."""
        self._swept = now
        for key in list(self._idle):
            kept = []
            for connection, since in self._idle[key]:
                if _fresh(connection, since, now):
                    kept.append((connection, since))
                else:
                    connection.close()
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]
        self._idle_count = sum(len(c) for c in self._idle.values())

    async def _connect(self, key: tuple[str, str, int]) -> _Connection:
        scheme, host, port = key
        tls = None
        if scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        loop = asyncio.get_running_loop()
        try:
            _, connection = await loop.create_connection(
                _Connection, host, port, ssl=tls, server_hostname=host if tls else None
            )
        except ssl.SSLError as exc:  # an OSError too: before it
            raise TlsError(exc) from None
        except OSError as exc:
            raise ConnectError(exc) from None
        return connection

    def _parse(self, url: str) -> _Url:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ProtocolError(f"{url} is no http:// or https:// URL with a host")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise ProtocolError(f"{url}: {exc}") from None
        path = quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~")
        if parts.query:
            path += "?" + quote(parts.query, safe="/%:@!$&'()*+,;=-._~?")
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: {parts.netloc.rpartition('@')[2]}",
            f"User-Agent: {self._user_agent}",
            "Accept: text/plain, */*",
        ]
        if parts.username is not None:  # credentials in the URL, as a browser sends them
            user = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            lines.append("Authorization: Basic " + base64.b64encode(user.encode()).decode())
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "strict")
        if len(self._urls) >= _URLS_MAX:
            self._urls.clear()
        parsed = self._urls[url] = _Url((parts.scheme, parts.hostname, port), request)
        return parsed


def _fresh(connection: _Connection, idle_since: float, now: float) -> bool:
    """An idle connection still worth a request: the server has not closed it, nor left it unused too long."""
    return connection.open and now - idle_since <= KEEPALIVE_SECONDS


class _Stale(Exception):
    """A kept connection closed before the first byte of its answer: the request is sent again, once."""


# The body's framing, from the head.
_LENGTH, _CHUNKED, _TO_CLOSE = 0, 1, 2


class _Connection(asyncio.Protocol):
    """One connection, one exchange at a time. The answer is parsed as its bytes arrive: the head (status and
    the headers that frame the body), then the body up to its cap."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.open = False
        self._waiter: asyncio.Future[tuple[Answer, bool]] | None = None
        self._buffer = bytearray()
        self._reused = False  # an exchange was done on it before: a close before any byte is a stale connection
        self._start("", 0, False)

    def _start(self, url: str, cap: int, truncate: bool) -> None:
        """The state of one exchange, as it begins."""
        self._url, self._cap, self._truncate = url, cap, truncate
        self._buffer.clear()
        self._got_bytes = False
        self._scanned = 0  # how much of the buffer is known to hold no end of the head
        self._head: tuple[int, int, bool] | None = None  # status, framing, keep-alive
        self._need = 0  # _LENGTH: the body's length; _CHUNKED: a chunk's bytes still to come, or -1, -2 (below)
        self._body = bytearray()
        self._trailers = False
        self._chunks_left = max(MIN_CHUNKS, cap // BYTES_PER_CHUNK)

    # -- asyncio's side ---------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.close()  # bytes nobody asked for: the connection cannot be trusted with the next answer
            return
        self._got_bytes = True
        self._buffer += data
        try:
            self._advance()
        except (ProtocolError, BodyTooLarge) as exc:
            self._fail(exc)

    def eof_received(self) -> bool:
        self._ended(None)
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self._ended(exc)

    # -- the exchange -----------------------------------------------------------------------------------------
    async def exchange(self, request: bytes, url: str, cap: int, truncate: bool) -> tuple[Answer, bool]:
        """The answer, and whether the connection may carry the next one."""
        assert self.transport is not None and self._waiter is None
        self._waiter = asyncio.get_running_loop().create_future()
        self._start(url, cap, truncate)
        if not self.open:
            self._waiter = None
            raise _Stale()
        self.transport.write(request)
        try:
            return await self._waiter
        finally:
            self._waiter = None
            self._reused = True

    def close(self) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.close()

    def _done(self, answer: Answer, reusable: bool) -> None:
        assert self._waiter is not None
        if not self._waiter.done():
            self._waiter.set_result((answer, reusable and not self._buffer and self.open))

    def _fail(self, exc: BaseException) -> None:
        self.close()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    def _ended(self, exc: Exception | None) -> None:
        """The server closed (or the connection broke): the end of a body read to the close, else a failure."""
        self.open = False
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if not self._got_bytes and self._reused:
            waiter.set_exception(_Stale())
        elif not self._got_bytes and exc is None:
            waiter.set_exception(ProtocolError(f"{self._url} closed the connection without answering"))
        elif self._head is not None and self._head[1] == _TO_CLOSE and exc is None:
            self._done(Answer(self._head[0], bytes(self._body)), False)
        elif isinstance(exc, ssl.SSLError):
            waiter.set_exception(TlsError(exc))
        else:
            cause = f": {exc}" if exc else ""
            waiter.set_exception(ProtocolError(f"{self._url} closed the connection in the middle of its answer{cause}"))

    def _advance(self) -> None:
        if self._head is None and not self._read_head():
            return
        assert self._head is not None
        status, framing, keep = self._head
        if framing == _LENGTH:
            if len(self._buffer) < self._need:
                return
            with memoryview(self._buffer) as view:
                body = bytes(view[: self._need])  # one copy, where a slice of the bytearray and bytes() made two
            del self._buffer[: self._need]
            self._done(Answer(status, body if status == 200 else b""), keep)
        elif framing == _CHUNKED:
            if self._read_chunks():
                self._done(Answer(status, bytes(self._body)), keep)
        else:
            self._body += self._buffer
            self._buffer.clear()
            self._check_cap(len(self._body))

    def _check_cap(self, size: int) -> None:
        """Past the cap: with `truncate`, the first `cap` bytes are the answer and the connection is closed."""
        if size <= self._cap:
            return
        if not self._truncate:
            raise BodyTooLarge(self._url, self._cap)
        self._done(Answer(200, bytes(self._body[: self._cap]), truncated=True), False)
        self.close()

    def _read_head(self) -> bool:
        """The status line and headers, once all arrived; interim (1xx) answers skipped."""
        head = self._final_head()
        if head is None:
            return False
        version, status, fields = head
        headers = self._headers(fields)
        connection = headers.get("connection", "").lower()
        keep = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
        if status != 200:
            return self._not_ok(status, headers, keep)
        return self._framing(status, headers, keep)

    def _final_head(self) -> tuple[str, int, str] | None:
        """(version, status, header lines) of the first answer that is not interim (1xx), None until it arrived."""
        while True:
            # From where the last look stopped: a head dripped a byte at a time is not searched again whole.
            end = self._buffer.find(b"\r\n\r\n", self._scanned)
            if end < 0:
                if len(self._buffer) > MAX_HEAD_BYTES:
                    raise ProtocolError(f"{self._url} sent an HTTP head over {MAX_HEAD_BYTES} bytes")
                self._scanned = max(0, len(self._buffer) - 3)
                return None
            self._scanned = 0
            if end > MAX_HEAD_BYTES:
                raise ProtocolError(f"{self._url} sent an HTTP head over {MAX_HEAD_BYTES} bytes")
            head = bytes(self._buffer[:end]).decode("latin-1")
            del self._buffer[: end + 4]
            status_line, _, fields = head.partition("\r\n")
            version, _, rest = status_line.partition(" ")
            code = rest[:3]
            if version not in ("HTTP/1.1", "HTTP/1.0") or not code.isdigit() or (len(rest) > 3 and rest[3] != " "):
                raise ProtocolError(f"{self._url} sent no HTTP/1.x status line: {status_line[:80]!r}")
            status = int(code)
            if not 100 <= status < 200:  # 100 Continue and the like: the answer follows
                return version, status, fields

    def _headers(self, fields: str) -> dict[str, str]:
        """The header lines by lower-cased name; a malformed line or a second framing header is a ProtocolError (the
        same content-length twice excepted)."""
        headers: dict[str, str] = {}
        for line in fields.split("\r\n") if fields else ():
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip():
                raise ProtocolError(f"{self._url} sent a malformed header line: {line[:80]!r}")
            name = name.lower()
            value = value.strip()
            if name in headers and name in ("content-length", "transfer-encoding"):
                if name == "content-length" and headers[name] == value:
                    continue
                raise ProtocolError(f"{self._url} sent two {name} headers")
            headers[name] = value
        return headers

    def _not_ok(self, status: int, headers: dict[str, str], keep: bool) -> bool:
        """An answer other than 200: a short body read and dropped, the connection kept; any other not read."""
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) <= SHORT_ANSWER_BYTES and "transfer-encoding" not in headers:
            # A short answer is read and dropped, and its connection kept, as aiohttp's client did: an engine
            # loading its model answers 503 on every scrape, and is not made to accept three new connections
            # a scrape (with them, the real llama-server test timed its restart a second late in CI).
            self._head, self._need = (status, _LENGTH, keep), int(length)
            return True
        self._head = (status, _LENGTH, False)  # any other: its body is not read, the connection not reused
        self._done(Answer(status, b""), False)
        return False

    def _framing(self, status: int, headers: dict[str, str], keep: bool) -> bool:
        """How a 200's body is framed (chunked, a length, or to the close), within the cap."""
        encoding = headers.get("content-encoding", "identity").lower()
        if encoding != "identity":
            raise ProtocolError(f"{self._url} sent its body in {encoding!r} encoding, which oomguard does not ask for")
        transfer = headers.get("transfer-encoding")
        if transfer is not None:
            if transfer.lower() != "chunked":
                raise ProtocolError(f"{self._url} sent transfer-encoding {transfer!r}; only chunked is read")
            self._head, self._need = (status, _CHUNKED, keep), -1
            return True
        length = headers.get("content-length")
        if length is None:
            self._head = (status, _TO_CLOSE, False)
            return True
        if not length.isdigit() or len(length) > 18:
            raise ProtocolError(f"{self._url} sent content-length {length[:40]!r}")
        self._need = int(length)
        if self._need > self._cap:
            if not self._truncate:
                raise BodyTooLarge(self._url, self._cap)
            self._head = (status, _TO_CLOSE, False)  # read to the cap, then closed
            return True
        self._head = (status, _LENGTH, keep)
        return True

    def _read_chunks(self) -> bool:
        """Decodes the chunks that arrived; True at the end of the last one's trailers. `_need`: a chunk's bytes
        still to come (> 0), its closing CRLF (-2), a size line (-1)."""
        buffer = self._buffer
        while True:
            if self._trailers:
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > MAX_HEAD_BYTES:
                        raise ProtocolError(f"{self._url} sent chunk trailers over {MAX_HEAD_BYTES} bytes")
                    return False
                del buffer[: end + 2]
                if end == 0:
                    return True
            elif self._need == -1:
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > MAX_CHUNK_LINE_BYTES:
                        raise ProtocolError(f"{self._url} sent a chunk size line over {MAX_CHUNK_LINE_BYTES} bytes")
                    return False
                size_text = bytes(buffer[:end]).split(b";", 1)[0].strip()
                del buffer[: end + 2]
                if not size_text or len(size_text) > 16 or size_text.strip(_HEX):
                    raise ProtocolError(f"{self._url} sent a bad chunk size {size_text[:40]!r}")
                size = int(size_text, 16)
                self._chunks_left -= 1
                if self._chunks_left < 0:
                    raise ProtocolError(
                        f"{self._url} sent its body in more chunks than its cap allows "
                        f"(one per {BYTES_PER_CHUNK} bytes of the cap, {MIN_CHUNKS} at least)"
                    )
                if size == 0:
                    self._trailers = True
                elif not self._truncate and len(self._body) + size > self._cap:
                    raise BodyTooLarge(self._url, self._cap)  # refused before its bytes are read
                else:
                    self._need = size
            elif self._need > 0:
                if not buffer:
                    return False
                part = buffer[: self._need]
                self._body += part
                del buffer[: len(part)]
                self._need -= len(part)
                self._check_cap(len(self._body))
                if self._waiter is None or self._waiter.done():
                    return False  # truncated at the cap
                if self._need == 0:
                    self._need = -2
            else:
                if len(buffer) < 2:
                    return False
                if buffer[:2] != b"\r\n":
                    raise ProtocolError(f"{self._url} sent a chunk without its closing CRLF")
                del buffer[:2]
                self._need = -1


_HEX = b"0123456789abcdefABCDEF"
