"""An HTTP body read whole, up to a cap: what every request oomguard sends an engine reads its answer with."""

from __future__ import annotations

import aiohttp

CHUNK_BYTES = 64 * 1024


class BodyTooLarge(Exception):
    """The body is longer than the cap (its Content-Length says so, or the bytes read do)."""


async def read_capped(response: aiohttp.ClientResponse, cap: int) -> bytes:
    """The whole body, read chunk by chunk so that a larger one is refused before it is all in memory.
    (`content.read(n)` alone may return a part of the body: it gives what has arrived, up to n.)"""
    if response.content_length is not None and response.content_length > cap:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(CHUNK_BYTES):
        size += len(chunk)
        if size > cap:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)
