"""Every request oomguard sends an engine: `get`, a GET with the timeout, no redirect followed, and a body cap.

An engine's answers are tenant-controlled: each is bounded in time (the whole exchange, body included, within
the target's timeout), in size (the body read up to a cap, never further) and in where it goes (a redirect is
not followed: its status is the answer). The scraper's /metrics and /health and every fetch an engine plugin
adds (engines/<name>/) go through `get`; tests/hostile/test_hostile_engines.py holds that no other module of
the engines or the scraper sends a request of its own.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

CHUNK_BYTES = 64 * 1024


class BodyTooLarge(Exception):
    """The body is longer than the cap (its Content-Length says so, or the bytes read do)."""

    def __init__(self, url: str, cap: int) -> None:
        super().__init__(f"{url} sent more than {cap} bytes")
        self.url = url
        self.cap = cap


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes  # read only on a 200; empty otherwise
    truncated: bool = False  # a `truncate` read stopped at its cap


async def get(session: aiohttp.ClientSession, url: str, *, timeout: float, cap: int, truncate: bool = False) -> Answer:
    """GET url within `timeout` seconds (TimeoutError past it), the body of a 200 read up to `cap` bytes.
    Over the cap: BodyTooLarge, or with `truncate` the first `cap` bytes (the rest is never read: the
    connection is closed rather than drained). Other statuses' bodies are not read."""
    async with asyncio.timeout(timeout):
        async with session.get(url, allow_redirects=False) as response:
            if response.status != 200:
                return Answer(response.status, b"")
            if truncate:
                body = await read_head(response, cap)
                return Answer(response.status, body[:cap], truncated=len(body) > cap)
            return Answer(response.status, await read_capped(response, cap, url))


async def read_capped(response: aiohttp.ClientResponse, cap: int, url: str = "") -> bytes:
    """The whole body, read chunk by chunk so that a larger one is refused before it is all in memory.
    (`content.read(n)` alone may return a part of the body: it gives what has arrived, up to n.)"""
    url = url or str(response.url)
    if response.content_length is not None and response.content_length > cap:
        raise BodyTooLarge(url, cap)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(CHUNK_BYTES):
        size += len(chunk)
        if size > cap:
            raise BodyTooLarge(url, cap)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_head(response: aiohttp.ClientResponse, cap: int) -> bytes:
    """At most cap + 1 bytes of the body (one more tells a longer body), then stop reading."""
    chunks: list[bytes] = []
    size = 0
    while size <= cap:
        chunk = await response.content.read(cap + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
