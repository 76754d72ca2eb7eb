"""Basic authentication against `basic_auth_users` (bcrypt hashes), off the event loop.

bcrypt is slow by design (tens to hundreds of ms per check), so a success is remembered:
per user, an HMAC of the password that matched, under a key made at start. A wrong
password never matches that HMAC and always goes to bcrypt; the cache holds no password
and at most one entry per configured user. The cache is read before any wait, and it is
carried over a reload for every user whose hash did not change: a scraper whose password
is cached never waits behind wrong guesses.

Failing costs the same for every user name: an unknown user is checked against a decoy of
the highest cost among the users, and a known user whose hash is cheaper is topped up
with decoys of the costs in between (cost c, then c, c+1, ... max-1: 2^c + 2^c + ... +
2^(max-1) = 2^max), so timing does not tell which names exist.

At most one bcrypt per core runs at once (`BcryptSlots`); checks that wait are served one
client address after another, a few per address, so guesses from one address cannot starve
another's; beyond the bound a check is refused at once (`AuthBusy`, a 429), never queued.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os
import secrets
from collections import deque
from collections.abc import Mapping

import bcrypt

from oomguard.exporter.web_config.model import bcrypt_cost

# bcrypt reads at most 72 bytes of a password (the hash was made from those); bcrypt>=5 raises beyond.
_BCRYPT_MAX_BYTES = 72
_BCRYPT_ALPHABET = b"./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
# Checks waiting for a bcrypt slot: per client address, and all together (a bound on memory).
WAITING_PER_PEER = 4
MAX_WAITING = 1024


class AuthBusy(Exception):
    """Too many checks waiting for bcrypt: refuse now (429) rather than queue without bound."""


def _normalise(hashed: str) -> bytes:
    """htpasswd writes $2y$, which some bcrypt versions refuse; $2b$ is the same algorithm."""
    raw = hashed.encode("ascii")
    return b"$2b$" + raw[4:] if raw.startswith(b"$2y$") else raw


def _decoy(cost: int) -> bytes:
    """A well-formed hash of `cost` that no password matches; made without hashing (instant, even at cost 14)."""
    return bcrypt.gensalt(cost) + bytes(secrets.choice(_BCRYPT_ALPHABET) for _ in range(31))


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


class BcryptSlots:
    """Bounds bcrypt work: `slots` at once (one per core). Checks that wait are queued per client address
    and served in turn, one address after another: a flood of guesses from one address delays another
    address's check by at most one bcrypt per slot and one turn. An address may have `WAITING_PER_PEER`
    checks waiting, all addresses together `MAX_WAITING`; beyond, AuthBusy at once. Shared by reloads."""

    def __init__(self, slots: int | None = None) -> None:
        self.slots = slots or max(1, os.cpu_count() or 1)
        self.running = 0
        self.waiting = 0
        self._queues: dict[str, deque[asyncio.Future[None]]] = {}  # in turn order: the first goes next

    async def run(self, hashes: tuple[bytes, ...], password: bytes, peer: str) -> bool:
        await self._acquire(peer)
        try:
            return await asyncio.to_thread(_verify, hashes, password)
        finally:
            self._release()

    async def _acquire(self, peer: str) -> None:
        if self.running < self.slots and not self.waiting:
            self.running += 1
            return
        queue = self._queues.get(peer)
        if (queue is not None and len(queue) >= WAITING_PER_PEER) or self.waiting >= MAX_WAITING:
            raise AuthBusy
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(peer, deque()).append(turn)
        self.waiting += 1
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._release()  # the slot was handed over as the request went away: pass it on
            else:
                self._forget(peer, turn)
            raise

    def _forget(self, peer: str, turn: asyncio.Future[None]) -> None:
        queue = self._queues.get(peer)
        if queue is not None and turn in queue:
            queue.remove(turn)
            self.waiting -= 1
            if not queue:
                del self._queues[peer]

    def _release(self) -> None:
        """Hand the slot to the next address in turn (which then goes to the back), or free it."""
        while self._queues:
            peer = next(iter(self._queues))
            queue = self._queues.pop(peer)
            turn = queue.popleft()
            self.waiting -= 1
            if queue:
                self._queues[peer] = queue
            if not turn.done():
                turn.set_result(None)
                return
        self.running -= 1


class BasicAuth:
    """One per loaded file; `previous` (the one in force) hands over its cache, key and slots."""

    def __init__(self, users: Mapping[str, str], previous: BasicAuth | None = None) -> None:
        self._users = {user: _normalise(hashed) for user, hashed in users.items()}
        costs = {user: bcrypt_cost(hashed) or 10 for user, hashed in users.items()}
        self._top = max(costs.values(), default=10)
        self._decoys = {cost: _decoy(cost) for cost in range(min(costs.values(), default=10), self._top + 1)}
        self._costs = costs
        self._key = previous._key if previous else secrets.token_bytes(32)
        self.slots = previous.slots if previous else BcryptSlots()
        kept = previous._good if previous else {}
        # A success stays good only for a user whose hash is the very same.
        self._good: dict[str, bytes] = {
            user: tag for user, tag in kept.items() if previous and previous._users.get(user) == self._users.get(user)
        }

    def __len__(self) -> int:
        return len(self._users)

    def _work(self, user: str) -> tuple[bytes, ...]:
        """The hashes a check of `user` runs, in order: the same total cost (2^top) for every name."""
        hashed = self._users.get(user)
        if hashed is None:
            return (self._decoys[self._top],)
        cost = self._costs[user]
        return (hashed, *(self._decoys[c] for c in range(cost, self._top)))

    async def check(self, header: str | None, peer: str = "") -> bool:
        """True for a configured user's right password; AuthBusy when too many checks from `peer` (the client's
        address) already wait."""
        credentials = parse_basic(header)
        if credentials is None:
            return False
        user, password = credentials
        tag = hmac.digest(self._key, password, hashlib.sha256)
        if hmac.compare_digest(self._good.get(user, b""), tag) and user in self._users:
            return True  # before any wait: a cached scraper never queues behind guesses
        matched = await self.slots.run(self._work(user), password, peer)
        if matched and user in self._users:
            self._good[user] = tag
            return True
        return False


def _verify(hashes: tuple[bytes, ...], password: bytes) -> bool:
    """The first hash is the user's (or a decoy); the rest are decoys run only on a failure, to even the cost."""
    if _bcrypt_matches(hashes[0], password):
        return True
    for decoy in hashes[1:]:
        _bcrypt_matches(decoy, password)
    return False


def _bcrypt_matches(hashed: bytes, password: bytes) -> bool:
    try:
        return bcrypt.checkpw(password[:_BCRYPT_MAX_BYTES], hashed)
    except ValueError:  # a hash bcrypt cannot read: no match, never an exception into the request
        return False
