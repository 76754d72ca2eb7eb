"""The drill of every scenario: real Prometheus and Alertmanager, the generated rules, the example routing.

Each scenario runs at 30x (a 40-minute scenario takes 80 s): the expected alerts must reach the expected
receivers through Alertmanager, the quiet ones must never fire, and in the incident and the slow leak a
memory alert must arrive before the first OOM.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support import REPO

from oomguard.cli import main
from oomguard.drill.run import drill_alertmanager_config, run
from oomguard.drill.scenarios import SCENARIOS

ROUTING = REPO / "deploy" / "alertmanager" / "alertmanager.yml"


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_drill(name: str, tmp_path: Path) -> None:
    report = run(SCENARIOS[name], tmp_path, alertmanager_config=ROUTING)
    print(report.markdown())
    assert report.ok, report.markdown()
    assert report.alerts and all(a.ok for a in report.alerts)
    if SCENARIOS[name].memory_alert_before_oom:
        assert report.memory_alert_lead_minutes is not None and report.memory_alert_lead_minutes > 0


def test_drill_routing_rewrites_only_addresses_and_waits(tmp_path: Path) -> None:
    import yaml

    original = yaml.safe_load(ROUTING.read_text())
    drill = drill_alertmanager_config(ROUTING, 5555)
    assert [r["name"] for r in drill["receivers"]] == [r["name"] for r in original["receivers"]]
    for receiver in drill["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            assert hook["url"] == f"http://127.0.0.1:5555/{receiver['name']}"
    assert drill["inhibit_rules"] == original["inhibit_rules"]
    assert drill["route"]["group_wait"] == "1s"


def test_drill_command_list_and_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["drill", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in SCENARIOS)
    assert main(["drill", "--scenario", "nope"]) == 2


def test_drill_command_json_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The command as a user runs it, on the shortest scenario, with a JSON report and its exit status."""
    report = tmp_path / "report.json"
    code = main(["drill", "--scenario", "probe-kill", "--json", "--report", str(report),
                 "--alertmanager-config", str(ROUTING), "--workdir", str(tmp_path / "work")])  # fmt: skip
    data = json.loads(report.read_text())
    assert code == (0 if data["ok"] else 1)
    assert data["scenario"] == "probe-kill" and {a["alert"] for a in data["alerts"]} >= {"OomGuardRestartStorm"}
