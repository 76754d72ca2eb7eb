"""Basic authentication against `basic_auth_users` (bcrypt hashes), off the event loop.

bcrypt is slow by design (tens to hundreds of ms per check), so a success is remembered:
per user, an HMAC of the password that matched, under a key made at start. A wrong
password never matches that HMAC and always goes to bcrypt; the cache holds no password
and at most one entry per configured user. Unknown users are checked against a decoy hash
of the same cost, so timing does not tell which user names exist. One bcrypt runs at a time
(in a worker thread): a flood of wrong passwords queues behind itself, while a scraper whose
password is cached never waits for it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Mapping

import bcrypt

from oomguard.web_config.model import bcrypt_cost

# bcrypt reads at most 72 bytes of a password (the hash was made from those); bcrypt>=5 raises beyond.
_BCRYPT_MAX_BYTES = 72


def _normalise(hashed: str) -> bytes:
    """htpasswd writes $2y$, which some bcrypt versions refuse; $2b$ is the same algorithm."""
    raw = hashed.encode("ascii")
    return b"$2b$" + raw[4:] if raw.startswith(b"$2y$") else raw


def parse_basic(header: str | None) -> tuple[str, bytes] | None:
    """User and password of an `Authorization: Basic` header, or None when it is not one."""
    if not header:
        return None
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
        user, sep, password = decoded.partition(b":")
        return (user.decode("utf-8"), password) if sep else None
    except (binascii.Error, UnicodeDecodeError):
        return None


class BasicAuth:
    """Built while loading the file (in a thread: the decoy costs one bcrypt); one per loaded file."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = {user: _normalise(hashed) for user, hashed in users.items()}
        cost = max((bcrypt_cost(h) or 10) for h in users.values()) if users else 10
        self._decoy = bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(cost))
        self._key = secrets.token_bytes(32)
        self._good: dict[str, bytes] = {}
        self._one_at_a_time = asyncio.Lock()  # binds to the loop at first use, not here

    def __len__(self) -> int:
        return len(self._users)

    async def check(self, header: str | None) -> bool:
        credentials = parse_basic(header)
        if credentials is None:
            return False
        user, password = credentials
        hashed = self._users.get(user)
        tag = hmac.digest(self._key, password, hashlib.sha256)
        if hmac.compare_digest(self._good.get(user, b""), tag) and hashed is not None:
            return True
        async with self._one_at_a_time:
            matched = await asyncio.to_thread(_bcrypt_matches, hashed or self._decoy, password)
        if matched and hashed is not None:
            self._good[user] = tag
            return True
        return False


def _bcrypt_matches(hashed: bytes, password: bytes) -> bool:
    try:
        return bcrypt.checkpw(password[:_BCRYPT_MAX_BYTES], hashed)
    except ValueError:  # a hash bcrypt cannot read: no match, never an exception into the request
        return False
