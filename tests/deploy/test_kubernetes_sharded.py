"""deploy/kubernetes-sharded/ and deploy/kubernetes-sharded-ha/ (the cluster mode split over StatefulSets) without
a cluster: kustomize builds them, every object validates, each pod meets the `restricted` profile, each replica's
configuration makes it the shard of its ordinal, and the ServiceMonitor names a shard's series after it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import REPO

from oomguard.exporter.config_loader import load_config
from tests.deploy.test_kubernetes import container, kinds, kustomize, one, validate
from tests.deploy.test_kubernetes_cluster import restricted_violations

SHARDED = REPO / "deploy" / "kubernetes-sharded"
HA = REPO / "deploy" / "kubernetes-sharded-ha"


@pytest.fixture(scope="module", params=["sharded", "ha"])
def layout(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, kustomize(SHARDED if request.param == "sharded" else HA)


def statefulsets(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == "StatefulSet"]


def test_every_object_validates_and_the_single_exporter_is_gone(layout: tuple[str, list[dict[str, Any]]]) -> None:
    name, objects = layout
    validate(objects)
    assert "Deployment" not in kinds(objects) and "PersistentVolumeClaim" not in kinds(objects)
    names = [s["metadata"]["name"] for s in statefulsets(objects)]
    assert names == (["oomguard"] if name == "sharded" else ["oomguard-a", "oomguard-b"])


def test_each_replica_is_the_shard_of_its_ordinal_with_a_state_volume_of_its_own(
    layout: tuple[str, list[dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, objects = layout
    for statefulset in statefulsets(objects):
        spec = statefulset["spec"]
        pod = spec["template"]["spec"]
        assert restricted_violations(pod) == []
        env = {e["name"]: e for e in container(pod, "oomguard")["env"]}
        shards = int(env["OOMGUARD_KUBERNETES_SHARDS"]["value"])
        assert shards == spec["replicas"] == 4
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        claim = spec["volumeClaimTemplates"][0]
        mounts = {m["name"]: m["mountPath"] for m in container(pod, "oomguard")["volumeMounts"]}
        assert claim["metadata"]["name"] in mounts and claim["spec"]["accessModes"] == ["ReadWriteOnce"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        path = tmp_path / "oomguard.yaml"
        path.write_text(one(objects, "ConfigMap", volumes["config"]["configMap"]["name"])["data"]["oomguard.yaml"])
        assert yaml.safe_load(path.read_text())["state_dir"] == mounts[claim["metadata"]["name"]]
        monkeypatch.setenv("OOMGUARD_KUBERNETES_SHARDS", str(shards))
        for ordinal in range(spec["replicas"]):
            monkeypatch.setenv("POD_NAME", f"{statefulset['metadata']['name']}-{ordinal}")
            config = load_config(path, {"kubernetes.shards": shards})  # as `serve` applies the variable
            assert config.kubernetes is not None and config.kubernetes.shard == ordinal


def test_a_shards_series_are_named_after_its_ordinal_whichever_replica(
    layout: tuple[str, list[dict[str, Any]]],
) -> None:
    """The relabelling as Prometheus applies it (an anchored RE2 expression; Python's re reads this one alike)."""
    _, objects = layout
    relabel = one(objects, "ServiceMonitor", "oomguard")["spec"]["endpoints"][0]["relabelings"][0]
    regex = re.compile(relabel["regex"])
    replacement = relabel["replacement"].replace("$", "\\")
    for statefulset in statefulsets(objects):
        for ordinal in (0, 3):
            source = f"oomguard-cluster{relabel['separator']}{statefulset['metadata']['name']}-{ordinal}"
            match = regex.fullmatch(source)
            assert match is not None and match.expand(replacement) == f"oomguard-cluster/oomguard-{ordinal}"


def test_the_ha_pairs_pods_carry_their_replica(layout: tuple[str, list[dict[str, Any]]]) -> None:
    name, objects = layout
    replicas = [s["spec"]["template"]["metadata"]["labels"].get("oomguard.dev/replica") for s in statefulsets(objects)]
    assert replicas == ([None] if name == "sharded" else ["a", "b"])
    selectors = [s["spec"]["selector"]["matchLabels"] for s in statefulsets(objects)]
    assert len({tuple(sorted(s.items())) for s in selectors}) == len(selectors)  # no two claim the same pods


def test_the_shards_hand_over_through_one_configmap_the_only_object_they_may_write(
    layout: tuple[str, list[dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node that changes shard takes its log positions along through the ConfigMap the exporters name
    (kubernetes.handover), in their own namespace: get and patch on that one object is the only write granted."""
    _, objects = layout
    statefulset = statefulsets(objects)[0]
    namespace = statefulset["metadata"]["namespace"]
    configmap = one(objects, "ConfigMap", "oomguard-shards")
    assert (
        configmap["metadata"]["namespace"] == namespace
        and not configmap.get("data")
        and not configmap.get("binaryData")
    )  # shipped empty: the exporters fill it, and a new apply leaves what they wrote
    writes = [(o["metadata"]["name"], r) for o in objects if o["kind"] in ("Role", "ClusterRole") for r in o["rules"]
              if set(r["verbs"]) - {"get", "list", "watch"}]  # fmt: skip
    assert writes == [
        ("oomguard-shards", {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["oomguard-shards"],
                             "verbs": ["get", "patch"]}),
    ]  # fmt: skip
    assert one(objects, "Role", "oomguard-shards")["metadata"]["namespace"] == namespace
    binding = one(objects, "RoleBinding", "oomguard-shards")
    assert binding["metadata"]["namespace"] == namespace and binding["subjects"] == [
        {"kind": "ServiceAccount", "name": statefulset["spec"]["template"]["spec"]["serviceAccountName"],
         "namespace": namespace}
    ]  # fmt: skip
    pod = statefulset["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    path = tmp_path / "oomguard.yaml"
    path.write_text(one(objects, "ConfigMap", volumes["config"]["configMap"]["name"])["data"]["oomguard.yaml"])
    monkeypatch.setenv("POD_NAME", f"{statefulset['metadata']['name']}-1")
    config = load_config(path, {"kubernetes.shards": 4})
    assert config.kubernetes is not None and config.kubernetes.handover == configmap["metadata"]["name"]
