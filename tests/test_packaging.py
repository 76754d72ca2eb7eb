"""Every file the package reads at run time is in what `pip install .` installs (the image installs it so).

setuptools puts the modules in a wheel by themselves, and every other file only when a `package-data` pattern
of pyproject.toml names it: a template or a YAML file left out works in the editable install the tests run on
and fails in the image (the status page's template was once missing so).
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "exporter" / "oomguard"


def packaged() -> set[Path]:
    """The files pyproject.toml's package-data patterns name."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["oomguard"]
    return {path for pattern in patterns for path in PACKAGE.glob(pattern)}


def test_every_data_file_of_the_package_is_installed() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--", str(PACKAGE)], capture_output=True, check=True, cwd=ROOT
    ).stdout.split(b"\0")
    data = {ROOT / name.decode() for name in tracked if name and not name.endswith(b".py")}
    assert data, "git lists no file of the package: is this a clone?"
    missing = sorted(str(path.relative_to(PACKAGE)) for path in data - packaged())
    assert not missing, f"add to [tool.setuptools.package-data] in pyproject.toml: {missing}"


def test_the_check_finds_a_file_left_out(tmp_path: Path) -> None:
    """The check itself: the status page's template is named by a pattern, and without it would be missing."""
    template = PACKAGE / "exporter" / "status" / "templates" / "status.html.j2"
    assert template in packaged()
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["oomguard"]
    assert template not in {p for pattern in patterns if "status" not in pattern for p in PACKAGE.glob(pattern)}
