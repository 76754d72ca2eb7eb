"""deploy/kubernetes/tls/, the component for https with basic auth, without a cluster.

An overlay as docs/kubernetes.md writes it (the base, the component, the user's web-config.yml with a real
hash, the scrape Secret, and the kubernetes.io/tls Secret cert-manager would write) is built with kustomize
and validated as test_kubernetes.py validates the base. Then the Secrets are laid out as the kubelet mounts
the projected volume, oomguard serves under that web configuration, and a client does what Prometheus does
with the monitor's settings: the CA and the password from the Secrets it names, the certificate checked for
serverName while connecting to the pod's address.
"""

from __future__ import annotations

import base64
import copy
import datetime
import os
import secrets
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import bcrypt
import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from oomguard.exporter.config import ConfigError
from oomguard.exporter.config_loader import load_config
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app
from oomguard.exporter.web_config import WebConfigState, load_web_config
from oomguard.exporter.web_config.server import Server
from oomguard.simulate.fake_nvml import FakeGpu, FakeNvml
from tests.deploy.test_kubernetes import (
    BASE,
    EXAMPLES,
    K8S_VERSIONS,
    MONITORING,
    NAMESPACE,
    PODMONITOR,
    container,
    crd_validator,
    kustomize,
    one,
)

TLS = BASE / "tls"
WEB_CONFIG = EXAMPLES / "tls" / "secrets" / "web-config.yml"  # the example the user copies
SERVER_NAME = f"oomguard.{NAMESPACE}.svc"  # the headless Service's in-cluster name


def _certificates(folder: Path) -> dict[str, bytes]:
    """ca.crt, tls.crt and tls.key as cert-manager writes them for a CA issuer; the name only, no address."""
    now = datetime.datetime.now(datetime.UTC)

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    def certificate(subject: str, key: Any, issuer: x509.Certificate | None, signer: Any) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder().subject_name(name(subject))
            .issuer_name(issuer.subject if issuer else name(subject)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
        )  # fmt: skip
        if issuer is not None:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
            builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate("oomguard test CA", ca_key, None, ca_key)
    pem = serialization.Encoding.PEM
    files = {
        "ca.crt": ca.public_bytes(pem),
        "tls.crt": certificate(SERVER_NAME, server_key, ca, ca_key).public_bytes(pem),
        "tls.key": server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    }
    for file, content in files.items():
        (folder / file).write_bytes(content)
    return files


def _overlay(folder: Path, components: list[Path], password: str) -> None:
    """The user's overlay of docs/kubernetes.md (the web configuration and the scrape Secret), plus the TLS
    Secret that cert-manager would write."""
    shipped = yaml.safe_load(WEB_CONFIG.read_text())
    shipped["basic_auth_users"]["prometheus"] = bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()
    (folder / "web-config.yml").write_text(yaml.safe_dump(shipped))
    _certificates(folder)
    (folder / "username").write_text("prometheus")
    (folder / "password").write_text(password)
    fixed = {"disableNameSuffixHash": True}
    kustomization = {
        "resources": [os.path.relpath(BASE, folder)],
        "components": [os.path.relpath(c, folder) for c in components],
        "secretGenerator": [
            {"name": "oomguard-web-config", "namespace": NAMESPACE, "files": ["web-config.yml"], "options": fixed},
            {"name": "oomguard-scrape-auth", "namespace": NAMESPACE, "files": ["username", "password"],
             "options": fixed},
            {"name": "oomguard-tls", "namespace": NAMESPACE, "type": "kubernetes.io/tls",
             "files": ["tls.crt", "tls.key", "ca.crt"], "options": fixed},
        ],
    }  # fmt: skip
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))


PASSWORD = secrets.token_urlsafe(18)


@pytest.fixture(scope="module")
def tls_build(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    overlay = tmp_path_factory.mktemp("tls-overlay")
    _overlay(overlay, [TLS], PASSWORD)
    return kustomize(overlay)


@pytest.fixture(scope="module")
def tls_podmonitor_build(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    overlay = tmp_path_factory.mktemp("tls-podmonitor-overlay")
    _overlay(overlay, [PODMONITOR, TLS], PASSWORD)
    return kustomize(overlay)


def test_the_component_after_the_podmonitor_one(tmp_path: Path) -> None:
    """Listed before the podmonitor component, tls finds no PodMonitor yet: Prometheus would scrape plain http.
    Why docs/kubernetes.md says to list it last."""
    _overlay(tmp_path, [TLS, PODMONITOR], PASSWORD)
    assert "scheme" not in _endpoint(kustomize(tmp_path))


def _secret(objects: list[dict[str, Any]], name: str) -> dict[str, bytes]:
    secret = one(objects, "Secret", name)
    assert secret["metadata"]["namespace"] == NAMESPACE
    return {key: base64.b64decode(value) for key, value in secret["data"].items()}


def _endpoint(objects: list[dict[str, Any]]) -> dict[str, Any]:
    monitors = [o for o in objects if o["kind"] in ("ServiceMonitor", "PodMonitor")]
    assert len(monitors) == 1, [m["kind"] for m in monitors]
    spec = monitors[0]["spec"]
    (endpoint,) = spec.get("endpoints") or spec["podMetricsEndpoints"]
    return endpoint


@pytest.mark.parametrize("variant", ["tls_build", "tls_podmonitor_build"])
def test_the_tls_overlay_validates(variant: str, request: pytest.FixtureRequest) -> None:
    objects = request.getfixturevalue(variant)
    for obj in objects:
        if obj["apiVersion"] == MONITORING:
            errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                      for e in crd_validator(obj["kind"]).iter_errors(obj)]  # fmt: skip
            assert not errors, f"{obj['kind']}: {errors}"
        else:
            for version in K8S_VERSIONS:
                kubernetes_validate.validate(obj, version, strict=True)
    assert one(objects, "Secret", "oomguard-tls")["type"] == "kubernetes.io/tls"


def test_a_misspelt_tls_field_is_refused_by_the_crd(tls_build: list[dict[str, Any]]) -> None:
    """The schema check above can fail on exactly what the component adds."""
    monitor = copy.deepcopy(one(tls_build, "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["tlsConfig"]["servername"] = SERVER_NAME
    assert not crd_validator("ServiceMonitor").is_valid(monitor)
    monitor = copy.deepcopy(one(tls_build, "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["basicAuth"]["password"] = "inline"
    assert not crd_validator("ServiceMonitor").is_valid(monitor)


@pytest.mark.parametrize("variant", ["tls_build", "tls_podmonitor_build"])
def test_the_monitor_scrapes_https_with_the_secrets_of_the_build(variant: str, request: pytest.FixtureRequest) -> None:
    objects = request.getfixturevalue(variant)
    endpoint = _endpoint(objects)
    assert endpoint["scheme"] == "https" and endpoint["port"] == "metrics"
    tls = endpoint["tlsConfig"]
    assert tls["serverName"] == f"{one(objects, 'Service')['metadata']['name']}.{NAMESPACE}.svc" == SERVER_NAME
    assert "insecureSkipVerify" not in tls
    # Every Secret key the monitor names exists in the overlay's build, in the monitor's namespace.
    refs = [tls["ca"]["secret"], endpoint["basicAuth"]["username"], endpoint["basicAuth"]["password"]]
    for ref in refs:
        assert ref["key"] in _secret(objects, ref["name"]), ref


def test_daemonset_serves_under_the_web_configuration(tls_build: list[dict[str, Any]]) -> None:
    base = kustomize(BASE)
    before = container(one(base, "DaemonSet")["spec"]["template"]["spec"], "oomguard")
    spec = one(tls_build, "DaemonSet")["spec"]["template"]["spec"]
    exporter = container(spec, "oomguard")
    args = exporter["args"]
    assert args[: len(before["args"])] == before["args"]
    web_config = Path(args[args.index("--web.config.file") + 1])
    (mount,) = (m for m in exporter["volumeMounts"] if m["mountPath"] == str(web_config.parent))
    assert mount["readOnly"] is True
    assert not str(web_config).startswith("/etc/oomguard/"), "not inside the ConfigMap's read-only mount"
    (volume,) = (v for v in spec["volumes"] if v["name"] == mount["name"])
    projected = {
        item["path"]: (source["secret"]["name"], item["key"])
        for source in volume["projected"]["sources"]
        for item in source["secret"]["items"]
    }
    assert projected == {
        web_config.name: ("oomguard-web-config", "web-config.yml"),
        "tls.crt": ("oomguard-tls", "tls.crt"),
        "tls.key": ("oomguard-tls", "tls.key"),
    }
    assert volume["projected"]["defaultMode"] == 0o400
    # The file names the certificate and key by the paths the projection gives them.
    document = yaml.safe_load(_secret(tls_build, "oomguard-web-config")["web-config.yml"])
    server = document["tls_server_config"]
    assert {server["cert_file"], server["key_file"]} == {"tls.crt", "tls.key"}
    # The probes need no password; nothing else of the container changed.
    for probe in ("livenessProbe", "readinessProbe"):
        assert exporter[probe]["tcpSocket"] == {"port": "metrics"} and "httpGet" not in exporter[probe]
    unchanged = {
        k: v for k, v in before.items() if k not in ("args", "livenessProbe", "readinessProbe", "volumeMounts")
    }
    assert {k: exporter[k] for k in unchanged} == unchanged
    assert exporter["volumeMounts"][: len(before["volumeMounts"])] == before["volumeMounts"]


def test_the_shipped_placeholder_is_refused(tmp_path: Path) -> None:
    """The example copied without a hash: oomguard does not start, so it never serves with the placeholder."""
    _certificates(tmp_path)
    (tmp_path / "web-config.yml").write_text(WEB_CONFIG.read_text())
    with pytest.raises(ConfigError, match="not a bcrypt hash"):
        load_web_config(tmp_path / "web-config.yml")


async def test_prometheus_settings_reach_the_exporter(tls_build: list[dict[str, Any]], tmp_path: Path) -> None:
    """The projected volume laid out from the build's Secrets; oomguard serves under it; a client with what the
    monitor names (the CA, serverName, the scrape Secret) is let in, and one without the password gets the 401
    that an httpGet probe would get."""
    volume = tmp_path / "etc-oomguard-web"
    volume.mkdir()
    (volume / "web-config.yml").write_bytes(_secret(tls_build, "oomguard-web-config")["web-config.yml"])
    for key in ("tls.crt", "tls.key"):
        (volume / key).write_bytes(_secret(tls_build, "oomguard-tls")[key])
    endpoint = _endpoint(tls_build)
    ca = _secret(tls_build, endpoint["tlsConfig"]["ca"]["secret"]["name"])["ca.crt"]
    auth = endpoint["basicAuth"]
    username = _secret(tls_build, auth["username"]["name"])[auth["username"]["key"]].decode()
    password = _secret(tls_build, auth["password"]["name"])[auth["password"]["key"]].decode()

    state = WebConfigState(load_web_config(volume / "web-config.yml"))
    config = load_config(None, {
        "events": {"kernel_log": False, "xid": False}, "trend": {"enabled": False},
        "discovery": {"local": "off"},  # no engine: not one another test runs on this host
    })  # fmt: skip
    server = Server(make_app(Runtime(config, nvml_lib=FakeNvml([FakeGpu(0)])), state), "127.0.0.1", 0, state)
    await server.start()
    context = ssl.create_default_context(cadata=ca.decode())
    try:

        async def get(path: str, credentials: tuple[str, str] | None) -> int:
            headers = None
            if credentials is not None:
                headers = {"Authorization": "Basic " + base64.b64encode(":".join(credentials).encode()).decode()}
            async with (
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session,
                session.get(f"https://127.0.0.1:{server.port}{path}", ssl=context, headers=headers,
                            server_hostname=endpoint["tlsConfig"]["serverName"]) as response,
            ):  # fmt: skip
                return response.status

        assert await get("/metrics", (username, password)) == 200
        assert await get("/metrics", (username, "not-" + password)) == 401
        assert await get("/-/healthy", None) == 401, "why the probes are tcpSocket"
        # The certificate holds the Service's name, not the address: without serverName it is refused.
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            async with aiohttp.ClientSession() as session:
                await session.get(f"https://127.0.0.1:{server.port}/metrics", ssl=context)
    finally:
        await server.stop()
