"""Fixtures shared by the tests (helpers live in support.py, and those of web configurations in web_serving.py)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from web_serving import Pki, Serve


# The modules that take a minute or more, longest first (pytest --durations, one process on 2 cores, 2026-12-07).
# On several workers (make test: pytest-xdist, a module per worker at a time) they are handed out first, so that
# none of them begins when the others are nearly done: the suite's length is then about the longest module's.
LONGEST_FIRST = (
    "tests/drill/test_drill.py",  # 330 s: every scenario, three at a time, on the wall clock
    "tests/simulate/test_simulation.py",  # 120 s: the quick start at 10x, the incident loop
    "tests/diagnose/test_agrees_with_pages.py",  # 100 s: the drills' simulations replayed through the rules
    "tests/bundle/test_promtool.py",  # 60 s
    "tests/real/vllm/test_hostile_realvllm.py",  # 60 s
    "tests/backtest/test_command.py",  # 55 s
    "tests/real/vllm/test_drill_realvllm.py",  # 55 s
    "tests/bundle/test_dashboards.py",  # 50 s: every panel against a real Prometheus
    "tests/real/vllm/test_exporter_realvllm.py",  # 50 s
)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    missing = [name for name in LONGEST_FIRST if not (root / name).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FIRST names files that are gone: {missing}")
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))  # stable: the rest as collected


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
