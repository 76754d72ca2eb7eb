"""OomGuardConcurrencyOverKvCache from its tunables: what each one changes in the rule (promtool checks each)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from oomguard.bundle.bundle_config import load_bundle_config
from oomguard.bundle.generate import ALERTS_FILE, render

NAME = "OomGuardConcurrencyOverKvCache"


def alert(tmp_path: Path, promtool: str, text: str = "") -> dict:
    """The alert rendered with `text` as the bundle configuration, after `promtool check rules` on its file."""
    config = tmp_path / "bundle.yaml"
    config.write_text(text)
    rules = tmp_path / ALERTS_FILE
    rules.write_text(render(load_bundle_config(config))[ALERTS_FILE])
    result = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    found = [r for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"] if r.get("alert") == NAME]
    assert len(found) == 1
    return found[0]


def test_defaults(tmp_path: Path, promtool: str) -> None:
    rule = alert(tmp_path, promtool)
    expr = rule["expr"]
    assert expr.count("[3570s:1m]") == 2 and ") > 1.25" in expr and ">= 15\n" in expr and ">= 0.9" in expr
    assert 'setting=~"max_num_seqs|max_running_requests|max_concurrent_requests"' in expr
    assert "increase(oomguard_engine_preemptions_total" in expr and "and requests preempted" in str(rule)
    assert (rule["for"], rule["labels"]["severity"]) == ("15m", "warning")


def test_without_preemptions_it_is_a_prediction(tmp_path: Path, promtool: str) -> None:
    rule = alert(tmp_path, promtool, "alerts:\n  concurrency_over_kv_cache: {require_preemptions: false}\n")
    assert "preemptions" not in rule["expr"] and "preempted" not in rule["annotations"]["description"]


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        ("time_scale: 30\n", ["[119s:2s]", ">= 15\n"]),  # the same count of samples on a drill's clock
        ("alerts:\n  concurrency_over_kv_cache: {window: 2h, min_loaded: 30m}\n", ["[7170s:1m]", ">= 30\n"]),
        ("alerts:\n  concurrency_over_kv_cache: {margin_ratio: 0.5, quantile: 0.5}\n", [") > 1.5", "(0.5, ("]),
        ("alerts:\n  concurrency_over_kv_cache: {min_running: 8, min_kv_usage: 0.2}\n", [">= 8)", ">= 0.2)"]),
        (
            "alerts:\n  concurrency_over_kv_cache: {concurrency_settings: [max_num_seqs]}\n",
            ['setting=~"max_num_seqs"}'],
        ),
    ],
)
def test_each_tunable_reaches_the_rule(tmp_path: Path, promtool: str, text: str, wanted: list[str]) -> None:
    expr = alert(tmp_path, promtool, text)["expr"]
    missing = [w for w in wanted if w not in expr]
    assert not missing, f"{missing} not in:\n{expr}"
