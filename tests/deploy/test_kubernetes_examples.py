"""deploy/kubernetes-examples/: the overlays that build the base with its components (the PodMonitor, https,
both), each built and validated as the base is; and every kubectl command that the manifests' comments and the
docs give for a folder of this repository builds something when pasted (a component alone builds nothing)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from support import REPO

from tests.deploy.test_kubernetes import BASE, EXAMPLES, NAMESPACE, kustomize, one, validate

# Each example: the monitor it scrapes with, and whether over https.
EXPECTED = {
    "podmonitor": ("PodMonitor", False),
    "tls": ("ServiceMonitor", True),
    "podmonitor-tls": ("PodMonitor", True),
}
# The one Secret the examples leave to cert-manager (docs/kubernetes.md, "TLS and basic auth").
CERT_MANAGERS = "oomguard-tls"
_COMMAND = re.compile(r"kubectl (?:kustomize|(?:apply|delete|diff) -k) (deploy/[\w./-]*\w)")


def test_every_example_is_checked() -> None:
    overlays = {p.parent.name for p in EXAMPLES.glob("*/kustomization.yaml")}
    assert overlays == set(EXPECTED)


@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_the_example_builds_and_validates(example: str) -> None:
    objects = kustomize(EXAMPLES / example)
    validate(objects)
    kind, https = EXPECTED[example]
    monitors = [o for o in objects if o["kind"] in ("ServiceMonitor", "PodMonitor")]
    assert [m["kind"] for m in monitors] == [kind], "one monitor: with both, every pod is scraped twice"
    spec = monitors[0]["spec"]
    (endpoint,) = spec.get("endpoints") or spec["podMetricsEndpoints"]
    assert endpoint.get("scheme", "http") == ("https" if https else "http")
    # Every Secret the build names is in it, in the namespace oomguard, but the one cert-manager writes.
    secrets = {o["metadata"]["name"] for o in objects if o["kind"] == "Secret"}
    named = set(re.findall(r"'(?:secretName|name)': '(oomguard-[\w-]+)'", str(monitors[0])))
    daemonset = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    named |= {s["secret"]["name"] for v in daemonset["volumes"] for s in v.get("projected", {}).get("sources", [])}
    assert bool(named) == https
    assert named - {CERT_MANAGERS} == secrets
    for obj in objects:
        if obj["kind"] == "Secret":
            assert obj["metadata"]["namespace"] == NAMESPACE


def _commands() -> dict[str, set[str]]:
    """kubectl commands on a folder of this repository, in the manifests' comments and the docs a user reads."""
    files = [*BASE.rglob("*.yaml"), *EXAMPLES.rglob("*.yaml"), REPO / "docs" / "kubernetes.md", REPO / "README.md"]
    found: dict[str, set[str]] = {}
    for path in files:
        for folder in _COMMAND.findall(path.read_text()):
            found.setdefault(folder, set()).add(str(path.relative_to(REPO)))
    return found


def test_the_commands_given_build_when_pasted() -> None:
    commands = _commands()
    assert {"deploy/kubernetes", "deploy/kubernetes-examples/podmonitor"} <= set(commands)
    for folder, where in sorted(commands.items()):
        objects: list[dict[str, Any]] = kustomize(REPO / folder)
        assert objects, f"kubectl kustomize {folder} (given in {sorted(where)}) builds nothing"


def test_a_component_alone_builds_nothing() -> None:
    """Why the check above can fail: the components, pasted as folders to apply, build nothing or fail."""
    assert kustomize(BASE / "tls") == []
    with pytest.raises(AssertionError, match="no resource matches strategic merge patch"):
        kustomize(Path(BASE / "podmonitor"))
