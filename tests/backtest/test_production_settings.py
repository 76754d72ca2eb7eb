"""The drill's scenarios as histories at production settings (1x: a sample every 5 s, the shipped trend and bundle,
an evaluation every 30 s), as a user's history of the same events would be judged: every memory incident is paged
before its OOM, no healthy server pages anyone. One Prometheus for them all, each scenario a day after the other."""

from __future__ import annotations

import pytest

from oomguard.backtest.files import FileHistory
from oomguard.backtest.report import Report
from oomguard.backtest.rules import rule_set
from oomguard.backtest.run import Options, judge_history, replay_history
from oomguard.backtest.tsdb import Backfill, Prometheus
from oomguard.bundle.bundle_config import load_bundle_config
from oomguard.drill.scenarios import MEMORY_ALERTS, SCENARIOS
from oomguard.exporter.config import TrendConfig
from tests.backtest.histories import T0, scenario_rows, write_csv

DAY = 86400.0


@pytest.fixture(scope="module")
def production(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Report]:
    workdir = tmp_path_factory.mktemp("production")
    options = Options(load_bundle_config(), trend=TrendConfig().settings(), evaluation_interval=30.0, jobs=1)
    rules = rule_set(options.bundle, options.evaluation_interval)
    backfill = Backfill(workdir)
    replayed = {}
    for day, name in enumerate(SCENARIOS):
        rows, ooms = scenario_rows(name, step=5.0, t0=T0 + day * DAY)
        history = FileHistory(write_csv(workdir / f"{name}.csv", rows))
        replayed[name] = (replay_history(history, name, options, rules, backfill), ooms)
    blocks = backfill.finish()
    with Prometheus(workdir, blocks, replayed["incident"][0].lookback) as prometheus:
        return {name: judge_history(prometheus, r, options, rules, ooms)[0] for name, (r, ooms) in replayed.items()}


@pytest.mark.parametrize("name", [n for n, s in SCENARIOS.items() if s.memory_alert_before_oom])
def test_at_production_settings_each_memory_incident_is_paged_before_its_oom(
    production: dict[str, Report], name: str
) -> None:
    report = production[name]
    assert report.outcome.paged == report.outcome.incidents == 1
    page = report.ooms[0].first_page
    assert page is not None and page.alert.removeprefix("OomGuard") in MEMORY_ALERTS and page.lead_seconds > 60


@pytest.mark.parametrize("name", [n for n, s in SCENARIOS.items() if not s.memory_alert_before_oom])
def test_at_production_settings_a_healthy_server_pages_no_one(production: dict[str, Report], name: str) -> None:
    report = production[name]
    assert report.outcome.false_pages == 0
    # Nor a ticket: the engine's load from an idle GPU is no climb (the PromQL-only climb alert's still_rising).
    assert report.false_alarms == [], report.false_alarms


def test_the_text_report(production: dict[str, Report]) -> None:
    text = production["incident"].text()
    assert text.startswith("oomguard backtest of incident")
    assert "OOMs: 4 in 1 incident, paged within the hour before their first OOM: 1 of 1" in text
    assert "(a relapse, 6.4 min after the OOM before it) " in text
    assert "Outside incidents" in text and "pages: 0" in text
    # What the shipped routing would have sent: the page, and no notification for nothing.
    assert "Notifications, as the shipped routing" in text and "pager: " in text
    assert production["incident"].notifications is not None
    assert production["incident"].notifications.count("pager", for_nothing=True) == 0
