"""The README's backtest example runs as written from a clone, on the example history the repository ships
(examples/backtest/), and says what the README says it says: the leak paged ahead of its OOM, nothing for nothing."""

from __future__ import annotations

import gzip
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

from support import REPO

EXAMPLE = REPO / "examples" / "backtest"


def _readme_command() -> list[str]:
    """The README's `oomguard backtest` line in a sh block, run by this venv's Python (the README's `.venv/bin/`)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.S)
    [line] = [line for block in blocks for line in block.splitlines() if re.match(r"\S*oomguard backtest ", line)]
    program, *args = shlex.split(line)
    assert program == ".venv/bin/oomguard", line
    return [sys.executable, "-m", "oomguard", *args]


def test_the_readmes_backtest_example_runs_as_written_and_shows_its_lead() -> None:
    command = _readme_command()
    for arg in command[4:]:  # every file it names is in the repository, as a clone has it
        if not arg.startswith("-"):
            assert (REPO / arg).is_file(), f"the README's backtest example names {arg}, not in the repository"
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    lead, alert = re.search(r"paged ([\d.]+) min before its OOM \(`(\w+)`\)", readme).groups()
    assert f"GPU 2, node gpu-node-1: paged {lead} min before ({alert})" in out, out
    assert "paged within the hour before their first OOM: 1 of 1" in out, out
    assert "GPU 1, node gpu-node-1: (unforeseeable" in out, out
    # The healthy GPUs (0 and 3) and the rest of the day: no page, no ticket.
    assert "pages: 0 (0.00 per GPU-day)" in out and "tickets: 0 (0.00 per GPU-day)" in out, out
    assert "4 GPUs on 1 node, 4 engines" in out, out
    assert "replaying the history" in result.stderr and "5,760 readings replayed" in result.stderr


def _writer():
    spec = importlib.util.spec_from_file_location("example_write", EXAMPLE / "write.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_is_what_its_script_writes(tmp_path: Path) -> None:
    """The committed files are the script's (so a change to either is seen), small enough to ship."""
    history, ooms = _writer().write(tmp_path)
    assert gzip.decompress(history.read_bytes()) == gzip.decompress((EXAMPLE / "history.csv.gz").read_bytes())
    assert ooms.read_text() == (EXAMPLE / "ooms.txt").read_text()
    assert (EXAMPLE / "history.csv.gz").stat().st_size < 512 * 1024
