"""The generated rules under promtool: `check rules` on each file, and the unit suites of rules/tests/.

The suites (`promtool test rules`) hold every alert on both sides of its threshold and of its `for:`
boundary; `test_every_alert_is_tested_firing_and_silent` makes a new alert without such tests fail.
promtool comes with Debian's prometheus package; the `promtool` fixture (tests/conftest.py) fails with
the install command when it is missing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "rules"
RULE_FILES = [RULES / "oomguard-alerts.yaml", RULES / "oomguard-records.yaml"]
SUITES = sorted((RULES / "tests").glob("*.yaml"))


def promtool_run(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def report(result: subprocess.CompletedProcess[str]) -> str:
    return f"promtool exited {result.returncode}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def alert_rules() -> dict[str, dict]:
    groups = load(RULES / "oomguard-alerts.yaml")["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def record_names() -> set[str]:
    groups = load(RULES / "oomguard-records.yaml")["groups"]
    return {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}


def test_there_are_suites() -> None:
    assert SUITES, f"no promtool test suites in {RULES / 'tests'}"


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_check_rules(promtool: str, path: Path) -> None:
    result = promtool_run(promtool, "check", "rules", str(path), cwd=REPO)
    assert result.returncode == 0, report(result)


@pytest.mark.parametrize("suite", SUITES, ids=lambda p: p.name)
def test_promtool_suite(promtool: str, suite: Path) -> None:
    # rule_files are relative to the suite's own folder, wherever promtool runs from.
    result = promtool_run(promtool, "test", "rules", suite.name, cwd=suite.parent)
    assert result.returncode == 0, report(result)
    assert "SUCCESS" in result.stdout, report(result)


def alert_tests() -> list[tuple[str, dict]]:
    """(suite name, alert_rule_test entry) over every suite."""
    return [
        (suite.name, case)
        for suite in SUITES
        for group in load(suite).get("tests") or []
        for case in group.get("alert_rule_test") or []
    ]


def test_every_alert_is_tested_firing_and_silent() -> None:
    rules = alert_rules()
    cases = alert_tests()
    unknown = sorted({case["alertname"] for _, case in cases} - rules.keys())
    assert not unknown, f"alert_rule_test entries name alerts that do not exist: {unknown}"
    problems = []
    for name, rule in sorted(rules.items()):
        mine = [case for _, case in cases if case["alertname"] == name]
        firing = [case for case in mine if case.get("exp_alerts")]
        silent = [case for case in mine if not case.get("exp_alerts")]
        if len(mine) < 2 or not firing or not silent:
            problems.append(f"{name}: {len(firing)} firing and {len(silent)} silent alert_rule_test entries")
            continue
        # promtool compares annotations exactly; at least one expectation must spell them all out.
        wanted = set(rule.get("annotations", {}))
        spelled = [set(alert.get("exp_annotations") or {}) for case in firing for alert in case["exp_alerts"]]
        if not any(wanted <= keys for keys in spelled):
            problems.append(f"{name}: no firing expectation with all of its annotations {sorted(wanted)}")
    assert not problems, "alerts without a firing and a silent promtool test in rules/tests/:\n" + "\n".join(problems)


def test_every_record_is_tested() -> None:
    tested = {
        case["expr"].strip()
        for suite in SUITES
        for group in load(suite).get("tests") or []
        for case in group.get("promql_expr_test") or []
        if case.get("exp_samples")
    }
    missing = sorted(record_names() - tested)
    assert not missing, f"recording rules without a promql_expr_test with exp_samples in rules/tests/: {missing}"


def test_input_series_look_like_real_scrapes() -> None:
    """Every input series carries a job and an instance label, as Prometheus' scrape adds them."""
    bad = [
        f"{suite.name}: {series['series']}"
        for suite in SUITES
        for group in load(suite).get("tests") or []
        for series in group.get("input_series") or []
        if "job=" not in series["series"] or "instance=" not in series["series"]
    ]
    assert not bad, "input series without job/instance labels:\n" + "\n".join(bad)
