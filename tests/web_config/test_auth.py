"""Basic auth: bcrypt off the event loop, successes cached, failures never cached as good."""

from __future__ import annotations

import base64
import threading

import pytest
from web_serving import bcrypt_hash

from oomguard.exporter.web_config import auth as auth_module
from oomguard.exporter.web_config.auth import BasicAuth, parse_basic


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def bcrypt_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The threads bcrypt ran on."""
    calls: list[str] = []
    real = auth_module._bcrypt_matches

    def counting(hashed: bytes, password: bytes) -> bool:
        calls.append(threading.current_thread().name)
        return real(hashed, password)

    monkeypatch.setattr(auth_module, "_bcrypt_matches", counting)
    return calls


async def test_bcrypt_runs_off_the_loop_and_a_success_is_cached(bcrypt_calls: list[str]) -> None:
    auth = BasicAuth({"alice": bcrypt_hash("right")})
    assert await auth.check(header("alice", "right"))
    assert await auth.check(header("alice", "right"))
    assert len(bcrypt_calls) == 1 and bcrypt_calls[0] != threading.main_thread().name


async def test_a_wrong_password_is_never_cached_as_good(bcrypt_calls: list[str]) -> None:
    auth = BasicAuth({"alice": bcrypt_hash("right")})
    assert await auth.check(header("alice", "right"))
    for _ in range(2):
        assert not await auth.check(header("alice", "wrong"))
    assert len(bcrypt_calls) == 3  # each wrong try went to bcrypt
    assert await auth.check(header("alice", "right"))
    assert len(bcrypt_calls) == 3


async def test_unknown_users_cost_a_bcrypt_too(bcrypt_calls: list[str]) -> None:
    auth = BasicAuth({"alice": bcrypt_hash("right")})
    assert not await auth.check(header("mallory", "right"))
    assert len(bcrypt_calls) == 1  # against the decoy: timing does not tell that mallory does not exist


async def test_htpasswd_hashes_of_cost_10_are_read() -> None:
    # Cost 10 with the $2y$ prefix, as `htpasswd -nBC 10` writes them; some bcrypt versions refuse $2y$.
    auth = BasicAuth({"bob": "$2y$10$CCvC7EFlFgc9b4IjJjyUjenz12cY7TXNXr3KzySxqAdwWh9B5VKLW"})
    assert await auth.check(header("bob", "hunter2"))
    assert not await auth.check(header("bob", "hunter3"))


@pytest.mark.parametrize(
    "value",
    [None, "", "Bearer abc", "Basic", "Basic !!!", "Basic " + base64.b64encode(b"no-colon").decode(),
     "Basic " + base64.b64encode(b"\xff\xfe:pw").decode()],
)  # fmt: skip
def test_malformed_headers_are_no_credentials(value: str | None) -> None:
    assert parse_basic(value) is None


def test_a_password_may_hold_colons() -> None:
    assert parse_basic(header("alice", "a:b:c")) == ("alice", b"a:b:c")
