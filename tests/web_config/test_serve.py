"""oomguard served under a web configuration: real TLS handshakes, basic auth, headers, reloads."""

from __future__ import annotations

import asyncio
import ssl

import aiohttp
import pytest
from cryptography import x509
from support import promtool_check_metrics, value
from web_serving import (
    PASSWORD,
    Pki,
    get,
    peer_certificate,
    wait_until,
    web_config_text,
    write_atomically,
)

HEADERS = {"http_server_config": {"headers": {"X-Frame-Options": "deny", "X-Content-Type-Options": "nosniff",
                                              "Strict-Transport-Security": "max-age=31536000"}}}  # fmt: skip


async def test_https_with_client_certificate_basic_auth_and_headers(serve, pki: Pki, promtool: str) -> None:
    served = await serve(web_config_text(pki, **HEADERS))
    assert served.url.startswith("https://")
    status, headers, text = await get(served.url, pki.client_context(client=pki.client), ("prometheus", PASSWORD))
    assert status == 200, text
    assert value(text, "oomguard_gpu_memory_used_ratio", gpu="0") >= 0
    assert value(text, "oomguard_web_config_last_reload_successful") == 1.0
    assert value(text, "oomguard_web_config_last_reload_success_timestamp_seconds") > 1.6e9
    assert promtool_check_metrics(promtool, text.encode()) == ""
    assert headers["X-Frame-Options"] == "deny"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Strict-Transport-Security"] == "max-age=31536000"


async def test_wrong_or_missing_password_is_401_with_the_headers(serve, pki: Pki) -> None:
    served = await serve(web_config_text(pki, **HEADERS))
    context = pki.client_context(client=pki.client)
    for auth in (("prometheus", "wrong"), ("nobody", PASSWORD), None):
        for path in ("/metrics", "/-/healthy", "/", "/status.json"):
            status, headers, _ = await get(served.url, context, auth, path=path)
            assert (status, headers.get("WWW-Authenticate")) == (401, "Basic"), (auth, path)
            assert headers["X-Frame-Options"] == "deny"
    # The wrong password was never cached as good: the right one still works, the wrong one still fails.
    assert (await get(served.url, context, ("prometheus", PASSWORD)))[0] == 200
    assert (await get(served.url, context, ("prometheus", "wrong")))[0] == 401
    status, headers, _ = await get(served.url, context, ("prometheus", PASSWORD), path="/no-such-page")
    assert status == 404 and headers["X-Frame-Options"] == "deny"


@pytest.mark.parametrize("client", ["none", "stranger"])
async def test_require_and_verify_refuses_a_client_without_a_trusted_certificate(serve, pki: Pki, client: str) -> None:
    served = await serve(web_config_text(pki))
    context = pki.client_context(client=None if client == "none" else pki.stranger)
    # TLS 1.3 ends the handshake before the server checks the certificate: the refusal comes on the first read.
    with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
        await get(served.url, context, ("prometheus", PASSWORD))


async def test_verify_if_given_lets_a_client_without_certificate_in(serve, pki: Pki) -> None:
    served = await serve(web_config_text(pki, client_auth="VerifyClientCertIfGiven"))
    assert (await get(served.url, pki.client_context(), ("prometheus", PASSWORD)))[0] == 200
    with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
        await get(served.url, pki.client_context(client=pki.stranger), ("prometheus", PASSWORD))


async def test_a_changed_password_takes_effect_after_reload(serve, pki: Pki) -> None:
    served = await serve(web_config_text(pki))
    context = pki.client_context(client=pki.client)
    assert (await get(served.url, context, ("prometheus", PASSWORD)))[0] == 200  # now cached
    write_atomically(served.file, web_config_text(pki, password="new password"))

    async def new_password_works() -> bool:
        return (await get(served.url, context, ("prometheus", "new password")))[0] == 200

    await wait_until(new_password_works, what="the new password")
    assert (await get(served.url, context, ("prometheus", PASSWORD)))[0] == 401


async def test_a_bad_change_keeps_the_last_good_configuration(serve, pki: Pki) -> None:
    served = await serve(web_config_text(pki))
    context = pki.client_context(client=pki.client)
    good = served.file.read_text()
    write_atomically(served.file, good + "basic_auth_user: {}\n")  # a typo: refused
    await wait_until(lambda: not served.state.last_reload_successful, what="the bad file to be refused")
    status, _, text = await get(served.url, context, ("prometheus", PASSWORD))
    assert status == 200
    assert value(text, "oomguard_web_config_last_reload_successful") == 0.0
    write_atomically(served.file, web_config_text(pki, password="fixed"))
    await wait_until(lambda: served.state.last_reload_successful, what="the fixed file to load")
    status, _, text = await get(served.url, context, ("prometheus", "fixed"))
    assert status == 200 and value(text, "oomguard_web_config_last_reload_successful") == 1.0


async def test_a_renewed_certificate_is_served_without_a_new_listener(serve, pki: Pki) -> None:
    served = await serve(web_config_text(pki))
    listener = served.server._listener
    first = await peer_certificate(served.url, pki.client_context(client=pki.client))
    assert first.serial_number == x509.load_pem_x509_certificate(pki.server.cert.read_bytes()).serial_number
    renewed = pki.ca.issue("server-renewed", server=True)
    text = web_config_text(pki).replace(str(pki.server.cert), str(renewed.cert))
    write_atomically(served.file, text.replace(str(pki.server.key), str(renewed.key)))

    expected = x509.load_pem_x509_certificate(renewed.cert.read_bytes()).serial_number

    async def renewed_served() -> bool:
        certificate = await peer_certificate(served.url, pki.client_context(client=pki.client))
        return certificate.serial_number == expected

    await wait_until(renewed_served, what="the renewed certificate")
    assert served.server._listener is listener


async def test_a_stricter_client_policy_replaces_the_listener(serve, pki: Pki) -> None:
    served = await serve(web_config_text(pki, client_auth=None))
    assert (await get(served.url, pki.client_context(), ("prometheus", PASSWORD)))[0] == 200
    listener = served.server._listener
    write_atomically(served.file, web_config_text(pki))
    # Set once the new listener is up: no request falls in the gap between the two.
    await wait_until(lambda: served.server._listener is not listener, what="a new listener")
    with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
        await get(served.url, pki.client_context(), ("prometheus", PASSWORD))
    assert (await get(served.url, pki.client_context(client=pki.client), ("prometheus", PASSWORD)))[0] == 200


async def test_new_client_cas_apply_to_new_connections_on_a_new_listener(serve, pki: Pki) -> None:
    served = await serve(web_config_text(pki))
    listener = served.server._listener
    ca_file = served.file.with_name("clients.crt")
    ca_file.write_bytes(pki.ca.cert.read_bytes())
    write_atomically(served.file, web_config_text(pki).replace(str(pki.ca.cert), str(ca_file)))
    await wait_until(lambda: str(ca_file) in str(served.state.current.model), what="the CA file in use")
    stranger = pki.client_context(client=pki.stranger)
    with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
        await get(served.url, stranger, ("prometheus", PASSWORD))
    # The client CA is now the stranger's: it gets in, the former client no longer does.
    write_atomically(ca_file, pki.stranger_ca.read_text())

    async def stranger_in() -> bool:
        try:
            return (await get(served.url, stranger, ("prometheus", PASSWORD)))[0] == 200
        except (aiohttp.ClientError, ssl.SSLError, ConnectionError):
            return False

    await wait_until(stranger_in, what="the new client CA")
    with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
        await get(served.url, pki.client_context(client=pki.client), ("prometheus", PASSWORD))
    # A new listener: sessions saved under the former CAs cannot resume (tests/hostile/test_hostile_web.py).
    assert served.server._listener is not listener


async def test_top_reads_the_status_over_mutual_tls_with_basic_auth(serve, pki: Pki, tmp_path) -> None:
    """`oomguard top`'s options against a served exporter: its CA, a client certificate, the password from a file."""
    import argparse

    from oomguard.exporter.status import top

    served = await serve(web_config_text(pki))
    password = tmp_path / "password"
    password.write_text(PASSWORD + "\n")

    def args(**changes: object) -> argparse.Namespace:
        base = {"url": served.url, "username": "prometheus", "password_file": password, "ca_file": pki.ca.cert,
                "cert_file": pki.client.cert, "key_file": pki.client.key, "insecure_skip_verify": False}  # fmt: skip
        return argparse.Namespace(**(base | changes))

    def read(a: argparse.Namespace) -> dict:
        return top.fetch(*top._request(a), top._tls(a), 5.0)

    view = await asyncio.to_thread(read, args())
    assert isinstance(view["gpus"], list) and "thresholds" in view
    wrong = tmp_path / "wrong"
    wrong.write_text("not it")
    with pytest.raises(top.TopError, match="HTTP 401: give --username and --password-file"):
        await asyncio.to_thread(read, args(password_file=wrong))
    with pytest.raises(top.TopError, match="cannot read"):
        await asyncio.to_thread(read, args(ca_file=None))  # the server's certificate is not trusted
