"""`excerpt`: a value from a file or a tenant, cut to a bounded head before it goes into an error or a log line.

A configuration value, a key, a file name or a line of an engine's log can be megabytes long: quoted whole,
one error would print all of it. Every such quote goes through `excerpt` (a leaf: it imports nothing).
"""

from __future__ import annotations

LIMIT = 200  # characters kept: enough to recognise the value, never a flood


def excerpt(text: str, limit: int = LIMIT) -> str:
    """`text` itself when short, else its first `limit` characters and its length: 'abc... (10000000 characters)'."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


__all__ = ["LIMIT", "excerpt"]
