"""Fixtures shared by the tests (helpers live in support.py)."""

from __future__ import annotations

import shutil

import pytest


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
