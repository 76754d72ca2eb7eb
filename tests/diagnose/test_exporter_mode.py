"""`--exporter`: one live oomguard on its simulation, read once, no history."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from support import samples

from oomguard.cli import main
from oomguard.common.ports import free_port


@pytest.fixture(scope="module")
def exporter() -> str:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "oomguard", "serve", "--simulate", "steady", "--simulate.time-scale", "30",
         "--web.listen-address", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/metrics", timeout=2) as response:
                    found = samples(response.read().decode())
                if found.get(("oomguard_target_state", (("state", "up"), ("target", "sim-vllm")))) == 1.0:
                    break
            except OSError:
                pass
            time.sleep(0.3)
        else:
            pytest.fail("the simulated exporter did not come up")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


def test_one_reading_of_a_steady_exporter(exporter, capsys) -> None:
    status = main(["diagnose", "--exporter", exporter, "--json"])
    body = json.loads(capsys.readouterr().out)
    (d,) = body["diagnoses"]
    assert status == 0
    assert (d["target"], d["verdict"]) == ("sim-vllm", "healthy")
    # No history: it says so and is less sure.
    assert d["confidence"] <= 0.7
    assert any("no history" in item["finding"] for item in d["evidence"])
    assert any("trend state now" in item["finding"] for item in d["evidence"])
    assert body["source"].startswith("exporter ")


def test_unknown_target_on_the_exporter(exporter, capsys) -> None:
    status = main(["diagnose", "--exporter", exporter, "--target", "nope"])
    assert status == 2
    assert "INSUFFICIENT_DATA" in capsys.readouterr().out


def test_one_reading_shows_the_cache_and_judges_no_cap(exporter, capsys) -> None:
    """The two-knob check needs a window: one reading gives its figures, never a finding (diagnose/capacity.py)."""
    main(["diagnose", "--exporter", exporter, "--json", "--max-num-seqs", "256"])
    (d,) = json.loads(capsys.readouterr().out)["diagnoses"]
    check = d["concurrency_check"]
    assert check["samples"] == 1 and check["kv_cache_capacity_requests"] > 0
    assert check["concurrency"] == {"name": "max_num_seqs", "value": 256.0, "origin": "--max-num-seqs"}
    assert check["over_capacity"] and not check["flagged"]
    assert any("one reading judges nothing" in item["finding"] for item in d["evidence"])
    assert d["recommendations"] == []
