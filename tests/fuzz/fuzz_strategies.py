"""Strategies shared by the fuzz tests: large values built from small draws, bytes that are not UTF-8."""

from __future__ import annotations

import itertools

from hypothesis import strategies as st

MB = 1024 * 1024

# Bytes that are never valid UTF-8 where they stand: a lone continuation byte, a truncated
# sequence, an overlong encoding, a surrogate, bytes never used by UTF-8.
INVALID_UTF8 = st.sampled_from([b"\x80", b"\xc3", b"\xe2\x82", b"\xc0\xaf", b"\xed\xa0\x80", b"\xff", b"\xfe\xff"])


@st.composite
def big_text(draw: st.DrawFn, min_size: int = 0, max_size: int = MB + 64) -> str:
    """A text up to `max_size` characters: a short random piece repeated, so that hypothesis draws
    (and shrinks) a few bytes, not a megabyte."""
    piece = draw(st.text(min_size=1, max_size=8))
    small = st.integers(min_size, max(min_size, min(max_size, 300)))
    size = draw(st.one_of(small, st.integers(min_size, max_size)))
    return (piece * (size // len(piece) + 1))[:size]


def with_invalid_utf8(data: bytes) -> st.SearchStrategy[bytes]:
    """`data` with a byte sequence that is not UTF-8 inserted at some place."""
    return st.tuples(st.integers(0, len(data)), INVALID_UTF8).map(lambda t: data[: t[0]] + t[1] + data[t[0] :])


@st.composite
def chunked(draw: st.DrawFn, data: bytes, max_chunks: int = 12) -> list[bytes]:
    """`data` cut at arbitrary places (some cuts inside a UTF-8 character or a CRLF): the chunks, in order."""
    if not data:
        return []
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=max_chunks - 1))))
    bounds = [0, *[c for c in cuts if 0 < c < len(data)], len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]
