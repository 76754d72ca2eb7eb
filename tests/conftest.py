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
    # One worker's, one after another (ONE_WORKER_EACH): 50 + 55 + 25 + 20 s, each server start 25 to 35 s of CPU.
    "tests/real/vllm/test_exporter_realvllm.py",
    "tests/real/vllm/test_drill_realvllm.py",
    "tests/real/vllm/test_hostile_realvllm.py",
    "tests/real/vllm/test_events_realvllm.py",
    "tests/simulate/test_simulation.py",  # 120 s: the quick start at 10x, the incident loop
    "tests/diagnose/test_agrees_with_pages.py",  # 100 s: the drills' simulations replayed through the rules
    "tests/bundle/test_promtool.py",  # 60 s
    "tests/backtest/test_command.py",  # 55 s
    "tests/bundle/test_dashboards.py",  # 50 s: every panel against a real Prometheus
)
# Folders whose modules run on one worker, one after another: each starts a real engine that takes the cores for
# tens of seconds, and two at once took three times as long (the real vLLM follow test: 50 s alone, 144 s).
ONE_WORKER_EACH = ("tests/real/vllm/", "tests/real/llamacpp/")


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent under -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """--dist loadscope, with each folder of ONE_WORKER_EACH one scope (xdist's scope is a module)."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return next(
                (folder for folder in ONE_WORKER_EACH if nodeid.startswith(folder)), None
            ) or super()._split_scope(nodeid)

    return Scheduling(config, log)


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
