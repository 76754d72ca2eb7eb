"""The descriptor budget (descriptors.py): each use's share of RLIMIT_NOFILE, as the module's table says."""

from __future__ import annotations

import re
import resource

import pytest

from oomguard.common import descriptors
from oomguard.common.descriptors import Budget, budget
from oomguard.exporter.web_config.server import connection_limit, scrape_connection_limit

USES = ("files", "server", "scrapes", "log_streams", "log_reads")


def documented() -> dict[int, dict[str, int]]:
    """The table of the module's docstring: soft limit -> each use's share."""
    doc = descriptors.__doc__ or ""
    table = doc[doc.index("| soft limit |") :].split("\n\n", 1)[0].splitlines()
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert header[1:] == list(USES)
    rows = {}
    for row in table[2:]:
        cells = [int(re.sub(r"\D", "", cell.split("(")[0])) for cell in row.strip("|").split("|")]
        rows[cells[0]] = dict(zip(USES, cells[1:], strict=True))
    return rows


def test_the_documented_table_is_what_the_budget_gives() -> None:
    rows = documented()
    assert sorted(rows) == [256, 1024, 65536, 1 << 20]
    for limit, shares in rows.items():
        got = budget(limit)
        assert {use: getattr(got, use) for use in USES} == shares, limit


@pytest.mark.parametrize("limit", [256, 300, 512, 1000, 1024, 4096, 20000, 65536, 1 << 20])
def test_the_shares_never_add_up_to_more_than_the_limit_from_256(limit: int) -> None:
    got = budget(limit)
    assert sum(getattr(got, use) for use in USES) <= limit and not got.overbooked
    assert got.files >= 64 and got.log_reads >= 1 and got.log_streams > got.log_reads
    # The server's share leaves the logs one of their own: never three quarters of the limit again.
    assert got.server == limit // 4 and got.log_streams >= got.server


def test_an_unlimited_or_huge_limit_is_taken_as_the_ceiling() -> None:
    assert budget(resource.RLIM_INFINITY) == budget(1 << 20) == budget(1 << 40)
    assert budget(1 << 20).scrapes == 4096 and budget(1 << 20).log_reads == 64


def test_under_256_the_minimums_are_kept_and_said_overbooked() -> None:
    small = budget(100)
    assert small == Budget(100, files=64, server=25, scrapes=32, log_streams=3, log_reads=1)
    assert small.overbooked


def test_the_servers_functions_are_its_shares() -> None:
    for limit in (256, 1024, 65536, 1 << 30):
        assert connection_limit(limit) == budget(limit).server
        assert scrape_connection_limit(limit) == budget(limit).scrapes
    assert connection_limit() == budget(descriptors.soft_limit()).server


def test_serve_raises_the_soft_limit_to_the_hard_one() -> None:
    """As Go's runtime does for every Go exporter: a soft 256 under a hard 4,096 becomes 4,096 (in a child process:
    the limits are the process's), and the shares are of that."""
    import subprocess
    import sys

    code = (
        "import resource; from oomguard.common import descriptors; "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096)); "
        "print(descriptors.raise_soft_limit(), resource.getrlimit(resource.RLIMIT_NOFILE), "
        "descriptors.raise_soft_limit(), descriptors.budget().limit)"
    )
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.fail(f"this machine's hard RLIMIT_NOFILE is {hard}: the test needs 4,096")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["(256,", "4096)", "(4096,", "4096)", "None", "4096"]
