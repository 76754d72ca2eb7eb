"""The generated bundle: style rules, drift, and a non-default configuration changing exactly what it should."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support import REPO

from oomguard.bundle.config import defaults_text, load_bundle_config
from oomguard.bundle.generate import ALERTS_FILE, PROMETHEUS_RULE_FILE, RECORDS_FILE, render
from oomguard.cli import main
from oomguard.config import ConfigError

NAME = re.compile(r"^([A-Z]+[a-z0-9]+)+$")
RECORD = re.compile(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")


def rules(text: str) -> list[dict]:
    return [rule for group in yaml.safe_load(text)["groups"] for rule in group["rules"]]


@pytest.fixture(scope="module")
def default() -> dict[str, str]:
    return render(load_bundle_config())


def test_committed_rules_are_what_the_generator_makes(default: dict[str, str]) -> None:
    for name, text in default.items():
        assert (REPO / "rules" / name).read_text() == text, f"rules/{name} is stale: run make generate"


def test_alert_style(default: dict[str, str]) -> None:
    alerts = rules(default[ALERTS_FILE])
    assert len(alerts) >= 20
    names = [a["alert"] for a in alerts]
    assert len(set(names)) == len(names)
    for alert in alerts:
        name = alert["alert"]
        assert NAME.match(name) and name.startswith("OomGuard"), name
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), name
        summary, description = alert["annotations"]["summary"], alert["annotations"]["description"]
        assert summary[0].isupper() and summary.endswith(".") and "{{" not in summary, (name, summary)
        assert "{{" in description and "$labels" in description, (name, description)
        assert alert["annotations"]["runbook_url"].endswith("runbooks.md#" + name.lower()), name
        assert 'job="oomguard"' in alert["expr"], name


def test_record_names_follow_level_metric_operation(default: dict[str, str]) -> None:
    for record in rules(default[RECORDS_FILE]):
        assert RECORD.match(record["record"]), record["record"]
        assert 'job="oomguard"' in record["expr"]


def test_prometheus_rule_resource_holds_every_rule(default: dict[str, str]) -> None:
    resource = yaml.safe_load(default[PROMETHEUS_RULE_FILE])
    assert resource["apiVersion"] == "monitoring.coreos.com/v1" and resource["kind"] == "PrometheusRule"
    assert resource["metadata"]["labels"] == {"role": "alert-rules"}
    in_resource = [r for g in resource["spec"]["groups"] for r in g["rules"]]
    assert in_resource == rules(default[RECORDS_FILE]) + rules(default[ALERTS_FILE])


def test_non_default_configuration_changes_exactly_what_it_should(tmp_path: Path, default: dict[str, str]) -> None:
    custom = tmp_path / "bundle.yaml"
    custom.write_text(
        'selector: \'job="gpu-exporter",cluster="prod"\'\n'
        "extra_labels: {team: inference}\n"
        "alerts:\n"
        "  gpu_memory_high: {threshold: 0.85, for: 10m}\n"
        "  queue_backlog: {severity: critical}\n"
    )
    theirs = {a["alert"]: a for a in rules(render(load_bundle_config(custom))[ALERTS_FILE])}
    ours = {a["alert"]: a for a in rules(default[ALERTS_FILE])}
    assert theirs.keys() == ours.keys()
    for name, alert in ours.items():
        expected = yaml.safe_load(yaml.safe_dump(alert))
        expected["expr"] = alert["expr"].replace('job="oomguard"', 'job="gpu-exporter",cluster="prod"')
        expected["labels"]["team"] = "inference"
        if name == "OomGuardGpuMemoryHigh":
            expected["expr"] = expected["expr"].replace("> 0.9", "> 0.85")
            expected["for"] = "10m"
            expected["annotations"]["description"] = alert["annotations"]["description"].replace("90 %", "85 %")
        if name == "OomGuardQueueBacklog":
            expected["labels"]["severity"] = "critical"
        assert theirs[name] == expected, name


def test_time_scale_shortens_every_duration(tmp_path: Path, default: dict[str, str]) -> None:
    custom = tmp_path / "bundle.yaml"
    custom.write_text("time_scale: 60\n")
    scaled = {a["alert"]: a for a in rules(render(load_bundle_config(custom))[ALERTS_FILE])}
    assert scaled["OomGuardGpuMemoryHigh"]["for"] == "5s"  # 5m / 60
    assert "< 10" in scaled["OomGuardOomEvent"]["expr"]  # 10m window / 60 = 10 s
    assert "[15s]" in scaled["OomGuardRestartStorm"]["expr"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "alerts:\n  gpu_memory_hgh: {threshold: 0.8}\n",
            "unknown key 'alerts.gpu_memory_hgh'; did you mean 'gpu_memory_high'",
        ),
        ("alerts:\n  gpu_memory_high: {severity: page}\n", "severity 'page' is not one of critical, warning, info"),
        ("alerts:\n  gpu_memory_high: {for: 5 minutes}\n", "alerts.gpu_memory_high.for: '5 minutes' is not a duration"),
        ("prefix: oom_guard\n", "must be CamelCase"),
        ("selectr: x\n", "did you mean 'selector'"),
    ],
)
def test_bad_bundle_configuration_is_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bundle.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_bundle_config(path)


def test_generate_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--print-defaults"]) == 0
    assert capsys.readouterr().out == defaults_text()
    assert main(["generate", "--output", str(tmp_path)]) == 0
    assert sorted(p.name for p in (tmp_path / "rules").iterdir()) == sorted(
        [ALERTS_FILE, RECORDS_FILE, PROMETHEUS_RULE_FILE]
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("nope: 1\n")
    assert main(["generate", "--config", str(bad), "--output", str(tmp_path)]) == 1
    assert "unknown key 'nope'" in capsys.readouterr().err
