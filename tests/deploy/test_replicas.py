"""Two exporters of one shard (deploy/kubernetes-sharded-ha) give one notification per alert, through a real
Prometheus and Alertmanager: each exporter scraped as the shipped ServiceMonitor relabels it (the shard's
`instance`, its pod's `replica`), the shipped rules (with `replica` among their fleet labels), and the shipped alert
relabelling, which drops `replica` before Alertmanager. Prometheus itself holds each alert twice (one per
replica, so the relabelling is what makes them one), and neither replica's figures double the other's."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from support import REPO

from oomguard.bundle.bundle_config import load_bundle_config
from oomguard.bundle.generate import ALERTS_FILE, RECORDS_FILE, render
from oomguard.common.ports import free_port
from oomguard.drill.run import DEFAULT_ALERTMANAGER_CONFIG, drill_alertmanager_config
from oomguard.drill.scenarios import SCENARIOS
from oomguard.drill.services import (
    Alertmanager,
    MissingPrerequisite,
    Prometheus,
    alertmanager_binary,
    prometheus_binary,
)
from oomguard.drill.webhook import WebhookReceiver
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app
from oomguard.simulate.checks import load_config
from oomguard.simulate.host import SimulatedHost
from tests.deploy.test_kubernetes import kustomize, one

HA = REPO / "deploy" / "kubernetes-sharded-ha"
SCALE = 30.0  # the probe-kill scenario's 15 simulated minutes in 30 s, as the drill runs it
SCENARIO = SCENARIOS["probe-kill"]


def prometheus_relabelings(service_monitor: dict[str, Any]) -> list[dict[str, Any]]:
    """The ServiceMonitor's relabelings as Prometheus' relabel_configs (what the operator writes)."""
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return [{names.get(k, k): v for k, v in r.items()} for r in service_monitor["spec"]["endpoints"][0]["relabelings"]]


@pytest.fixture(scope="module")
def binaries() -> None:
    try:
        prometheus_binary(), alertmanager_binary()
    except MissingPrerequisite as exc:
        pytest.fail(f"{exc} (make deps installs it)")


async def test_two_replicas_of_a_shard_make_one_notification_per_alert(tmp_path: Path, binaries: None) -> None:
    manifests = kustomize(HA)
    relabel = prometheus_relabelings(one(manifests, "ServiceMonitor", "oomguard"))
    alert_relabel = yaml.safe_load((HA / "alert-relabel.yaml").read_text())
    bundle_file = tmp_path / "bundle.yaml"
    bundle_file.write_text(yaml.safe_dump({"time_scale": SCALE, **SCENARIO.bundle}))
    rules = render(load_bundle_config(bundle_file))
    for name in (ALERTS_FILE, RECORDS_FILE):
        (tmp_path / name).write_text(rules[name])

    hosts, runners, targets, labels = [], [], [], []
    for replica in ("a", "b"):  # pods oomguard-a-0 and oomguard-b-0: shard 0's pair
        config = load_config(None, {
            "state_dir": str(tmp_path / replica / "state"),
            "simulation": {"scenario": SCENARIO.simulation, "time_scale": SCALE, "engine": SCENARIO.engine},
            "events": {"kernel_log": False},
        })  # fmt: skip
        host = SimulatedHost(config, log_path=tmp_path / replica / "engine.log", start_engine=False)
        runtime = Runtime(config, simulated=host)
        runner = web.AppRunner(make_app(runtime), access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        hosts.append(host)
        runners.append(runner)
        targets.append(f"127.0.0.1:{port}")
        labels.append({
            "__meta_kubernetes_namespace": "oomguard-cluster",
            "__meta_kubernetes_pod_name": f"oomguard-{replica}-0",
            "__meta_kubernetes_pod_label_oomguard_dev_replica": replica,
        })  # fmt: skip
    webhook = WebhookReceiver()
    hook_runner = web.AppRunner(webhook.app(), access_log=None)
    await hook_runner.setup()
    hook_port = free_port()
    await web.TCPSite(hook_runner, "127.0.0.1", hook_port).start()
    am = Alertmanager(tmp_path / "alertmanager", drill_alertmanager_config(DEFAULT_ALERTMANAGER_CONFIG, hook_port))
    prometheus = Prometheus(
        tmp_path / "prometheus", targets, rule_files=[tmp_path / ALERTS_FILE, tmp_path / RECORDS_FILE],
        alertmanager=am.address, target_labels=labels, relabel_configs=relabel, alert_relabel_configs=alert_relabel,
    )  # fmt: skip
    try:
        await asyncio.to_thread(am.start)
        await asyncio.to_thread(prometheus.start)
        for host in hosts:
            await host.engine.start()
        started = time.time()
        await asyncio.sleep(SCENARIO.minutes * 60 / SCALE + 3)  # the scenario, and the last notifications in flight

        # Prometheus: both exporters scraped under the shard's one instance, told apart by replica.
        up = prometheus.query('up{job="oomguard"}')
        assert sorted((s["metric"]["instance"], s["metric"]["replica"]) for s in up) == [
            ("oomguard-cluster/oomguard-0", "a"), ("oomguard-cluster/oomguard-0", "b"),
        ]  # fmt: skip
        # Each expected alert fired in Prometheus once per replica ...
        expected = {f"OomGuard{name}" for name in SCENARIO.expected}
        held = prometheus.query_range('count by (alertname) (ALERTS{alertstate="firing"})', started, time.time())
        twice = {s["metric"]["alertname"] for s in held if max(float(v) for _, v in s["values"]) == 2}
        assert expected <= twice, held
        # ... and reached Alertmanager's receivers as one alert: one label set, without `replica`.
        firing = [n for n in webhook.notifications if n.status == "firing"]
        by_name: dict[str, set[frozenset[tuple[str, str]]]] = {}
        for n in firing:
            by_name.setdefault(n.alertname, set()).add(frozenset(n.labels.items()))
        assert expected <= set(by_name), by_name
        for name, label_sets in by_name.items():
            assert len(label_sets) == 1, (name, label_sets)
            (only,) = label_sets
            assert "replica" not in dict(only) and dict(only)["instance"] == "oomguard-cluster/oomguard-0"
        # Neither replica's figures are summed into the other's: every recorded series is one replica's.
        recorded = 0
        for group in yaml.safe_load(rules[RECORDS_FILE])["groups"]:
            for rule in group["rules"]:
                for series in prometheus.query(rule["record"]):
                    recorded += 1
                    assert series["metric"].get("replica") in ("a", "b"), (rule["record"], series["metric"])
        assert recorded >= 2
    finally:
        prometheus.stop()
        am.stop()
        for host in hosts:
            with contextlib.suppress(Exception):
                await host.engine.stop()
        for runner in runners:
            await runner.cleanup()
        await hook_runner.cleanup()
