"""Each page declared once (common/thresholds.py's DECLARATIONS): every paging alert of the generated rules has
exactly one declaration and each declaration one alert; the rules render each declared threshold and `for:` /
`keep_firing_for:` from it; and on the same readings the status page, diagnose and the declaration's own predicate
judge alike, on life's clock and on a simulation's (the rules' side is held by test_promtool.py and
tests/diagnose/test_agrees_with_pages.py)."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from oomguard.bundle.bundle_config import load_bundle_config
from oomguard.bundle.generate import ALERTS_FILE, render
from oomguard.bundle.thresholds import default_thresholds, thresholds_of
from oomguard.common import thresholds as pages
from oomguard.common.thresholds import Thresholds
from oomguard.common.time_scale import TimeScale
from oomguard.diagnose.core import diagnose_data
from oomguard.diagnose.query import exporter_data
from oomguard.exporter.exposition import render as exposition
from oomguard.exporter.model import Snapshot
from oomguard.exporter.status.view import build
from tests.status.test_view import NOW, snapshot

PAGING = ("critical", "page")  # the severities a page is routed at


def alerts(config_text: str = "", folder: Path | None = None) -> dict[str, dict]:
    """The generated alerts by name, of the defaults merged with `config_text` (written into `folder`)."""
    config = load_bundle_config()
    if config_text and folder is not None:
        (path := folder / "bundle.yaml").write_text(config_text)
        config = load_bundle_config(path)
    groups = yaml.safe_load(render(config)[ALERTS_FILE])["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"]}


def test_every_paging_alert_has_exactly_one_declaration_and_each_declaration_one_alert() -> None:
    prefix = load_bundle_config().prefix
    rules = alerts()
    paging = [name for name, rule in rules.items() if rule["labels"]["severity"] in PAGING]
    declared = Counter(prefix + d.name for d in pages.DECLARATIONS)
    assert paging, "no paging alert in the generated rules"
    undeclared = [name for name in paging if declared[name] != 1]
    assert not undeclared, f"paging alerts without exactly one declaration in common/thresholds.py: {undeclared}"
    assert len(pages.BY_KEY) == len(pages.DECLARATIONS), "two declarations of one key"
    for name, count in declared.items():
        assert count == 1 and name in rules, f"{name}: declared {count} times, in the rules: {name in rules}"
    # The declarations that one reading judges are the thresholds' pages, by the same keys and names.
    assert [p.name for p in default_thresholds().pages] == [prefix + pages.PAGES[p.key] for p in
                                                            default_thresholds().pages]  # fmt: skip


# A configuration that moves every declared threshold and hysteresis off its default, to figures found nowhere else.
MOVED = """
alerts:
  gpu_memory_critical: {threshold: 0.9613, headroom_threshold: 0.8817, for: 7m, keep_firing_for: 17m}
  over_budget: {margin_ratio: 0.0731, for: 3m, keep_firing_for: 19m}
  exhausted_soon: {seconds: 2341, min_total_ratio: 0.9371, for: 45s, keep_firing_for: 11m}
  oom_event: {window: 13m}
  restart_storm: {count: 7, window: 23m}
  exporter_down: {for: 6m}
  gpu_lost: {for: 3m}
  dcgm_node_conflict: {for: 4m}
"""


@pytest.fixture(scope="module")
def moved_rules(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return alerts(MOVED, tmp_path_factory.mktemp("moved"))


@pytest.mark.parametrize("declaration", pages.DECLARATIONS, ids=lambda d: d.key)
def test_each_alert_renders_its_declared_thresholds_and_hysteresis(
    declaration: pages.PageDeclaration, moved_rules: dict[str, dict]
) -> None:
    """The rule's expression holds each threshold its declaration names, and the rule has the `for:` and
    `keep_firing_for:` its declaration names and no other: the declaration is what the template reads."""
    moved = yaml.safe_load(MOVED)["alerts"][declaration.key]
    rule = moved_rules["OomGuard" + declaration.name]
    for basis, key in declaration.thresholds.items():
        value = str(moved[key])
        assert re.search(rf"(?<![\d.]){re.escape(value)}(?![\d.])", rule["expr"]), (declaration.key, basis, value)
    assert {k for k in ("for", "keep_firing_for") if k in rule} == set(declaration.hysteresis)
    for key in declaration.hysteresis:
        assert rule[key] == moved[key], (declaration.key, key)


def test_on_a_drills_clock_the_rules_threshold_in_seconds_is_the_declarations_turned(tmp_path: Path) -> None:
    rule = alerts("time_scale: 10\n", tmp_path)["OomGuardGpuMemoryExhaustedSoon"]
    th = default_thresholds()
    assert f"< {TimeScale(10).real(th.exhausted_soon_seconds):g}\n" in rule["expr"]
    assert rule["for"] == "12s" and rule["keep_firing_for"] == "60s"  # 2m and 10m on a clock 10 times faster


# Readings around each threshold: (GPU used share, headroom used or None, real seconds to full or None) and a
# target's (OOM age, restarts, last restart's age), real seconds, each as a fraction of the rule's own figure.
def gpu_cases(th: Thresholds, clock: TimeScale) -> list[tuple[float, float | None, float | None]]:
    soon = clock.real(th.exhausted_soon_seconds)
    return [
        (0.95, th.headroom_critical - 0.01, None),
        (0.95, th.headroom_critical + 0.01, None),
        (0.95, th.headroom_critical, None),  # at the line: ">" does not hold
        (th.used_critical - 0.005, None, None),
        (th.used_critical + 0.005, None, None),
        (0.9, 0.2, soon * 0.95),
        (0.9, 0.2, soon * 1.05),
        (0.99, th.headroom_critical + 0.05, soon * 1.05),  # climbing, full later: no Critical either
        (th.exhausted_soon_min_total - 0.01, None, soon * 0.5),
        (th.exhausted_soon_min_total + 0.01, None, soon * 0.5),
    ]


def target_cases(th: Thresholds, clock: TimeScale) -> list[tuple[float | None, int, float | None]]:
    window, storm = clock.real(th.oom_window_seconds), clock.real(th.restart_storm_window_seconds)
    count = th.restart_storm_count
    return [
        (window * 0.9, 0, None),
        (window * 1.1, 0, None),
        (None, count, storm * 0.9),
        (None, count, storm * 1.1),
        (None, count - 1, storm * 0.5),
        (window * 0.5, count + 1, storm * 0.5),
    ]


def declared(th: Thresholds, clock: TimeScale, gpu: tuple, target: tuple) -> set[str]:
    """What the declarations' own predicates say holds on the reading, by alert name."""
    used, headroom, to_full = gpu
    oom_ago, restarts, restart_ago = target
    met = [
        pages.gpu_page(pages.GpuNow(headroom, used, clock.simulated(to_full) if to_full is not None else None), th),
        pages.oom_event(clock.simulated(oom_ago), th) if oom_ago is not None else None,
        pages.restart_storm(restarts, clock.simulated(restart_ago), th) if restart_ago is not None else None,
    ]
    return {th.page(m.declaration.key).name for m in met if m is not None}


def reading(gpu: tuple, target: tuple) -> Snapshot:
    oom_ago, restarts, restart_ago = target
    held = snapshot(("0", *gpu), oom_ago=oom_ago)
    (llm,) = held.targets
    last = NOW - restart_ago if restart_ago is not None else None
    return dataclasses.replace(held, targets=(dataclasses.replace(llm, restarts_total=restarts, last_restart_at=last),))


def diagnosed(held: Snapshot, th: Thresholds, clock: TimeScale) -> set[str]:
    """What `diagnose --exporter` says holds on the reading's /metrics, on the same thresholds and clock."""
    data = exporter_data(exposition(held).decode(), instance="127.0.0.1:9847", now=NOW)
    diagnoses = diagnose_data(data, time_scale=clock.factor, thresholds=th)
    return {page.name for d in diagnoses for page, _ in d.facts.paging if page.pages}


@pytest.mark.parametrize("factor", [1.0, 10.0])
def test_the_status_page_diagnose_and_the_declaration_judge_the_same_readings_alike(factor: float) -> None:
    """Each GPU reading beside each target reading, around the thresholds: the three say the same pages hold, on
    the bundle's clock and on a simulation's ten times faster (the runtime's: serve --simulate at 10x)."""
    th = dataclasses.replace(thresholds_of(load_bundle_config()), time_scale=factor)
    clock = TimeScale(factor)
    seen: Counter[str] = Counter()
    for gpu in gpu_cases(th, clock):
        for target in target_cases(th, clock):
            held = reading(gpu, target)
            expected = declared(th, clock, gpu, target)
            view = {h.alert for h in build(held, thresholds=th, clock=clock).holding if h.severity in PAGING}
            assert view == expected, ("status page", gpu, target)
            assert diagnosed(held, th, clock) == expected, ("diagnose", gpu, target)
            seen.update(expected)
    # Every page one reading judges held on some readings and not on others: the cases straddle each threshold.
    judged = {th.page(d.key).name for d in pages.DECLARATIONS if d.judged_now and th.page(d.key).pages}
    assert set(seen) == judged and all(n < 60 for n in seen.values()), seen
