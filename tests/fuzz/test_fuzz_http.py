"""Fuzzing the engines' HTTP client (engine_client.py): what an engine sends back, arriving in arbitrary pieces.

The answer's bytes are fed to the client's connection as a socket would hand them over (cut anywhere), through a
transport that records what the client does with the connection. Two properties:
- a well-formed answer (any status, a body framed by Content-Length, by chunks or by the connection's end) comes
  out as it was sent, within the cap, whatever the cuts;
- any bytes at all end in an Answer or in one of engine_client.py's errors (a protocol error, a body over its cap),
  never another exception; a failed exchange never leaves the connection to be reused.
"""

from __future__ import annotations

import asyncio

from hypothesis import example, given
from hypothesis import strategies as st

from oomguard.common.engine_client import Answer, BodyTooLarge, ProtocolError, _Connection
from tests.fuzz.fuzz_strategies import chunked

CAP = 4096


class Transport:
    """What the connection writes and whether it hung up; no socket."""

    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True


async def exchange(
    pieces: list[bytes],
    *,
    truncate: bool = False,
) -> object:
    """The outcome of one exchange fed `pieces`: (Answer, reusable) or the exception it raised."""
    connection = _Connection()
    transport = Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    task = asyncio.ensure_future(connection.exchange(b"GET / HTTP/1.1\r\n\r\n", "http://engine/metrics", CAP, truncate))
    await asyncio.sleep(0)
    for piece in pieces:
        if task.done():
            break
        connection.data_received(piece)
        await asyncio.sleep(0)  # the exchange, answered, goes on before the next bytes or the close
    if not task.done():
        connection.eof_received()
        connection.connection_lost(None)
    await asyncio.sleep(0)
    assert task.done(), "the exchange waits on although the server has closed"
    if task.exception() is not None:
        assert transport.closed or not connection.open, "a failed exchange left its connection open"
        return task.exception()
    answer, reusable = task.result()
    if reusable:
        assert not transport.closed and connection.open
    return answer, reusable


BODIES = st.binary(max_size=3 * CAP // 2)


@st.composite
def framed(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(the answer's bytes, its body) with a framing drawn: Content-Length, chunks, or none (to the close)."""
    body = draw(BODIES)
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    headers = ["Content-Type: text/plain; version=0.0.4", "Server: engine"]
    if framing == "length":
        head = [*headers, f"Content-Length: {len(body)}"]
        payload = body
    elif framing == "chunked":
        head = [*headers, "Transfer-Encoding: chunked"]
        pieces = draw(chunked(body, max_chunks=8)) if body else []
        payload = b"".join(f"{len(p):X}\r\n".encode() + p + b"\r\n" for p in pieces) + b"0\r\n\r\n"
    else:
        head, payload = headers, body
    version = "HTTP/1.0" if framing == "close" and draw(st.booleans()) else "HTTP/1.1"
    return (f"{version} 200 OK\r\n" + "\r\n".join(head) + "\r\n\r\n").encode() + payload, body


@given(st.data(), framed())
def test_a_well_formed_answer_comes_out_as_sent(data: st.DataObject, answer: tuple[bytes, bytes]) -> None:
    raw, body = answer
    outcome = asyncio.run(exchange(data.draw(chunked(raw, max_chunks=20))))
    if len(body) > CAP:
        assert isinstance(outcome, BodyTooLarge), outcome
    else:
        assert isinstance(outcome, tuple), outcome
        assert outcome[0] == Answer(200, body)


@given(st.data(), framed())
def test_truncate_gives_the_first_bytes_of_any_framing(data: st.DataObject, answer: tuple[bytes, bytes]) -> None:
    raw, body = answer
    outcome = asyncio.run(exchange(data.draw(chunked(raw, max_chunks=20)), truncate=True))
    assert isinstance(outcome, tuple), outcome
    assert outcome[0] == Answer(200, body[:CAP], truncated=len(body) > CAP)
    assert not (outcome[0].truncated and outcome[1]), "a truncated read left the rest of its body to the next answer"


@given(st.data(), st.integers(100, 599).filter(lambda status: status != 200), st.sampled_from([5, 4096, 4097, None]))
def test_another_status_is_the_answer_its_body_dropped(data: st.DataObject, status: int, length: int | None) -> None:
    """Another status's body is never the answer's; a short one is read to keep the connection, a longer or
    unbounded one is not read and the connection is not reused."""
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    body = b"h" * (length or 5) if length is not None else b"5\r\nhello\r\n0\r\n\r\n"
    raw = f"HTTP/1.1 {status} Whatever\r\n{framing}\r\n\r\n".encode() + body
    outcome = asyncio.run(exchange(data.draw(chunked(raw, max_chunks=6))))
    if status < 200:  # an interim answer, then the close: no answer came
        assert isinstance(outcome, ProtocolError), outcome
    else:
        kept = length is not None and length <= 4096
        assert outcome == (Answer(status, b""), kept), outcome


HEADS = st.sampled_from(
    [b"HTTP/1.1 200 OK\r\n", b"HTTP/1.0 200 \r\n", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"]
)
NOISE = st.one_of(st.binary(max_size=300), st.builds(lambda head, rest: head + rest, HEADS, st.binary(max_size=300)))


@given(st.data(), NOISE, st.booleans())
@example(None, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n", False)
@example(None, b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n", False)
def test_any_bytes_end_in_an_answer_or_a_named_error(data: st.DataObject | None, raw: bytes, truncate: bool) -> None:
    pieces = data.draw(chunked(raw, max_chunks=10)) if data is not None and raw else [raw]
    outcome = asyncio.run(exchange(pieces, truncate=truncate))
    if isinstance(outcome, tuple):
        answer, _ = outcome
        assert len(answer.body) <= CAP
    else:
        assert isinstance(outcome, ProtocolError | BodyTooLarge), repr(outcome)
