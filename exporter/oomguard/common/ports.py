"""Ports: a target's, from its URL; a free TCP port on loopback, for the simulated engine and the drill's services."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit


def url_port(url: str) -> int:
    """The port a URL reaches: its own, else its scheme's (443 for https, 80 otherwise). ValueError for a port
    out of range."""
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
