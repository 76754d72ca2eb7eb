"""deploy/kubernetes-cluster/ (the cluster mode) without a cluster: kustomize builds it, every object validates
against its schema, the pod meets the `restricted` Pod Security Standard, its RBAC only reads, and its
configuration is the cluster mode's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support import REPO

from oomguard.bundle.bundle_config import load_bundle_config
from oomguard.bundle.generate import (
    KUBERNETES_CLUSTER_DIR,
    KUBERNETES_PROMETHEUS_RULE_FILE,
    PROMETHEUS_RULE_FILE,
    render,
)
from oomguard.exporter.config_loader import load_config
from tests.deploy.test_kubernetes import BASE, container, kinds, kustomize, one, validate

CLUSTER = REPO / KUBERNETES_CLUSTER_DIR
# The volume types the restricted profile allows (Pod Security Standards, "Restricted": Volume Types).
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> list[dict[str, Any]]:
    return kustomize(CLUSTER)


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What in a pod spec the `restricted` Pod Security Standard (as Pod Security Admission enforces it) refuses."""
    out = []
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            out.append(f"{field} is true")
    for volume in pod.get("volumes") or []:
        kind = next(k for k in volume if k != "name")
        if kind not in RESTRICTED_VOLUMES:
            out.append(f"volume {volume['name']} is a {kind}")
    pod_context = pod.get("securityContext") or {}
    for c in [*(pod.get("initContainers") or []), *pod["containers"]]:
        context = c.get("securityContext") or {}
        name = c["name"]
        if context.get("privileged"):
            out.append(f"{name} is privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name} does not set allowPrivilegeEscalation: false")
        caps = context.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name} does not drop ALL capabilities")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{name} adds capabilities {caps['add']}")
        if not context.get("runAsNonRoot", pod_context.get("runAsNonRoot")):
            out.append(f"{name} does not set runAsNonRoot")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            out.append(f"{name} runs as uid 0")
        seccomp = (context.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name} has no RuntimeDefault or Localhost seccomp profile")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f"{name} takes a host port")
    return out


def test_every_object_validates(cluster: list[dict[str, Any]]) -> None:
    validate(cluster)
    assert sorted(set(kinds(cluster))) == sorted(
        {"Namespace", "ServiceAccount", "Role", "RoleBinding", "PersistentVolumeClaim", "Deployment",
         "Service", "ServiceMonitor", "PrometheusRule", "ConfigMap"}
    )  # fmt: skip


def test_the_deployment_meets_the_restricted_profile_and_the_daemonset_does_not(
    cluster: list[dict[str, Any]],
) -> None:
    namespace = one(cluster, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    deployment = one(cluster, "Deployment", "oomguard")
    assert restricted_violations(deployment["spec"]["template"]["spec"]) == []
    # The check can fail: the node agent, with its host PID namespace, host paths and uid 0, fails it.
    daemonset = one(kustomize(BASE), "DaemonSet", "oomguard")
    violations = restricted_violations(daemonset["spec"]["template"]["spec"])
    assert "hostPID is true" in violations and "volume pod-logs is a hostPath" in violations
    assert "oomguard runs as uid 0" in violations


def test_one_replica_replaced_by_recreate_with_its_state_on_a_volume(cluster: list[dict[str, Any]]) -> None:
    deployment = one(cluster, "Deployment", "oomguard")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    pod = deployment["spec"]["template"]["spec"]
    claim = one(cluster, "PersistentVolumeClaim", "oomguard-state")
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["state"]["persistentVolumeClaim"]["claimName"] == "oomguard-state"
    mounts = {m["name"]: m["mountPath"] for m in container(pod, "oomguard")["volumeMounts"]}
    config_map = one(cluster, "ConfigMap", volumes["config"]["configMap"]["name"])
    config = yaml.safe_load(config_map["data"]["oomguard.yaml"])
    assert config["state_dir"] == mounts["state"]
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]  # the volume writable by it


def test_rbac_only_reads_pods_their_logs_and_events_in_the_namespaces_configured(
    cluster: list[dict[str, Any]], tmp_path: Path
) -> None:
    """Nothing cluster-wide: the engines' namespaces (kubernetes.namespaces) grant their pods, logs and Events, the
    GPU Operator's (dcgm.namespaces) its pods; the configuration watches exactly where it may read."""
    assert not [o for o in cluster if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    granted: dict[str, set[tuple[str, str]]] = {}
    roles = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in cluster if o["kind"] == "Role"}
    home = one(cluster, "Namespace")["metadata"]["name"]
    for binding in (o for o in cluster if o["kind"] == "RoleBinding"):
        namespace = binding["metadata"]["namespace"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "oomguard", "namespace": home}]
        role = roles[(namespace, binding["roleRef"]["name"])]
        granted.setdefault(namespace, set()).update(
            (resource, verb) for rule in role["rules"] for resource in rule["resources"] for verb in rule["verbs"]
        )
    reads = {("pods", "get"), ("pods", "list"), ("pods", "watch")}
    engines = reads | {("events", "get"), ("events", "list"), ("events", "watch"), ("pods/log", "get")}
    config = _config(cluster, tmp_path)
    assert config.kubernetes is not None and config.dcgm is not None
    assert config.kubernetes.namespaces and config.dcgm.namespaces == ("gpu-operator",)
    assert granted == {
        **{namespace: engines for namespace in config.kubernetes.namespaces},
        **{namespace: reads for namespace in config.dcgm.namespaces},
    }


def _config(cluster: list[dict[str, Any]], tmp_path: Path) -> Any:
    deployment = one(cluster, "Deployment", "oomguard")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    path = tmp_path / "oomguard.yaml"
    path.write_text(one(cluster, "ConfigMap", volumes["config"]["configMap"]["name"])["data"]["oomguard.yaml"])
    return load_config(path)


def test_the_configuration_is_the_cluster_modes(cluster: list[dict[str, Any]], tmp_path: Path) -> None:
    deployment = one(cluster, "Deployment", "oomguard")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    data = one(cluster, "ConfigMap", volumes["config"]["configMap"]["name"])["data"]["oomguard.yaml"]
    path = tmp_path / "oomguard.yaml"
    path.write_text(data)
    config = load_config(path)  # no NODE_NAME needed: the cluster mode has no node of its own
    assert config.kubernetes is not None and config.kubernetes.scope == "cluster"
    assert config.dcgm is not None and config.dcgm.discover
    assert not config.events.kernel_log and not config.events.xid
    port = container(deployment["spec"]["template"]["spec"], "oomguard")["ports"][0]["containerPort"]
    assert config.web.listen_address.endswith(f":{port}")


def test_the_same_rules_and_dashboards_as_the_node_agent(cluster: list[dict[str, Any]]) -> None:
    assert (CLUSTER / KUBERNETES_PROMETHEUS_RULE_FILE).read_text() == render(load_bundle_config())[PROMETHEUS_RULE_FILE]
    assert (CLUSTER / KUBERNETES_PROMETHEUS_RULE_FILE).read_text() == (
        BASE / KUBERNETES_PROMETHEUS_RULE_FILE
    ).read_text()
    for board in (BASE / "dashboards").glob("*.json"):
        assert (CLUSTER / "dashboards" / board.name).read_text() == board.read_text()
    monitor = one(cluster, "ServiceMonitor")
    service = one(cluster, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service["metadata"]["name"] == "oomguard"  # the bundle's job="oomguard"
