"""Fixtures shared by the tests (helpers live in support.py, and those of web configurations in web_serving.py)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from web_serving import Pki, Serve


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite golden files from the current output")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(scope="session")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool not found: run `make test` (it installs Debian's prometheus package) "
            "or `apt-get install prometheus`"
        )
    return path


@pytest.fixture
async def zoo(aiohttp_server):
    """Engines that behave well and badly, on one test server (see targets_zoo.py)."""
    from targets_zoo import Zoo

    zoo = Zoo()
    server = await aiohttp_server(zoo.app())
    zoo.base = f"http://127.0.0.1:{server.port}"
    yield zoo
    zoo.hang.set()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, a server certificate for 127.0.0.1, client certificates (web_serving.py): made once a session."""
    from web_serving import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Serve]:
    """`await serve(text, **server_options)`: oomguard served in-process under a web configuration (web_serving.py)."""
    from web_serving import serving

    async with serving(tmp_path) as start:
        yield start
