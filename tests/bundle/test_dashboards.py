"""Dashboards: the dashboard-linter rules, and every panel query answered by a real Prometheus.

The real Prometheus (Debian package) scrapes a running exporter on the built-in leak
simulation (60x, trend windows shrunk to match) and evaluates the generated recording
rules; every panel query, annotation and variable of every dashboard must return data.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from support import REPO

from oomguard.bundle.bundle_config import load_bundle_config
from oomguard.bundle.dashboards import render
from oomguard.drill.services import Prometheus, free_port
from oomguard.exporter.config_loader import load_config
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app
from oomguard.simulate.supervisor import simulation

DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
UNITS = {"percentunit", "bytes", "Bps", "s", "none", "reqps", "short"}
# The bundle's fleet_labels (defaults.yaml): a variable each, and a matcher in every query.
FLEET = load_bundle_config().fleet_labels
RATE = re.compile(r"\b(rate|irate|increase)\(([^()]*(?:\([^()]*\))?[^()]*)\[([^\]]+)\]\)")


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_dashboards_are_what_the_generator_makes() -> None:
    generated = render(load_bundle_config())
    assert sorted(generated) == [p.name for p in DASHBOARDS]
    for path in DASHBOARDS:
        assert path.read_text() == generated[path.name], f"{path.name} is stale: run make generate"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_linter_rules(path: Path) -> None:
    d = load(path)
    variables = {v["name"]: v for v in d["templating"]["list"]}
    # template-datasource-rule
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["label"] == "Data source"
    assert variables["datasource"]["query"] == "prometheus"
    # template-job-rule / template-instance-rule, and the fleet's (cluster): on a single Prometheus the label is
    # absent, the variable lists no value, and its All (.*) matches the absent label.
    for name in (*FLEET, "job", "instance"):
        v = variables[name]
        assert v["datasource"]["uid"] == "${datasource}" and v["multi"] and v["includeAll"] and v["refresh"] == 2, name
        assert v["definition"].startswith("label_values("), name
        assert v["allValue"] == ".*" and v["current"]["value"] == ["$__all"], name
    # stable uid, schema, tags, timezone, time range, imports, links to the runbooks
    assert re.fullmatch(r"[0-9a-f]{24}", d["uid"])
    assert (
        d["schemaVersion"] >= 36 and "oomguard" in d["tags"] and d["timezone"] and d["time"]["from"].startswith("now-")
    )
    assert d["__inputs"][0]["pluginId"] == "prometheus"
    assert any("runbooks.md" in link.get("url", "") for link in d["links"])
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels(d):
        where = f"{path.name}: panel {panel['title']!r}"
        assert panel["title"] and panel.get("description"), where  # panel-title / panel-description
        assert panel["datasource"]["uid"] == "${datasource}", where  # panel-datasource-rule
        assert panel["targets"], where
        assert panel["fieldConfig"]["defaults"].get("unit") in UNITS, where  # panel-units-rule
        for target in panel["targets"]:
            expr = target["expr"]
            assert target["datasource"]["uid"] == "${datasource}", where
            for _, _, window in RATE.findall(expr):  # target-rate-interval-rule
                assert window in ("$__rate_interval", "$__range"), (where, expr)
            for match in re.finditer(r"(\w+_total)\{", expr):  # target-counter-agg-rule
                before = expr[: match.start()]
                assert re.search(r"(rate|irate|increase)\($", before), (where, expr)
            assert "$job" in expr and "$instance" in expr, (where, expr)
            for selector in re.findall(r"\{[^{}]*\}", expr):  # every selector that filters an instance, a cluster
                if "$instance" in selector:
                    assert all(f'{label}=~"${label}"' in selector for label in FLEET), (where, selector)
            for labels in re.findall(r"\b(?:by|on)\s*\(([^()]*)\)", expr):  # no sum over two clusters' targets
                assert all(label in labels.split(", ") for label in FLEET), (where, expr)
    for annotation in d["annotations"]["list"]:
        if "expr" in annotation:
            assert all(f'{label}=~"${label}"' in annotation["expr"] for label in FLEET), annotation["name"]


def test_uids_are_distinct() -> None:
    assert len({load(p)["uid"] for p in DASHBOARDS}) == len(DASHBOARDS)


# A panel's keys in Grafana's dashboard schema (schemaVersion 39; grafana-foundation-sdk 10.1's Panel and RowPanel
# write these, and maxPerRow goes with repeat): a key elsewhere is ignored by Grafana, silently. `drawStyle` at a
# panel's top level was one (the OOM events panel drew lines, not bars): a field's style is under fieldConfig.
PANEL_KEYS = {
    "type", "id", "title", "description", "datasource", "gridPos", "targets", "fieldConfig", "options",
    "transformations", "transparent", "links", "interval", "maxDataPoints", "timeFrom", "timeShift",
    "pluginVersion", "libraryPanel", "tags", "repeat", "repeatDirection", "repeatPanelId", "maxPerRow",
}  # fmt: skip
ROW_KEYS = {"type", "id", "title", "collapsed", "gridPos", "panels", "datasource", "repeat"}
# Time series styles, under fieldConfig.defaults.custom (GraphFieldConfig in the same schema).
TIMESERIES_CUSTOM = {
    "drawStyle", "lineWidth", "fillOpacity", "showPoints", "thresholdsStyle", "stacking", "lineStyle",
    "lineInterpolation", "pointSize", "spanNulls", "axisPlacement", "axisLabel", "gradientMode", "barAlignment",
}  # fmt: skip


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_panel_key_is_one_grafana_reads(path: Path) -> None:
    for panel in load(path)["panels"]:
        known = ROW_KEYS if panel["type"] == "row" else PANEL_KEYS
        assert set(panel) <= known, (panel["title"], sorted(set(panel) - known))
        if panel["type"] == "timeseries":
            custom = panel["fieldConfig"]["defaults"].get("custom", {})
            assert set(custom) <= TIMESERIES_CUSTOM, (panel["title"], sorted(set(custom) - TIMESERIES_CUSTOM))


def substitute(expr: str, scrape_interval_s: int) -> str:
    values = {
        "$__rate_interval": f"{4 * scrape_interval_s}s",
        "$__range": "2m",
        "$job": "oomguard",
        "$instance": ".*",
        "$target": ".*",
        "$gpu": ".*",
        "$node": ".*",
        **{f"${label}": ".*" for label in FLEET},  # All: the test's Prometheus has no cluster label
    }
    for variable, value in values.items():
        expr = expr.replace(variable, value)
    return expr


async def test_every_panel_query_returns_data_from_a_real_prometheus(
    tmp_path: Path, promtool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")  # the GPU series carry a node, as on Kubernetes: `$node` lists it
    sim = simulation("leak", time_scale=60.0, log_path=tmp_path / "engine.log")
    trend = {
        "interval_seconds": 0.1, "short_window_seconds": 2, "long_window_seconds": 30,
        "climb_min_seconds": 3, "tolerance_ratio": 0.005, "climb_min_rise_ratio": 0.02,
        "climb_min_slope_ratio_per_minute": 0.05,
    }  # fmt: skip
    config = load_config(None, {
        "trend": trend, "state_dir": str(tmp_path / "state"),
        "events": {"kernel_log": False, "quiet_seconds": 1},
        "targets": [{"name": "sim-vllm", "url": sim.url, "gpus": [0], "logs": [str(tmp_path / "engine.log")]}],
    })  # fmt: skip
    await sim.start()
    runner = web.AppRunner(make_app(Runtime(config, nvml_lib=sim.nvml)))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    prometheus = Prometheus(
        tmp_path / "prometheus", [f"127.0.0.1:{port}"], rule_files=[REPO / "rules" / "oomguard-records.yaml"]
    )
    try:
        await asyncio.to_thread(prometheus.start)
        started = time.time()
        # Run through a climb, the OOM and the restart (the leak OOMs ~43 s after launch at 60x).
        deadline = started + 120
        while time.time() < deadline:
            restarts = await asyncio.to_thread(prometheus.query, 'oomguard_target_restarts_total{job="oomguard"} > 0')
            if restarts:
                break
            await asyncio.sleep(1)
        else:
            pytest.fail(f"the simulated engine never restarted:\n{prometheus.log_tail()}")
        await asyncio.sleep(5)
        end = time.time()
        missing = []
        for path in DASHBOARDS:
            d = load(path)
            for panel in panels(d):
                for target in panel["targets"]:
                    expr = substitute(target["expr"], 1)
                    result = await asyncio.to_thread(prometheus.query_range, expr, started, end, 1.0)
                    if not result:
                        missing.append(f"{path.name}: panel {panel['title']!r}: {target['expr']}")
            for annotation in d["annotations"]["list"]:
                if "expr" in annotation:
                    result = await asyncio.to_thread(
                        prometheus.query_range, substitute(annotation["expr"], 1), started, end, 1.0
                    )
                    if not result:
                        missing.append(f"{path.name}: annotation {annotation['name']!r}: {annotation['expr']}")
            for variable in d["templating"]["list"]:
                match = re.fullmatch(r"label_values\((.*), (\w+)\)", variable.get("definition", ""))
                if match:
                    metric, label = match.groups()
                    result = await asyncio.to_thread(prometheus.query, f"group by ({label}) ({substitute(metric, 1)})")
                    # A single Prometheus has no cluster label: the query must run, its variable lists no value.
                    if not [r for r in result if r["metric"].get(label)] and variable["name"] not in FLEET:
                        missing.append(f"{path.name}: variable {variable['name']!r}: {variable['definition']}")
        assert not missing, "queries that returned nothing:\n" + "\n".join(missing)
    finally:
        prometheus.stop()
        await runner.cleanup()
        await sim.stop()


def test_provisioning_example_points_at_the_dashboards() -> None:
    import yaml

    provider = yaml.safe_load((REPO / "deploy" / "grafana" / "dashboards.yaml").read_text())["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"]
    source = yaml.safe_load((REPO / "deploy" / "grafana" / "datasource.yaml").read_text())["datasources"][0]
    assert source["type"] == "prometheus"
