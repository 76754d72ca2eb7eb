"""A base URL as a user writes it: `localhost:9090` (no scheme) is the usual slip, and urllib's answer to it,
"unknown url type", names neither the problem nor the fix."""

from __future__ import annotations

import argparse
from urllib.parse import urlsplit


def url_problem(text: str) -> str | None:
    """What keeps `text` from being an http(s) URL with a host, with the fix; None when it is one."""
    parts = urlsplit(text)
    if "://" not in text:
        return f"{text!r} has no scheme: write http://{text}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{text!r} is not an http(s) URL with a host"
    return None


def http_url_argument(text: str) -> str:
    """A URL flag's value, as argparse's `type`: refused in argparse's one line, naming the flag, before anything
    is asked of it."""
    problem = url_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


__all__ = ["http_url_argument", "url_problem"]
