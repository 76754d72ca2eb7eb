"""`oomguard drill --tls`: the shortest scenario through a chain that is https with basic auth end to end.

The exporter and Alertmanager serve under a web configuration made for the drill (a throwaway CA, a bcrypt
hash); the real Prometheus scrapes with `scheme: https`, `tls_config` and `basic_auth.password_file`, and
sends its alerts to Alertmanager so. The scenario must still pass (RestartStorm reaches the pager through
the https Alertmanager), and the drill's own checks must find the exporter refusing no password and a
wrong one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from oomguard.cli import main


def test_probe_kill_drill_over_tls_and_basic_auth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    work, report = tmp_path / "work", tmp_path / "report.json"
    code = main(["drill", "--scenario", "probe-kill", "--tls", "--json", "--report", str(report),
                 "--workdir", str(work)])  # fmt: skip
    data = json.loads(report.read_text())
    assert data["ok"] and code == 0, data["problems"]
    pager = [a for a in data["alerts"] if a["alert"] == "OomGuardRestartStorm"]
    assert pager and pager[0]["receivers"] == ["pager"]
    assert [d["verdict"] for d in data["diagnosis"]] == ["probe_kill"]

    checks = "\n".join(data["tls"])
    assert "with the drill's password: 200" in checks
    assert "with no credentials: 401" in checks and "with a wrong password: 401" in checks
    assert "Prometheus scraped https://127.0.0.1:" in checks and "/metrics: up" in checks
    assert "Prometheus sends alerts to https://127.0.0.1:" in checks

    # What Prometheus was given: the CA and the certificate's name, the password from a file, never inline.
    config = yaml.safe_load((work / "prometheus" / "prometheus.yml").read_text())
    job = config["scrape_configs"][0]
    manager = config["alerting"]["alertmanagers"][0]
    tls = work / "tls"
    for client in (job, manager):
        assert client["scheme"] == "https"
        assert client["tls_config"] == {"ca_file": str(tls / "ca.crt"), "server_name": "oomguard.drill.invalid"}
        assert client["basic_auth"] == {"username": "prometheus", "password_file": str(tls / "password")}
    password = (tls / "password").read_text()
    assert password not in (work / "prometheus" / "prometheus.yml").read_text()
    web_config = yaml.safe_load((tls / "web-config.yml").read_text())
    assert web_config["basic_auth_users"]["prometheus"].startswith("$2b$")
    assert password not in (tls / "web-config.yml").read_text()
