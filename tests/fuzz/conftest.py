"""Hypothesis' settings for the fuzz tests (docs/testing.md, "Fuzzing").

Profiles, chosen by HYPOTHESIS_PROFILE, else "ci" when the environment variable CI is set, else "dev":

* dev: random examples, a failing one is saved in an example database under the system's temp
  directory (never in the repository) and replayed first on the next run.
* ci: derandomized (the same examples every run: the suite never flakes) and no database.
* long: a soak run, many more examples, random; `HYPOTHESIS_PROFILE=long .venv/bin/pytest tests/fuzz`.

No deadline: the machines that run this are shared and slow, and a slow example is not a bug here
(the tests that care about time assert it themselves). The budgets keep tests/fuzz under ~60 s on
two slow cores; the profile in use is printed in pytest's header.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import hypothesis.configuration
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

# Hypothesis keeps its files (the default database among them) under .hypothesis/ in the working
# directory: moved out of the checkout altogether.
_HOME = Path(tempfile.gettempdir()) / "oomguard-hypothesis"
hypothesis.configuration.set_hypothesis_home_dir(_HOME)

_COMMON = {
    "deadline": None,
    "print_blob": True,  # a failure prints the @reproduce_failure line to replay it anywhere
    # Large values (1 MB lines and label values) are built from small draws, but a slow core may
    # still take a while to generate a few of them.
    "suppress_health_check": (HealthCheck.too_slow,),
}
settings.register_profile(
    "dev", max_examples=40, database=DirectoryBasedExampleDatabase(str(_HOME / "examples")), **_COMMON
)
settings.register_profile("ci", max_examples=40, database=None, derandomize=True, **_COMMON)
settings.register_profile("long", max_examples=2000, database=None, **_COMMON)

PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
settings.load_profile(PROFILE)


def pytest_report_header() -> str:
    return f"hypothesis profile (tests/fuzz): {PROFILE}, max_examples={settings.default.max_examples}"
