"""deploy/alertmanager/alertmanager.yml: it validates, routes every alert of the bundle by severity, and its
inhibitions silence exactly the twins they should on a real Alertmanager (amtool cannot test inhibition)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from support import REPO

from oomguard.common.ports import free_port

CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
ALERTS = REPO / "rules" / "oomguard-alerts.yaml"
RECEIVER_BY_SEVERITY = {"critical": "pager", "warning": "ticket", "info": "null"}
INSTALL = "install Debian's package: `apt-get install prometheus-alertmanager` (or run `make test`)"
MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"(.*)"\s*$')


def bundle_alerts() -> list[dict]:
    return [
        rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"] if "alert" in rule
    ]


def example_labels(alert: dict) -> dict[str, str]:
    """Labels the alert carries when it fires: its own, plus those its description refers to."""
    labels = {"alertname": alert["alert"], "job": "oomguard", "instance": "gpu-node-1:9847", **alert["labels"]}
    description = alert["annotations"]["description"]
    examples = (("gpu", "0"), ("basis", "headroom"), ("target", "llama-70b"), ("kind", "cuda_oom"), ("source", "nvml"))
    for name, example in examples:
        if f"$labels.{name}" in description:
            labels[name] = example
    return labels


@pytest.fixture(scope="module")
def amtool() -> str:
    path = shutil.which("amtool")
    if path is None:
        pytest.fail(f"amtool not found: {INSTALL}")
    return path


def routes_test(amtool: str, receiver: str, labels: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # Each label is its own argument; amtool exits 1 when the resolved receivers differ.
    args = [f"{name}={value}" for name, value in labels.items()]
    return subprocess.run(
        [amtool, "config", "routes", "test", f"--config.file={CONFIG}", f"--verify.receivers={receiver}", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_check_config(amtool: str) -> None:
    result = subprocess.run([amtool, "check-config", str(CONFIG)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_bundle_uses_only_routed_severities() -> None:
    severities = {alert["labels"]["severity"] for alert in bundle_alerts()}
    assert severities <= set(RECEIVER_BY_SEVERITY), severities - set(RECEIVER_BY_SEVERITY)


@pytest.mark.parametrize("alert", bundle_alerts(), ids=lambda alert: alert["alert"])
def test_every_bundle_alert_reaches_the_receiver_of_its_severity(amtool: str, alert: dict) -> None:
    labels = example_labels(alert)
    receiver = RECEIVER_BY_SEVERITY[labels["severity"]]
    result = routes_test(amtool, receiver, labels)
    assert result.returncode == 0, f"{labels} should go to {receiver}, amtool resolved: {result.stdout.strip()}"
    assert result.stdout.strip().splitlines()[0] == receiver


@pytest.mark.parametrize(
    ("receiver", "labels"),
    [
        ("pager", {"alertname": "OomGuardGpuMemoryCritical", "severity": "critical", "instance": "a:9847", "gpu": "3"}),
        ("pager", {"alertname": "OomGuardOomEvent", "severity": "critical", "target": "qwen-7b", "kind": "cuda_oom"}),
        ("ticket", {"alertname": "OomGuardGpuMemoryHigh", "severity": "warning", "instance": "a:9847", "gpu": "3"}),
        ("null", {"alertname": "OomGuardLowHeadroomConfig", "severity": "info", "target": "llama-70b"}),
        # An oomguard alert whose severity was lost or mistyped still reaches a human.
        ("ticket", {"alertname": "OomGuardGpuMemoryHigh", "instance": "a:9847"}),
        ("ticket", {"alertname": "OomGuardGpuMemoryHigh", "severity": "page", "instance": "a:9847"}),
        # Other alerts, whatever their severity, are not oomguard's to route.
        ("default", {"alertname": "NodeFilesystemSpaceFillingUp", "severity": "critical", "instance": "a:9100"}),
        ("default", {"alertname": "KubePodCrashLooping", "severity": "warning", "namespace": "inference"}),
        ("default", {"alertname": "Watchdog", "severity": "none"}),
    ],
)
def test_routes(amtool: str, receiver: str, labels: dict[str, str]) -> None:
    result = routes_test(amtool, receiver, labels)
    assert result.returncode == 0, f"{labels} should go to {receiver}, amtool resolved: {result.stdout.strip()}"


def test_routes_test_fails_on_a_wrong_receiver(amtool: str) -> None:
    # The cases above prove something only if amtool really fails on a mismatch.
    labels = {"alertname": "OomGuardGpuMemoryHigh", "severity": "warning", "instance": "a:9847", "gpu": "0"}
    assert routes_test(amtool, "pager", labels).returncode == 1


def parse_matcher(text: str) -> tuple[str, str, str]:
    found = MATCHER.match(text)
    assert found, f"cannot read matcher {text!r}"
    return found.group(1), found.group(2), found.group(3)


def test_inhibitions_guard_against_missing_equal_labels() -> None:
    """Labels absent from both alerts count as equal: every source must require its `equal` labels to be set,
    and must name alerts of the bundle (a renamed alert would silently disable the rule)."""
    config = yaml.safe_load(CONFIG.read_text())
    names = {alert["alert"] for alert in bundle_alerts()}
    assert config["inhibit_rules"]
    for rule in config["inhibit_rules"]:
        assert "source_match" not in rule and "target_match" not in rule, "use source_matchers/target_matchers"
        source = [parse_matcher(m) for m in rule["source_matchers"]]
        target = [parse_matcher(m) for m in rule["target_matchers"]]
        assert rule["equal"], rule
        assert rule["equal"][0] == "cluster", f"{rule}: a page in one cluster must not silence another's"
        # cluster may be absent from both (a single Prometheus), and a GPU's node (outside Kubernetes): that is
        # equal, the others required still tell the alerts apart. A rule of a node's own alerts requires its node.
        for label in rule["equal"][1:]:
            if label == "node" and (label, "=~", ".+") not in source:
                assert "gpu" in rule["equal"], f"{rule}: node tells GPUs apart, with gpu"
                continue
            assert (label, "=~", ".+") in source, f'{rule}: source must require {label}=~".+"'
        for name, op, value in source + target:
            if name == "alertname" and op in ("=", "=~") and value != "OomGuard.+":
                for alternative in value.split("|"):
                    assert alternative in names, f"{rule}: {alternative} is not an alert of the bundle"


# ----- inhibition on a real Alertmanager -----


def http(url: str, body: object | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        payload = response.read()
    return json.loads(payload) if payload.strip() else None


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        pytest.fail(f"neither prometheus-alertmanager nor alertmanager found: {INSTALL}")
    port = free_port()
    log = (tmp_path / "alertmanager.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={CONFIG}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # empty: no gossip, no peers
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                pytest.fail(
                    f"alertmanager exited with {process.returncode}:\n{(tmp_path / 'alertmanager.log').read_text()}"
                )
            try:
                urllib.request.urlopen(f"{base}/-/ready", timeout=1).close()
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    pytest.fail(f"alertmanager not ready in 30s:\n{(tmp_path / 'alertmanager.log').read_text()}")
                time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def firing(labels: dict[str, str]) -> dict:
    now = datetime.now(UTC)
    return {
        "labels": {"job": "oomguard", **labels},
        "annotations": {"summary": "Posted by tests/bundle/test_alertmanager.py."},
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(hours=1)).isoformat(),
    }


# key -> labels; instances keep the scenarios apart (an ExporterDown silences its whole instance).
POSTED = {
    "critical-gpu0": {
        "alertname": "OomGuardGpuMemoryCritical",
        "severity": "critical",
        "instance": "n1:9847",
        "gpu": "0",
        "basis": "headroom",
    },
    "high-gpu0": {
        "alertname": "OomGuardGpuMemoryHigh",
        "severity": "warning",
        "instance": "n1:9847",
        "gpu": "0",
        "basis": "headroom",
    },
    "high-gpu1": {
        "alertname": "OomGuardGpuMemoryHigh",
        "severity": "warning",
        "instance": "n1:9847",
        "gpu": "1",
        "basis": "headroom",
    },
    # The twins judged on different bases (the reservation vanished between them): still one GPU, one page.
    "critical-total-gpu0": {
        "alertname": "OomGuardGpuMemoryCritical",
        "severity": "critical",
        "instance": "n7:9847",
        "gpu": "0",
        "basis": "total",
    },
    "high-headroom-gpu0": {
        "alertname": "OomGuardGpuMemoryHigh",
        "severity": "warning",
        "instance": "n7:9847",
        "gpu": "0",
        "basis": "headroom",
    },
    "high-gpu0-other-host": {
        "alertname": "OomGuardGpuMemoryHigh",
        "severity": "warning",
        "instance": "n2:9847",
        "gpu": "0",
    },
    "storm-llama": {
        "alertname": "OomGuardRestartStorm",
        "severity": "critical",
        "instance": "n3:9847",
        "target": "llama",
    },
    "no-oom-llama": {
        "alertname": "OomGuardRestartsWithoutOom",
        "severity": "warning",
        "instance": "n3:9847",
        "target": "llama",
    },
    "no-oom-qwen": {
        "alertname": "OomGuardRestartsWithoutOom",
        "severity": "warning",
        "instance": "n3:9847",
        "target": "qwen",
    },
    "slow-start-llama": {
        "alertname": "OomGuardStartupSlowerThanProbe",
        "severity": "warning",
        "instance": "n3:9847",
        "target": "llama",
    },
    "oom-qwen": {
        "alertname": "OomGuardOomEvent",
        "severity": "critical",
        "instance": "n4:9847",
        "target": "qwen",
        "kind": "cuda_oom",
    },
    "down-qwen": {"alertname": "OomGuardTargetDown", "severity": "warning", "instance": "n4:9847", "target": "qwen"},
    "down-llama": {"alertname": "OomGuardTargetDown", "severity": "warning", "instance": "n4:9847", "target": "llama"},
    "exporter-down": {"alertname": "OomGuardExporterDown", "severity": "critical", "instance": "n5:9847"},
    "high-under-dead-exporter": {
        "alertname": "OomGuardGpuMemoryHigh",
        "severity": "warning",
        "instance": "n5:9847",
        "gpu": "0",
    },
    "node-alert-same-host": {"alertname": "NodeMemoryHighUtilization", "severity": "warning", "instance": "n5:9847"},
    # The `equal` caveat: neither alert has `gpu`. Were "both missing" taken as equal, the warning would be silenced.
    "critical-no-gpu": {"alertname": "OomGuardGpuMemoryCritical", "severity": "critical", "instance": "n6:9847"},
    "high-no-gpu": {"alertname": "OomGuardGpuMemoryHigh", "severity": "warning", "instance": "n6:9847"},
    # Two clusters behind one Alertmanager, the same node name in both: a page in cluster a silences a's ticket,
    # never b's.
    "critical-cluster-a": {
        "alertname": "OomGuardGpuMemoryCritical", "severity": "critical", "cluster": "a", "instance": "n8:9847",
        "gpu": "0",
    },
    "high-cluster-a": {
        "alertname": "OomGuardGpuMemoryHigh", "severity": "warning", "cluster": "a", "instance": "n8:9847",
        "gpu": "0",
    },
    "high-cluster-b": {
        "alertname": "OomGuardGpuMemoryHigh", "severity": "warning", "cluster": "b", "instance": "n8:9847",
        "gpu": "0",
    },
    # Two dcgm-exporters claim node gpu-b: the page silences the refusal of the second (the same news) on that node
    # only; a pod refused for its owner there, and a conflict on another node, still reach the ticket queue.
    "dcgm-conflict-b": {
        "alertname": "OomGuardDcgmNodeConflict", "severity": "critical", "instance": "n9:9847", "node": "gpu-b",
    },
    "dcgm-refused-conflict-b": {
        "alertname": "OomGuardDcgmPodRefused", "severity": "warning", "instance": "n9:9847", "node": "gpu-b",
        "reason": "conflict",
    },
    "dcgm-refused-owner-b": {
        "alertname": "OomGuardDcgmPodRefused", "severity": "warning", "instance": "n9:9847", "node": "gpu-b",
        "reason": "owner",
    },
    "dcgm-refused-conflict-c": {
        "alertname": "OomGuardDcgmPodRefused", "severity": "warning", "instance": "n9:9847", "node": "gpu-c",
        "reason": "conflict",
    },
}  # fmt: skip
SUPPRESSED_BY = {
    "high-gpu0": "critical-gpu0",
    "high-headroom-gpu0": "critical-total-gpu0",
    "no-oom-llama": "storm-llama",
    "down-qwen": "oom-qwen",
    "high-under-dead-exporter": "exporter-down",
    "high-cluster-a": "critical-cluster-a",
    "dcgm-refused-conflict-b": "dcgm-conflict-b",
}


def test_inhibition_on_a_real_alertmanager(alertmanager: str) -> None:
    http(f"{alertmanager}/api/v2/alerts", [firing(labels) for labels in POSTED.values()])

    def key_of(alert: dict) -> str:
        labels = {k: v for k, v in alert["labels"].items() if k != "job"}
        return next(key for key, posted in POSTED.items() if posted == labels)

    # The inhibitor sees new alerts asynchronously: poll until every alert is there and settled.
    deadline = time.monotonic() + 20
    while True:
        alerts = {key_of(alert): alert for alert in http(f"{alertmanager}/api/v2/alerts")}
        states = {key: alert["status"]["state"] for key, alert in alerts.items()}
        expected = {key: "suppressed" if key in SUPPRESSED_BY else "active" for key in POSTED}
        if states == expected or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    wrong = {
        key: f"{states.get(key, 'missing')}, expected {state}"
        for key, state in expected.items()
        if states.get(key) != state
    }
    assert not wrong, f"inhibition differs from the expected: {wrong}\n{json.dumps(alerts, indent=1)}"

    for key, source in SUPPRESSED_BY.items():
        assert alerts[key]["status"]["inhibitedBy"] == [alerts[source]["fingerprint"]], (key, alerts[key]["status"])
        assert alerts[key]["status"]["silencedBy"] == []
    for key in POSTED.keys() - SUPPRESSED_BY.keys():
        assert alerts[key]["status"]["inhibitedBy"] == [], (key, alerts[key]["status"])
