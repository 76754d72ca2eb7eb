"""The dashboards read recording rules: where a user imports them (the README's dashboards paragraph, the
Grafana provisioning example) says which, and that Prometheus must load rules/oomguard-records.yaml."""

from __future__ import annotations

import re

import yaml
from support import REPO

_RECORDED = re.compile(r"\b[a-z_]+:[a-z_]+:[a-z_]+\b")  # a recording rule's level:metric:operations


def _read_by_dashboards() -> set[str]:
    names = {m for path in (REPO / "dashboards").glob("*.json") for m in _RECORDED.findall(path.read_text())}
    # Only names the records file defines: a label matcher or a URL never matches that file's records.
    records = {
        rule["record"]
        for group in yaml.safe_load((REPO / "rules" / "oomguard-records.yaml").read_text())["groups"]
        for rule in group["rules"]
    }
    assert names <= records, f"the dashboards read {sorted(names - records)}, which no recording rule makes"
    return names


def _readme_dashboards_paragraph() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("- [dashboards/](dashboards/)")
    return text[start : text.index("\n- ", start + 1)]


def test_the_dashboards_read_recording_rules() -> None:
    assert _read_by_dashboards(), "none read: the texts below would have nothing to say"


def test_where_the_dashboards_are_imported_names_their_recording_rules() -> None:
    names = _read_by_dashboards()
    for where, text in {
        "README.md (dashboards)": _readme_dashboards_paragraph(),
        "deploy/grafana/dashboards.yaml": (REPO / "deploy" / "grafana" / "dashboards.yaml").read_text(),
    }.items():
        assert "rules/oomguard-records.yaml" in text, where
        missing = sorted(name for name in names if name not in text)
        assert not missing, f"{where} does not name {missing}"
