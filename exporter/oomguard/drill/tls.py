"""`oomguard drill --tls`: a throwaway CA, a server certificate and a password for the drill's chain.

The exporter and Alertmanager serve https with basic auth under one exporter-toolkit web configuration
(`--web.config.file`); Prometheus scrapes the exporter and sends alerts to Alertmanager with `scheme: https`,
`tls_config` (the CA, the server name) and `basic_auth` (the password in a file), as a production
deployment does. Prometheus' own API stays plain http: `oomguard diagnose`, which reads it, sends no
credentials. The certificates live in the drill's working folder and expire after a day.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import secrets
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import yaml

from oomguard.drill.services import MissingPrerequisite, Prometheus, ServiceError

USERNAME = "prometheus"
# The name in the server certificate that Prometheus checks (tls_config.server_name): it connects to
# 127.0.0.1, as it connects to a pod's IP in Kubernetes, and verifies the name, not the address.
SERVER_NAME = "oomguard.drill.invalid"

MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class DrillTls:
    folder: Path
    ca_file: Path
    cert_file: Path
    key_file: Path
    password_file: Path
    web_config: Path  # exporter toolkit format: TLS and basic auth for the exporter and Alertmanager
    username: str = USERNAME
    server_name: str = SERVER_NAME

    @property
    def password(self) -> str:
        return self.password_file.read_text()

    def client_settings(self) -> dict[str, Any]:
        """What a Prometheus scrape job or alertmanagers entry needs to reach a server of the drill."""
        return {
            "scheme": "https",
            "tls_config": {"ca_file": str(self.ca_file), "server_name": self.server_name},
            "basic_auth": {"username": self.username, "password_file": str(self.password_file)},
        }

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def authorization(self, password: str | None = None) -> str:
        pair = f"{self.username}:{self.password if password is None else password}"
        return "Basic " + base64.b64encode(pair.encode()).decode()

    def get(self, url: str, password: str | None = None, *, auth: bool = True) -> tuple[int, bytes]:
        """One https request, verified against the drill's CA (and the address, which the certificate names too)."""
        request = urllib.request.Request(url, headers={"Authorization": self.authorization(password)} if auth else {})
        try:
            with urllib.request.urlopen(request, timeout=10, context=self.ssl_context()) as response:
                return response.status, response.read(MAX_BODY_BYTES)  # the drill's own exporter: a cap all the same
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(MAX_BODY_BYTES)


def require_cryptography() -> None:
    """Raises MissingPrerequisite where the cryptography package cannot be imported (a dependency of oomguard's,
    missing only from an install that skipped dependencies)."""
    try:
        import cryptography.x509  # noqa: F401
    except ImportError as exc:
        raise MissingPrerequisite(
            f"oomguard drill --tls makes its certificates with the cryptography package, which cannot be imported "
            f"({exc}): pip install cryptography (a dependency of oomguard's: pip install oomguard installs it)"
        ) from exc


def make_drill_tls(folder: Path, *, bcrypt_cost: int = 10) -> DrillTls:
    """Writes the CA, the server certificate and key, the password and the web configuration; blocking."""
    require_cryptography()
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder().subject_name(name("oomguard drill CA")).issuer_name(name("oomguard drill CA"))
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=False, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
        ), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder().subject_name(name(SERVER_NAME)).issuer_name(ca.subject)
        .public_key(server_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        # The address too, for the drill's own checks: urllib cannot verify a name other than the URL's host.
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName(SERVER_NAME), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        ), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    tls = DrillTls(
        folder, folder / "ca.crt", folder / "server.crt", folder / "server.key", folder / "password",
        folder / "web-config.yml",
    )  # fmt: skip
    tls.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    tls.cert_file.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    tls.key_file.touch(mode=0o600)
    tls.key_file.write_bytes(pem_key(server_key))
    password = secrets.token_urlsafe(24)
    tls.password_file.touch(mode=0o600)
    tls.password_file.write_text(password)  # no newline: Prometheus' password_file sends the file as it is
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(bcrypt_cost)).decode()
    web_config = {
        "tls_server_config": {"cert_file": tls.cert_file.name, "key_file": tls.key_file.name},
        "basic_auth_users": {USERNAME: hashed},
    }
    tls.web_config.write_text(yaml.safe_dump(web_config))
    return tls


def check_chain(tls: DrillTls, exporter_url: str, prometheus: Prometheus) -> tuple[list[str], list[str]]:
    """After a drill under --tls: (what held, what did not). Blocking.

    The exporter answers the password and refuses none or a wrong one; Prometheus scraped it over https
    and its last scrape was up; it sends alerts to an https Alertmanager.
    """
    held: list[str] = []
    problems: list[str] = []
    for label, password, auth, expected in (
        ("the drill's password", None, True, 200),
        ("no credentials", None, False, 401),
        ("a wrong password", "not-" + tls.password, True, 401),
    ):
        try:
            status, _ = tls.get(f"{exporter_url}/metrics", password, auth=auth)
        except OSError as exc:
            problems.append(f"the exporter over https with {label}: {exc}")
            continue
        line = f"the exporter's /metrics over https with {label}: {status}"
        (held if status == expected else problems).append(line + ("" if status == expected else f", not {expected}"))
    try:
        targets = prometheus.api("targets", state="active")["activeTargets"]
        managers = prometheus.api("alertmanagers")["activeAlertmanagers"]
    except (OSError, ValueError, KeyError, ServiceError) as exc:
        return held, [*problems, f"cannot read Prometheus' targets and alertmanagers: {exc}"]
    ours = [t for t in targets if t.get("labels", {}).get("job") == "oomguard"]
    for target in ours:
        line = f"Prometheus scraped {target['scrapeUrl']}: {target['health']}"
        ok = target["scrapeUrl"].startswith("https://") and target["health"] == "up"
        (held if ok else problems).append(line + ("" if ok else f" {target.get('lastError', '')}".rstrip()))
    if not ours:
        problems.append("Prometheus has no oomguard target")
    urls = [m["url"] for m in managers]
    if urls and all(u.startswith("https://") for u in urls):
        held.append("Prometheus sends alerts to " + ", ".join(urls))
    else:
        problems.append(f"Prometheus' Alertmanagers are not all https: {json.dumps(urls)}")
    return held, problems
