"""No promtool case may depend on a sample at the start of a window it reads (tests/bundle/window_edges.py).

Prometheus 3 reads windows left-open, (t - W, t]; promtool 2.x, which runs here, closed, [t - W, t]. A case
with no sample on such a start means the same under both. Most suites use `interval: 59s999ms`: each sample
sits k ms before minute k, so an evaluation at minute k still reads it, and a window never starts on one
but at 0: a series that a window of W reads at W leaves its sample at 0 out ('_'), and a count of ALERTS
reads a window starting before 0 (one starting later starts on a rule evaluation).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bundle.window_edges import check_file

SUITES = sorted((Path(__file__).resolve().parents[2] / "rules" / "tests").glob("*.yaml"))


def report(findings) -> str:
    lines = []
    for finding in findings:
        lines.append(finding.case)
        lines += [f"    {edge}" for edge in dict.fromkeys(finding.edges)][:3]
    return f"{len(findings)} cases read a sample on a window's start:\n" + "\n".join(lines)


@pytest.mark.parametrize(
    "suite",
    SUITES,
    ids=lambda p: p.name,
)
def test_no_case_reads_a_sample_on_a_window_start(suite: Path) -> None:
    findings = check_file(suite)
    assert not findings, report(findings)


def test_the_check_sees_an_edge(tmp_path: Path) -> None:
    """A sample on the minute grid at t - 15m is found, as are the rule's `for` evaluations before eval_time."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: increase(c[15m]) >= 1\n        for: 2m\n"
        "      - record: r:c:increase15m\n        expr: increase(c[15m])\n",
        encoding="utf-8",
    )
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "rule_files: [rules.yaml]\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n"
        "      - series: 'c{job=\"j\",instance=\"i\"}'\n        values: '0x10 1x30'\n"
        "    alert_rule_test:\n      - eval_time: 27m\n        alertname: A\n"
        "    promql_expr_test:\n      - expr: r:c:increase15m\n        eval_time: 20m\n        exp_samples: []\n"
        "  - interval: 59s999ms\n    input_series:\n"
        "      - series: 'c{job=\"j\",instance=\"i\"}'\n        values: '0x10 1x30'\n"
        "    alert_rule_test:\n      - eval_time: 27m\n        alertname: A\n",
        encoding="utf-8",
    )
    findings = check_file(suite)
    cases = [finding.case for finding in findings]
    assert cases == ["suite.yaml test 1: r:c:increase15m at 20m", "suite.yaml test 1: A at 27m"], cases
    assert any("evaluation at 25m" in edge for edge in findings[1].edges), findings[1].edges
