"""The web configuration file: the toolkit's keys, and errors that name the file, the key and the fix."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import yaml
from web_serving import Pki, bcrypt_hash, web_config_text

from oomguard.exporter.config import ConfigError
from oomguard.exporter.web_config import load_web_config
from oomguard.exporter.web_config.model import parse
from oomguard.exporter.web_config.tls import VERIFY_MODES


def load_text(tmp_path: Path, text: str):
    file = tmp_path / "web.yml"
    file.write_text(text)
    return load_web_config(file)


def error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_text(tmp_path, text)
    message = str(caught.value)
    assert message.startswith(str(tmp_path / "web.yml")), message
    return message


def test_an_empty_file_serves_plain_http_without_auth(tmp_path: Path) -> None:
    settings = load_text(tmp_path, "")
    assert settings.ssl_context is None and settings.auth is None and not settings.headers


def test_the_toolkits_example_loads(tmp_path: Path, pki: Pki) -> None:
    settings = load_text(tmp_path, web_config_text(pki, http_server_config={"http2": False}))
    assert settings.ssl_context is not None and settings.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert settings.ssl_context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert settings.auth is not None and len(settings.auth) == 1


def test_a_versions_only_block_stays_plain_http_as_in_the_toolkit(tmp_path: Path) -> None:
    assert load_text(tmp_path, "tls_server_config: {min_version: TLS13}\n").ssl_context is None


def test_unknown_keys_are_refused_with_a_suggestion(tmp_path: Path, pki: Pki) -> None:
    message = error(tmp_path, "basic_auth_user: {}\n")
    assert "basic_auth_user: unknown key; did you mean 'basic_auth_users'?" in message
    message = error(tmp_path, "tls_server_config: {cert_fil: x.crt}\n")
    assert "tls_server_config.cert_fil: unknown key; did you mean 'cert_file'?" in message


def test_toolkit_keys_oomguard_does_not_serve_are_refused_by_name(tmp_path: Path, pki: Pki) -> None:
    document = yaml.safe_load(web_config_text(pki))
    document["tls_server_config"]["cipher_suites"] = ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"]
    message = error(tmp_path, yaml.safe_dump(document))
    assert "tls_server_config.cipher_suites: known to the exporter toolkit, not served by oomguard" in message


def test_rate_limit_is_read_as_the_toolkit_writes_it(tmp_path: Path, pki: Pki) -> None:
    file = tmp_path / "web.yml"
    file.write_text(web_config_text(pki) + "rate_limit: {interval: 1m30s, burst: 20}\n")
    limit = parse(file).rate_limit
    assert limit is not None and limit.interval_seconds == 90 and limit.burst == 20
    assert "rate_limit.interval" in error(tmp_path, "rate_limit: {interval: often, burst: 2}\n")
    assert "burst: 0 would refuse every request" in error(tmp_path, "rate_limit: {interval: 1s, burst: 0}\n")


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"X-Powered-By": "oomguard"}, "header 'X-Powered-By' cannot be set"),
        ({"X-Frame-Option": "deny"}, "did you mean 'X-Frame-Options'?"),
        ({"X-Frame-Options": "allow"}, "X-Frame-Options must be one of deny, sameorigin"),
        ({"X-Content-Type-Options": "sniff"}, "X-Content-Type-Options must be one of nosniff"),
        ({"Content-Security-Policy": "default-src 'self'\r\nSet-Cookie: a=b"}, "control character"),
    ],
)
def test_headers_the_toolkit_refuses_are_refused(tmp_path: Path, headers: dict[str, str], expected: str) -> None:
    message = error(tmp_path, yaml.safe_dump({"http_server_config": {"headers": headers}}))
    assert "http_server_config.headers" in message and expected in message


def test_a_bad_password_hash_is_refused_without_printing_it(tmp_path: Path) -> None:
    message = error(tmp_path, yaml.safe_dump({"basic_auth_users": {"alice": "plain-text-password"}}))
    assert "basic_auth_users.alice: not a bcrypt hash" in message and "htpasswd" in message
    assert "plain-text-password" not in message


@pytest.mark.parametrize("prefix", ["$2y$", "$2b$", "$2a$"])
def test_every_bcrypt_prefix_is_accepted(tmp_path: Path, prefix: str) -> None:
    assert load_text(tmp_path, yaml.safe_dump({"basic_auth_users": {"a": bcrypt_hash("pw", prefix)}})).auth


def test_tls_mistakes_the_toolkit_refuses(tmp_path: Path, pki: Pki) -> None:
    message = error(tmp_path, yaml.safe_dump({"tls_server_config": {"cert_file": str(pki.server.cert)}}))
    assert "tls_server_config.key_file: missing" in message
    no_client_auth = {"cert_file": str(pki.server.cert), "key_file": str(pki.server.key),
                      "client_ca_file": str(pki.ca.cert)}  # fmt: skip
    message = error(tmp_path, yaml.safe_dump({"tls_server_config": no_client_auth}))
    assert "client_ca_file: set, but client_auth_type is NoClientCert" in message
    message = error(tmp_path, yaml.safe_dump({"tls_server_config": {"min_version": "TLS13", "max_version": "TLS12"}}))
    assert "min_version: TLS13 is above max_version TLS12" in message
    message = error(tmp_path, "tls_server_config: {client_auth_type: RequireAndVerify}\n")
    assert "tls_server_config.client_auth_type" in message and "RequireAndVerifyClientCert" in message


def test_unreadable_certificates_are_named(tmp_path: Path, pki: Pki) -> None:
    message = error(tmp_path, web_config_text(pki).replace(str(pki.server.cert), "/nonexistent/server.crt"))
    assert "tls_server_config.cert_file" in message and "/nonexistent/server.crt" in message
    message = error(tmp_path, web_config_text(pki).replace(str(pki.server.key), str(pki.client.key)))
    assert "cannot load the pair" in message  # a key that is not the certificate's


def test_relative_paths_are_read_from_the_files_folder(tmp_path: Path, pki: Pki) -> None:
    folder = tmp_path / "etc"
    folder.mkdir()
    for issued in (pki.server.cert, pki.server.key):
        (folder / issued.name).write_bytes(issued.read_bytes())
    file = folder / "web.yml"
    file.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"}}))
    assert load_web_config(file).ssl_context is not None


def test_client_auth_types_map_to_verify_modes_never_laxer_than_go() -> None:
    assert VERIFY_MODES == {
        "NoClientCert": ssl.CERT_NONE,
        "RequestClientCert": ssl.CERT_NONE,  # Go asks but never checks: anyone gets in, as here
        "RequireAnyClientCert": ssl.CERT_REQUIRED,  # stricter: the certificate must verify
        "RequireClientCert": ssl.CERT_REQUIRED,
        "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
        "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
    }
