"""The engines' HTTP client (engine_client.py), against servers that send exactly the bytes each case needs.

Each server is a real socket on 127.0.0.1 (asyncio.start_server) whose answer is written by hand: chunks split
anywhere, heads that never end, bodies cut short, a kept connection closed under the client. What an engine
can send, well or badly, ends in an Answer or one of engine_client.py's errors, within the timeout, never a hang.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from oomguard.common import engine_client
from oomguard.common.engine_client import (
    KEEPALIVE_SECONDS,
    PER_HOST_IDLE,
    BodyTooLarge,
    ConnectError,
    EngineClient,
    ProtocolError,
    TlsError,
)

Answerer = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]  # (request head, writer) -> keep the connection


class Scripted:
    """A server whose every answer is `answer(request head, writer)`; it counts connections and requests."""

    def __init__(self, answer: Answerer) -> None:
        self.answer = answer
        self.connections = 0
        self.heads: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []
        self.handlers: list[asyncio.Task[None]] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        self.handlers.append(asyncio.current_task())  # type: ignore[arg-type]
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                if not await self.answer(head, writer):
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


@contextlib.asynccontextmanager
async def serving(answer: Answerer) -> AsyncIterator[Scripted]:
    scripted = Scripted(answer)
    scripted.server = await asyncio.start_server(scripted._serve, "127.0.0.1", 0)
    try:
        yield scripted
    finally:
        scripted.server.close()
        for handler in scripted.handlers:
            handler.cancel()
        await asyncio.gather(*scripted.handlers, return_exceptions=True)


def sends(*parts: bytes, keep: bool = True, pause: float = 0.0) -> Answerer:
    """An answer written as `parts`, each flushed on its own (with `pause` between)."""

    async def answer(head: bytes, writer: asyncio.StreamWriter) -> bool:
        for part in parts:
            writer.write(part)
            await writer.drain()
            if pause:
                await asyncio.sleep(pause)
        return keep

    return answer


def ok(body: bytes, *headers: str) -> bytes:
    head = ["HTTP/1.1 200 OK", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def chunked(*chunks: bytes, trailers: bytes = b"") -> bytes:
    out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    for chunk in chunks:
        out += f"{len(chunk):x};ext=1\r\n".encode() + chunk + b"\r\n"
    return out + b"0\r\n" + trailers + b"\r\n"


async def get(client: EngineClient, url: str, cap: int = 1 << 20, truncate: bool = False) -> engine_client.Answer:
    return await engine_client.get(client, url + "/metrics", timeout=2.0, cap=cap, truncate=truncate)


# -- framing ------------------------------------------------------------------------------------------------
async def test_a_kept_connection_carries_every_request() -> None:
    async with serving(sends(ok(b"x 1\n"))) as server, EngineClient() as client:
        for _ in range(20):
            assert await get(client, server.url) == engine_client.Answer(200, b"x 1\n")
    assert server.connections == 1 and len(server.heads) == 20


async def test_the_request_names_host_path_query_and_credentials() -> None:
    async with serving(sends(ok(b""))) as server, EngineClient(user_agent="oomguard/test") as client:
        port = server.url.rsplit(":", 1)[1]
        url = f"http://user:p%40ss@127.0.0.1:{port}/a b/metrics?x=1"
        await engine_client.get(client, url, timeout=2.0, cap=10)
    lines = server.heads[0].decode().split("\r\n")
    assert lines[0] == "GET /a%20b/metrics?x=1 HTTP/1.1"
    assert f"Host: 127.0.0.1:{port}" in lines and "User-Agent: oomguard/test" in lines
    assert "Authorization: Basic " + base64.b64encode(b"user:p@ss").decode() in lines


@pytest.mark.parametrize("split", [1, 7, 1000])
async def test_chunks_split_anywhere_are_decoded(split: int) -> None:
    body = chunked(b"a" * 300, b"b" * 5, b"c" * 1, trailers=b"X-Trailer: 1\r\n")
    parts = [body[i : i + split] for i in range(0, len(body), split)]
    async with serving(sends(*parts)) as server, EngineClient() as client:
        for _ in range(2):  # and the connection is reused after the trailers
            assert (await get(client, server.url)).body == b"a" * 300 + b"b" * 5 + b"c"
    assert server.connections == 1


async def test_a_body_to_the_close_and_an_interim_answer() -> None:
    answer = sends(b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.0 200 OK\r\n\r\nsome ", b"text", keep=False)
    async with serving(answer) as server, EngineClient() as client:
        assert (await get(client, server.url)).body == b"some text"
        assert (await get(client, server.url)).body == b"some text"
    assert server.connections == 2  # no length: the close ends the body, so never kept


async def test_connection_close_is_honoured() -> None:
    async with serving(sends(ok(b"x", "Connection: close"))) as server, EngineClient() as client:
        for _ in range(3):
            await get(client, server.url)
    assert server.connections == 3


# -- caps ---------------------------------------------------------------------------------------------------
async def test_a_declared_length_over_the_cap_is_refused_before_the_body() -> None:
    # The head alone, then nothing: the refusal must come from the head, not from a timeout.
    head_only = sends(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n", pause=5)
    async with serving(head_only) as server, EngineClient() as client:
        with pytest.raises(BodyTooLarge):
            await asyncio.wait_for(get(client, server.url, cap=1000), 1.0)


@pytest.mark.parametrize(
    "answer",
    [
        chunked(b"x" * 5000),  # one chunk declared over the cap
        chunked(*[b"y" * 100] * 50),  # small chunks adding up over it
        b"HTTP/1.1 200 OK\r\n\r\n" + b"z" * 5000,  # no length, read to the close
    ],
    ids=["declared-chunk", "many-chunks", "to-the-close"],
)
async def test_a_body_over_the_cap_is_refused(answer: bytes) -> None:
    async with serving(sends(answer, keep=False)) as server, EngineClient() as client:
        with pytest.raises(BodyTooLarge, match="more than 1000 bytes"):
            await get(client, server.url, cap=1000)
        assert client.idle_connections() == 0


@pytest.mark.parametrize(
    "answer",
    [ok(b"h" * 5000), chunked(*[b"h" * 100] * 50), b"HTTP/1.1 200 OK\r\n\r\n" + b"h" * 5000],
    ids=["length", "chunked", "to-the-close"],
)
async def test_truncate_reads_the_first_bytes_and_hangs_up(answer: bytes) -> None:
    async with serving(sends(answer, keep=False)) as server, EngineClient() as client:
        got = await get(client, server.url, cap=1000, truncate=True)
        assert got == engine_client.Answer(200, b"h" * 1000, truncated=True)
        assert client.idle_connections() == 0


async def test_another_status_is_the_answer_and_its_body_is_not_read() -> None:
    endless = sends(b"HTTP/1.1 503 Loading\r\nContent-Length: 100000000\r\n\r\n", b"x" * 65536, pause=5)
    async with serving(endless) as server, EngineClient() as client:
        assert await asyncio.wait_for(get(client, server.url), 1.0) == engine_client.Answer(503, b"")
        assert client.idle_connections() == 0
    redirect = sends(b"HTTP/1.1 302 Found\r\nLocation: http://192.0.2.1/\r\n\r\n")
    async with serving(redirect) as server, EngineClient() as client:
        assert (await get(client, server.url)).status == 302  # never followed
    assert len(server.heads) == 1


async def test_a_short_answer_of_another_status_keeps_its_connection() -> None:
    # An engine loading its model answers 503 to every scrape: one connection, not one a request.
    loading = sends(
        b'HTTP/1.1 503 Service Unavailable\r\nContent-Length: 41\r\n\r\n{"error": "Loading model", "code": 503}  '
    )
    async with serving(loading) as server, EngineClient() as client:
        for _ in range(5):
            assert await get(client, server.url) == engine_client.Answer(503, b"")
    assert server.connections == 1 and len(server.heads) == 5


# -- what is no HTTP ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "no HTTP/1.x status line"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000 + b"\r\n\r\n", "head over 65536 bytes"),
        (b"HTTP/1.1 200 OK\r\nX-" + b"y" * 70_000, "head over 65536 bytes"),  # a head that never ends
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "two content-length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "content-length '-1'"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\nab", "'gzip' encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "transfer-encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * 2000, "size line over"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY", "without its closing CRLF"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "in the middle of its answer"),
        (chunked(*[b"c"] * 20_000), "more chunks than its cap allows"),  # cap 1 MiB: 16,384 chunks
        (b"", "without answering"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
async def test_what_is_no_http_answer_is_a_protocol_error(answer: bytes, message: str) -> None:
    async with serving(sends(answer, keep=False)) as server, EngineClient() as client:
        with pytest.raises(ProtocolError, match=message):
            await get(client, server.url)
        assert client.idle_connections() == 0


async def test_a_head_that_drips_forever_ends_at_the_timeout() -> None:
    async def drip(head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(1000):
            writer.write(b"X: y\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)
        return False

    async with serving(drip) as server, EngineClient() as client:
        with pytest.raises(TimeoutError):
            await engine_client.get(client, server.url + "/metrics", timeout=0.3, cap=1000)


# -- connections --------------------------------------------------------------------------------------------
async def test_a_kept_connection_closed_by_the_server_is_replaced_without_an_error() -> None:
    # The server answers as if it kept the connection, then closes it (its keep-alive timeout).
    async with serving(sends(ok(b"x"), keep=False)) as server, EngineClient() as client:
        for _ in range(3):
            assert (await get(client, server.url)).body == b"x"
            await asyncio.sleep(0.05)  # the close arrives while idle
    assert server.connections == 3


async def test_a_close_racing_the_next_request_is_retried_once() -> None:
    # The close is not yet seen when the next request leaves: its answer is the close itself.
    async with serving(sends(ok(b"x"), keep=False)) as server, EngineClient() as client:
        await get(client, server.url)
        [(connection, _)] = next(iter(client._idle.values()))
        connection.open = True  # as if the FIN were still in flight
        assert (await get(client, server.url)).body == b"x"
    assert server.connections == 2


async def test_a_timeout_in_the_middle_closes_that_connection() -> None:
    hang = asyncio.Event()

    async def first_hangs(head: bytes, writer: asyncio.StreamWriter) -> bool:
        if len(server.heads) == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            await writer.drain()
            await hang.wait()
            return False
        writer.write(ok(b"fine"))
        return True

    async with serving(first_hangs) as server, EngineClient() as client:
        with pytest.raises(TimeoutError):
            await engine_client.get(client, server.url + "/metrics", timeout=0.2, cap=1000)
        assert (await get(client, server.url)).body == b"fine"  # never the rest of the first answer
        hang.set()
    assert server.connections == 2


async def test_bytes_nobody_asked_for_retire_the_connection() -> None:
    async def chatty(head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok(b"x"))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfalse")  # an answer to no request
        return True

    async with serving(chatty) as server, EngineClient() as client:
        await get(client, server.url)
        [(kept, _)] = next(iter(client._idle.values()))
        await asyncio.sleep(0.2)
        assert not kept.open  # closed when the unasked answer arrived, not left for the next request to read
        assert (await get(client, server.url)).body == b"x"
    assert server.connections == 2


async def test_idle_connections_are_bounded_and_expire() -> None:
    now = [0.0]
    async with serving(sends(ok(b"x"), pause=0.05)) as server, EngineClient(clock=lambda: now[0]) as client:
        await asyncio.gather(*(get(client, server.url) for _ in range(10)))
        assert server.connections == 10 and client.idle_connections() == PER_HOST_IDLE
        now[0] += KEEPALIVE_SECONDS + 1
        await get(client, server.url)  # the old ones are closed, one new one serves
        assert server.connections == 11 and client.idle_connections() == 1


async def test_no_connection_is_kept_when_none_may_be() -> None:
    async with serving(sends(ok(b"x"))) as server, EngineClient(idle_per_host=0) as client:
        for _ in range(3):
            assert (await get(client, server.url)).body == b"x"
        assert client.idle_connections() == 0
    assert server.connections == 3


async def test_in_flight_requests_are_bounded_by_the_limit() -> None:
    busy = 0
    most = 0

    async def counting(head: bytes, writer: asyncio.StreamWriter) -> bool:
        nonlocal busy, most
        busy += 1
        most = max(most, busy)
        await asyncio.sleep(0.02)
        busy -= 1
        writer.write(ok(b"x"))
        return True

    async with serving(counting) as server, EngineClient(limit=3) as client:
        await asyncio.gather(*(get(client, server.url) for _ in range(12)))
    assert most == 3


async def test_connections_open_stay_within_the_limit_across_many_addresses() -> None:
    """Idle connections count: 12 engines asked twice at once each, limit 4, never more than 4 open at the servers
    (the kept ones of other addresses closed first), and those kept are used again within the limit."""
    servers = []
    open_now = most = 0

    async def counting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_now, most
        open_now += 1
        most = max(most, open_now)
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await asyncio.sleep(0.01)
                writer.write(ok(b"x"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            open_now -= 1
            writer.close()

    try:
        for _ in range(12):
            servers.append(await asyncio.start_server(counting, "127.0.0.1", 0))
        urls = [f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in servers]
        async with EngineClient(limit=4) as client:
            for _ in range(3):
                answers = await asyncio.gather(*(get(client, url) for url in urls for _ in range(2)))
                assert all(a.body == b"x" for a in answers)
                assert client.idle_connections() <= 4
                await asyncio.sleep(0.05)  # the servers see the closes
                assert open_now <= 4
            # One address asked again and again: its kept connection serves it, nothing more is opened.
            for _ in range(5):
                await get(client, urls[0])
            assert client.idle_connections() >= 1
        assert most <= 4
    finally:
        for server in servers:
            server.close()


async def test_no_connection_and_no_tls_are_told_apart() -> None:
    async with serving(sends(ok(b"x"))) as server:
        port = server.url.rsplit(":", 1)[1]
    async with EngineClient() as client:
        with pytest.raises(ConnectError) as refused:
            await get(client, f"http://127.0.0.1:{port}")
        assert isinstance(refused.value.os_error, ConnectionRefusedError)
        assert not isinstance(refused.value, TlsError)

    async def plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)  # a TLS hello, as any plain HTTP server reads a request: refused as no HTTP
        writer.write(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(plain, "127.0.0.1", 0)
    async with server, EngineClient() as client:
        with pytest.raises(TlsError):  # https to a server that speaks plain HTTP
            await get(client, f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}")
