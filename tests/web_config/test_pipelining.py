"""HTTP/1.1 pipelining under a web configuration: several requests in one write are all answered, in order.

What a layer between the client and aiohttp could break: only the first of several pipelined requests answered,
the connection then waiting out the 15 s header timeout. Under basic auth over http, TLS with client certificates
and basic auth, and added headers, every request is answered at once, in order, well within the timeout.

A client may also close its side once it has sent its requests (a half-close: `nc -N`, `shutdown(SHUT_WR)`): the
requests it sent are answered all the same, then the connection is closed, as the exporter toolkit does. Under
basic auth a check waits for bcrypt, and the client's close is read before its answer is written: closing then
loses that answer and those queued behind it (2 or 10 wrong passwords pipelined so got one 401 or none, where without
auth every handler had answered before the close was read).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import time
from dataclasses import dataclass

import pytest
import yaml
from web_serving import PASSWORD, Pki, bcrypt_hash, web_config_text

# Far below the header timeout (15 s) that a request left unanswered would wait out.
ANSWERED_WITHIN_SECONDS = 5.0
# Each path's answer is told apart by status and type, so that their order shows.
PATHS = ("/-/healthy", "/metrics", "/nope", "/", "/-/healthy")
EXPECTED = [(200, "text/plain"), (200, "text/plain"), (404, "text/plain"), (200, "text/html"), (200, "text/plain")]


@dataclass
class Answer:
    status: int
    content_type: str
    body: bytes


def _requests(paths: tuple[str, ...], password: str = PASSWORD) -> bytes:
    auth = base64.b64encode(f"prometheus:{password}".encode()).decode()
    return b"".join(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Basic {auth}\r\n\r\n".encode() for path in paths
    )


async def _answer(reader: asyncio.StreamReader) -> Answer:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in head[1:] if line)}
    body = await reader.readexactly(int(headers["content-length"]))
    return Answer(int(head[0].split()[1]), headers.get("content-type", ""), body)


async def _pipelined(url: str, paths: tuple[str, ...], context: ssl.SSLContext | None) -> tuple[list[Answer], float]:
    """The answers to `paths` sent in one write on one connection, and how long they took."""
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port), ssl=context)
    try:
        began = time.monotonic()
        writer.write(_requests(paths))
        await writer.drain()
        answers = [await asyncio.wait_for(_answer(reader), ANSWERED_WITHIN_SECONDS) for _ in paths]
        return answers, time.monotonic() - began
    finally:
        writer.close()


def _basic_auth_only() -> str:
    return yaml.safe_dump({"basic_auth_users": {"prometheus": bcrypt_hash(PASSWORD)}})


@pytest.mark.parametrize("layout", ["basic auth over http", "TLS, client certificates and basic auth", "headers"])
async def test_pipelined_requests_are_all_answered_in_order(serve, pki: Pki, layout: str) -> None:
    text = {
        "basic auth over http": _basic_auth_only(),
        "TLS, client certificates and basic auth": web_config_text(pki),
        "headers": yaml.safe_dump({"http_server_config": {"headers": {"X-Frame-Options": "deny"}}}),
    }[layout]
    served = await serve(text)
    context = pki.client_context(client=pki.client) if served.url.startswith("https") else None
    answers, took = await _pipelined(served.url, PATHS, context)
    assert [(a.status, a.content_type.split(";")[0]) for a in answers] == EXPECTED
    assert answers[1].body.startswith(b"# HELP") and answers[0].body == answers[-1].body == b"OK\n"
    assert took < ANSWERED_WITHIN_SECONDS, took


async def test_more_pipelined_requests_than_aiohttp_queues_are_all_answered(serve, pki: Pki) -> None:
    """aiohttp stops reading a connection with 32 requests queued and reads on as it answers them: 100 in one
    write, under TLS with client certificates and basic auth, all answered."""
    served = await serve(web_config_text(pki))
    answers, took = await _pipelined(served.url, ("/-/healthy",) * 100, pki.client_context(client=pki.client))
    assert [a.status for a in answers] == [200] * 100 and took < ANSWERED_WITHIN_SECONDS, took


def _statuses(data: bytes) -> list[int]:
    """The status of each answer in `data`, in order (each head and its Content-Length body)."""
    statuses = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        statuses.append(int(lines[0].split()[1]))
        data = rest[length:]
    return statuses


# The header timeout raised far above the test's bound on a read: a connection left waiting for a request that never
# comes fails the test at once rather than after the timeout.
HEADER_TIMEOUT = 120.0
READ_BOUND_SECONDS = 10.0


@pytest.mark.parametrize("count", [2, 10])
@pytest.mark.parametrize("password", ["right", "wrong"])
@pytest.mark.parametrize("then", ["kept open", "half-closed"])
async def test_pipelined_requests_under_basic_auth_are_each_answered(
    serve, count: int, password: str, then: str
) -> None:
    """A raw socket: `count` requests in one write, the right password (200 each) or a wrong one (a 401 each, each
    checked by bcrypt), the client's side then kept open or closed. Every answer arrives, in order; half-closed,
    the server closes once the last is written (read to its end, bounded)."""
    served = await serve(_basic_auth_only(), header_timeout=HEADER_TIMEOUT)
    host, port = served.url.rsplit("//", 1)[1].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(_requests(("/-/healthy",) * count, PASSWORD if password == "right" else "not-the-password"))
        await writer.drain()
        expected = [200 if password == "right" else 401] * count
        if then == "half-closed":
            writer.write_eof()
            data = await asyncio.wait_for(reader.read(), READ_BOUND_SECONDS)  # to the server's close
            assert _statuses(data) == expected
        else:
            answers = [await asyncio.wait_for(_answer(reader), READ_BOUND_SECONDS) for _ in range(count)]
            assert [a.status for a in answers] == expected
    finally:
        writer.close()


async def test_pipelined_requests_then_a_half_close_are_answered_without_a_web_configuration(serve) -> None:
    """The same listener serves without a web configuration: a handler that waits (a scrape's collection) must not
    let the client's close through first either."""
    served = await serve(None, header_timeout=HEADER_TIMEOUT)
    host, port = served.url.rsplit("//", 1)[1].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(_requests(("/metrics", "/-/healthy", "/metrics")))
        writer.write_eof()
        data = await asyncio.wait_for(reader.read(), READ_BOUND_SECONDS)
        assert _statuses(data) == [200, 200, 200]
    finally:
        writer.close()
