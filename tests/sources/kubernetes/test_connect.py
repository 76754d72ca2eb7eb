"""Finding the API: the pod's service account over TLS (its token re-read as the kubelet rotates it), and
what a kubeconfig may say."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from oomguard.exporter.sources.kubernetes import api
from oomguard.exporter.sources.kubernetes.api import ApiError, connect, from_kubeconfig
from oomguard.simulate import kubernetes_objects as objects
from oomguard.simulate.kubernetes_api import StandIn
from tests.sources.kubernetes.k8s_harness import Cluster, Server, free_port, wait_for


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A server certificate for 127.0.0.1 that is its own CA (as a cluster's CA signs the API's)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    crt, pem = folder / "ca.crt", folder / "server.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return crt, pem


async def test_in_a_pod_the_service_account_over_tls_with_its_rotated_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    crt, key = _self_signed(account)
    (account / "token").write_text("token-1\n")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(crt, key)
    port = free_port()
    monkeypatch.setattr(api, "SERVICE_ACCOUNT", account)
    monkeypatch.setattr(api, "TOKEN_REREAD_SECONDS", 0.0)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(port))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    k8s = Cluster(tmp_path, kubeconfig="")
    k8s.server = Server(k8s.api.app(), "127.0.0.1", port, tls)
    async with k8s:
        await k8s.api.put("pods", objects.pod("vllm-0", "127.0.0.2", 8000))
        await wait_for(lambda: k8s.targets() == ["llm/vllm-0"], "the pod, through the service account")
        assert set(k8s.api.authorizations) == {"Bearer token-1"}
        (account / "token").write_text("token-2\n")  # the kubelet rotates it
        await k8s.api.error_410("pods")  # a relist: a new request
        await wait_for(lambda: "Bearer token-2" in k8s.api.authorizations, "the new token in use")


def test_a_kubeconfig_token_file_and_insecure_cluster(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("abc\n")
    path = tmp_path / "config"
    path.write_text(
        "current-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://10.0.0.1:6443/', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {tokenFile: token}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    connection = from_kubeconfig(path)
    assert (connection.server, connection.ssl) == ("https://10.0.0.1:6443", False)
    assert connection.authorization() == "abc"


def test_a_kubeconfig_with_an_exec_plugin_is_refused_naming_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(
        "current-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://10.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {exec: {command: aws, apiVersion: client.authentication.k8s.io/v1}}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    with pytest.raises(ApiError, match="exec and auth-provider credentials are not supported; use a token"):
        connect(str(path))


def test_nowhere_to_connect_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ApiError, match="no kubeconfig"):
        connect("")


async def test_a_410_reaches_a_watch_opened_after_it(aiohttp_client) -> None:
    """The stand-in's compaction, as the API's: a client that listed before it and watches after it is told 410
    (the token test once waited 10 s for a relist that never came: its watch opened just after the ERROR event)."""
    stand_in = StandIn()
    client = await aiohttp_client(stand_in.app())
    listed = await (await client.get("/api/v1/pods")).json()
    await stand_in.error_410("pods")
    version = listed["metadata"]["resourceVersion"]
    response = await client.get("/api/v1/pods", params={"watch": "1", "resourceVersion": version,
                                                        "timeoutSeconds": "1"})  # fmt: skip
    assert response.status == 410, await response.text()
    # A relist's version is watched without a 410 again.
    again = (await (await client.get("/api/v1/pods")).json())["metadata"]["resourceVersion"]
    response = await client.get("/api/v1/pods", params={"watch": "1", "resourceVersion": again, "timeoutSeconds": "1"})
    assert response.status == 200 and await response.text() == ""
