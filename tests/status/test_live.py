"""The status page in a real browser and `oomguard top` in a real terminal, during the incident simulation.

One `oomguard serve --simulate incident` (15x faster than life: the climb shows about 30 s after the start, the OOM
about 25 s later) with a second, static target whose name is an HTML injection. Debian's headless Chromium loads `/`
at 375 px wide while the climb is on: the rendered DOM shows the climb, the time to full and the page that holds,
the hostile name as text (no element made of it, no script run), and a screenshot is kept; `oomguard top` runs in
tmux and its pane shows the same.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from oomguard.common.ports import free_port

HOSTILE = "<img src=x onerror=alert(1)>"
CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")
OOMGUARD = Path(sys.executable).with_name("oomguard")
SCREENSHOT = Path(__file__).parents[2] / "docs" / "status-page.png"


def _status(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/status.json", timeout=5) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def climbing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The exporter's URL once its GPU 0 reads a climb with a time to full (within a minute of its start)."""
    tmp = tmp_path_factory.mktemp("live")
    config = tmp / "oomguard.yaml"
    config.write_text(f'targets:\n  - name: "{HOSTILE}"\n    url: http://127.0.0.1:9/\n')
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp / "serve.log").open("w")
    argv = [str(OOMGUARD), "serve", "--config", str(config), "--simulate", "incident", "--simulate.time-scale", "15",
            "--web.listen-address", f"127.0.0.1:{port}"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (tmp / "serve.log").read_text()
            try:
                gpu = _status(url)["gpus"][0]
                if gpu["trend"] == "climbing" and gpu["seconds_to_full"] is not None:
                    break
            except (OSError, IndexError, KeyError, ValueError):
                pass
            assert time.monotonic() < deadline, (
                "no climb with a time to full in 90 s:\n" + (tmp / "serve.log").read_text()
            )
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def _chromium(*args: str, user_data: Path) -> subprocess.CompletedProcess[str]:
    # As root in a container, without the sandbox; no background requests (this machine has no network).
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={user_data}"]  # fmt: skip
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=60, check=True)


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium (scripts/install-system-deps.sh installs it)")
def test_the_page_in_a_browser_shows_the_climb_and_time_to_full_before_the_oom(climbing: str, tmp_path: Path) -> None:
    dom = _chromium("--window-size=375,1400", "--dump-dom", climbing + "/", user_data=tmp_path / "a").stdout
    assert "trend: climbing" in dom and "full in" in dom, dom
    assert "OomGuardGpuMemoryExhaustedSoon" in dom
    # The hostile target name is text: escaped in the DOM, no <img> element anywhere on the page.
    assert "&lt;img src=x onerror=alert(1)&gt;" in dom
    assert "<img" not in dom
    shot = tmp_path / "status.png"
    _chromium("--window-size=375,1400", f"--screenshot={shot}", climbing + "/", user_data=tmp_path / "b")
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") == 375
    if os.environ.get("OOMGUARD_UPDATE_SCREENSHOT"):
        SCREENSHOT.write_bytes(png)  # docs/status-page.png, which the README shows


def test_the_page_sends_a_policy_that_runs_no_script(climbing: str) -> None:
    with urllib.request.urlopen(climbing + "/", timeout=5) as response:
        policy = response.headers["Content-Security-Policy"]
        page = response.read().decode()
    assert "default-src 'none'" in policy and "script-src" not in policy  # no script source at all
    assert "<script" not in page


@pytest.mark.skipif(shutil.which("tmux") is None, reason="no tmux (Debian's tmux package)")
def test_top_in_tmux_shows_the_same(climbing: str) -> None:
    session = f"oomguard-top-{os.getpid()}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "40",
                    f"{OOMGUARD} top {climbing} --interval 1"], check=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            pane = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout
            if "GPU" in pane and "sim-vllm" in pane:
                break
            assert time.monotonic() < deadline, pane
            time.sleep(0.5)
        assert "oomguard top" in pane and "[RRRR" in pane
        assert HOSTILE[:20] in pane  # the name as it is, in a terminal
        assert any(word in pane for word in ("climbing", "saturated", "OomGuard")), pane
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
    once = subprocess.run([str(OOMGUARD), "top", climbing, "--once"], capture_output=True, text=True, timeout=30)
    assert once.returncode == 0 and "GPU" in once.stdout
    down = subprocess.run([str(OOMGUARD), "top", "http://127.0.0.1:9", "--once", "--timeout", "2"],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert down.returncode == 2 and "is `oomguard serve` running there?" in down.stderr
