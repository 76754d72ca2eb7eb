"""docs/runbooks.md and the bundle's runbook_url links: every alert has its section, every section its alert."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from support import REPO

RUNBOOKS = REPO / "docs" / "runbooks.md"
ALERTS = REPO / "rules" / "oomguard-alerts.yaml"
METRICS = REPO / "docs" / "metrics.md"
RECORDS = REPO / "rules" / "oomguard-records.yaml"
# What a tired on-call engineer looks for in every section, in this order.
PARTS = ("**Meaning.**", "**Impact.**", "**Diagnose.**", "**Mitigate.**")


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower-case, punctuation dropped (but - and _), spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(markdown: str) -> list[str]:
    """`## ` headings outside fenced code blocks (a `## ` comment in a shell block is not one)."""
    found, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and line.startswith("## "):
            found.append(line[3:].strip())
    return found


def sections(markdown: str) -> dict[str, str]:
    """Heading -> body, for each `## ` section."""
    parts = re.split(r"^## (.+)$", markdown, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


@pytest.fixture(scope="module")
def alerts() -> dict[str, dict]:
    rules = [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]
    return {rule["alert"]: rule for rule in rules if "alert" in rule}


@pytest.fixture(scope="module")
def markdown() -> str:
    return RUNBOOKS.read_text(encoding="utf-8")


def test_github_anchor() -> None:
    assert github_anchor("OomGuardGpuMemoryHigh") == "oomguardgpumemoryhigh"
    assert github_anchor("What it means, and why (90 %)") == "what-it-means-and-why-90-"
    assert github_anchor("kv_cache usage") == "kv_cache-usage"


def test_every_runbook_url_points_at_a_section(alerts: dict[str, dict], markdown: str) -> None:
    anchors = {github_anchor(heading) for heading in headings(markdown)}
    for name, alert in alerts.items():
        url = alert["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page.endswith("docs/runbooks.md"), f"{name}: {url} does not point at docs/runbooks.md"
        assert anchor in anchors, f"{name}: {url}: no heading with anchor #{anchor} in docs/runbooks.md"


def test_every_section_is_an_alert_of_the_bundle(alerts: dict[str, dict], markdown: str) -> None:
    found = headings(markdown)
    assert len(found) == len(set(found)), "a section is repeated"
    stale = [heading for heading in found if heading not in alerts]
    assert not stale, f"sections for alerts the bundle does not have: {stale}"
    # Headed exactly by the alert name, so the anchor is the name lower-cased, as the rules link it.
    missing = [name for name in alerts if name not in found]
    assert not missing, f"alerts without a section: {missing}"


def test_every_section_has_its_parts_in_order(markdown: str) -> None:
    for name, body in sections(markdown).items():
        positions = [body.find(part) for part in PARTS]
        missing = [part for part, at in zip(PARTS, positions, strict=True) if at < 0]
        assert not missing, f"{name}: missing {missing}"
        assert positions == sorted(positions), f"{name}: parts out of order, expected {PARTS}"


def test_metrics_named_in_the_runbooks_exist(markdown: str) -> None:
    """A renamed metric must not leave queries in the runbooks that return nothing."""
    known = set(re.findall(r"`(oomguard_[a-z_]+)`", METRICS.read_text())) | {"up"}
    known |= set(re.findall(r"record: ([a-z_:0-9]+)", RECORDS.read_text()))
    named = set(re.findall(r"\b(?:[a-z_]+:)?oomguard_[a-z_]+(?::[a-z0-9_]+)?", markdown))
    unknown = sorted(name for name in named if name not in known)
    assert not unknown, f"docs/runbooks.md names metrics that docs/metrics.md and the recording rules lack: {unknown}"


def test_promql_in_the_runbooks_parses(markdown: str, promtool: str, tmp_path: Path) -> None:
    """Every query a reader pastes into Prometheus must parse: each line of a ```promql block, and each inline
    `code` span that selects `instance="INSTANCE"` (the placeholder every query of the runbooks uses)."""
    blocks = re.findall(r"^[ \t]*```promql\n(.*?)^[ \t]*```", markdown, flags=re.MULTILINE | re.DOTALL)
    queries = [line.strip() for block in blocks for line in block.splitlines() if line.strip()]
    queries += [span for span in re.findall(r"`([^`\n]+)`", markdown) if 'instance="INSTANCE"' in span]
    assert len(blocks) >= 20 and len(queries) >= 60, (len(blocks), len(queries))
    rules = [{"record": f"runbook_query_{i}", "expr": query} for i, query in enumerate(queries)]
    path = tmp_path / "runbook-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "runbooks", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    numbered = "\n".join(f"runbook_query_{i}: {query}" for i, query in enumerate(queries))
    assert result.returncode == 0, f"{result.stdout}{result.stderr}\n{numbered}"


def test_links_between_sections_resolve(markdown: str) -> None:
    anchors = {github_anchor(heading) for heading in headings(markdown)}
    broken = sorted(set(re.findall(r"\]\(#([^)]+)\)", markdown)) - anchors)
    assert not broken, f"links to sections that do not exist: {broken}"
