"""`oomguard serve --web.config.file` as a process: a bad file stops it at start, a good one serves https."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from web_serving import PASSWORD, Pki, basic, web_config_text

from oomguard.common.ports import free_port


def oomguard(*args: str) -> list[str]:
    return [sys.executable, "-m", "oomguard", "serve", "--no-collector.nvml", *args]


def test_a_bad_file_at_start_exits_non_zero_naming_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "web.yml"
    bad.write_text("basic_auth_users:\n  alice: not-a-hash\n")
    # Through the environment variable, which the flag's entry in cli._ENVIRONMENT reads.
    result = subprocess.run(oomguard("--web.listen-address", "127.0.0.1:0"), capture_output=True, text=True,
                            timeout=60, env=os.environ | {"OOMGUARD_WEB_CONFIG_FILE": str(bad)})  # fmt: skip
    assert result.returncode == 1
    assert f"{bad}: the web configuration is not valid:" in result.stderr
    assert "basic_auth_users.alice: not a bcrypt hash" in result.stderr
    assert "not-a-hash" not in result.stderr


def test_a_missing_file_at_start_exits_non_zero(tmp_path: Path) -> None:
    result = subprocess.run(oomguard("--web.config.file", str(tmp_path / "absent.yml")), capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 1 and "cannot read the web configuration file" in result.stderr


def test_serves_https_and_stops_cleanly_on_sigterm(tmp_path: Path, pki: Pki) -> None:
    file = tmp_path / "web.yml"
    file.write_text(web_config_text(pki))
    port = free_port()
    proc = subprocess.Popen(oomguard("--web.config.file", str(file), "--web.listen-address", f"127.0.0.1:{port}"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        request = urllib.request.Request(f"https://127.0.0.1:{port}/-/healthy", headers=basic("prometheus", PASSWORD))
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                with urllib.request.urlopen(request, context=pki.client_context(client=pki.client), timeout=5) as r:
                    assert r.status == 200
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("oomguard never answered over https")
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0]
        assert proc.returncode == 0, output
        assert "serving https on 127.0.0.1" in output and "RequireAndVerifyClientCert" in output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
