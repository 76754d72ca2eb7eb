"""A real Prometheus scrapes oomguard over https with a client certificate and basic auth."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml
from web_serving import PASSWORD, Pki, web_config_text

from oomguard.drill.services import Prometheus


def scrape_job(name: str, address: str, pki: Pki, password: str) -> dict:
    return {
        "job_name": name,
        "scheme": "https",
        "tls_config": {"ca_file": str(pki.ca.cert), "cert_file": str(pki.client.cert),
                       "key_file": str(pki.client.key)},
        "basic_auth": {"username": "prometheus", "password": password},
        "static_configs": [{"targets": [address]}],
    }  # fmt: skip


async def test_prometheus_scrapes_over_mutual_tls_with_basic_auth(serve, pki: Pki, tmp_path: Path) -> None:
    served = await serve(web_config_text(pki, http_server_config={"headers": {"X-Frame-Options": "deny"}}))
    address = served.url.removeprefix("https://")
    prometheus = Prometheus(tmp_path / "prometheus", [address])
    # The helper writes a plain-http job; this one is the https job with credentials, written over it.
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [scrape_job("oomguard", address, pki, PASSWORD),
                           scrape_job("wrong-password", address, pki, "not it")],
    }  # fmt: skip
    (tmp_path / "prometheus" / "prometheus.yml").write_text(yaml.safe_dump(config))
    await asyncio.to_thread(prometheus.start)
    try:
        up = await asyncio.to_thread(prometheus.wait_for, 'up{job="oomguard"} == 1', 60)
        assert up[0]["metric"]["instance"] == address
        await asyncio.to_thread(prometheus.wait_for, 'oomguard_web_config_last_reload_successful{job="oomguard"} == 1')
        # The same target, the wrong password: Prometheus sees the 401 as a failed scrape.
        await asyncio.to_thread(prometheus.wait_for, 'up{job="wrong-password"} == 0', 60)
    finally:
        await asyncio.to_thread(prometheus.stop)
