"""Real Prometheus (and Alertmanager) processes on loopback, for the drill and the tests.

They are the Debian packages' binaries, started with a configuration written to a
scratch folder, on free ports, and stopped with the process: nothing of the host's
own Prometheus is touched.
"""

from __future__ import annotations

import copy
import json
import shutil
import ssl
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from oomguard.common.ports import free_port
from oomguard.common.served_process import ServedProcess


class ServiceError(RuntimeError):
    pass


class MissingPrerequisite(ServiceError):
    """Something to install before the drill can run: one line for the user, not a report."""


def find_binary(*names: str, package: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise MissingPrerequisite(f"{names[0]} not found: install Debian's {package} package (apt-get install {package})")


def prometheus_binary() -> str:
    return find_binary("prometheus", package="prometheus")


def alertmanager_binary() -> str:
    return find_binary("prometheus-alertmanager", "alertmanager", package="prometheus-alertmanager")


class _Process(ServedProcess):
    def __init__(
        self, command: list[str], log_path: Path, ready_url: str, *,
        ready_context: ssl.SSLContext | None = None, ready_headers: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(command, log_path, ready_url, error=ServiceError, ready_context=ready_context,
                         ready_headers=ready_headers)  # fmt: skip


class Prometheus(_Process):
    """Scrapes `targets` every `scrape_interval`, evaluates `rule_files`, sends alerts to `alertmanager`.

    `client`: what the scrape job and the alertmanagers entry add to reach servers under a web configuration
    (`scheme`, `tls_config`, `basic_auth`; drill/tls.py).
    """

    def __init__(
        self,
        workdir: Path,
        targets: list[str],
        *,
        rule_files: list[Path] = (),  # type: ignore[assignment]
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        alertmanager: str | None = None,
        job: str = "oomguard",
        client: dict[str, Any] | None = None,
        target_labels: list[dict[str, str]] | None = None,
        relabel_configs: list[dict[str, Any]] | None = None,
        alert_relabel_configs: list[dict[str, Any]] | None = None,
    ) -> None:
        """`target_labels`: each target's labels (as service discovery gives them, `__meta_*` included), in the
        order of `targets`; `relabel_configs` applied to them, `alert_relabel_configs` to the alerts sent."""
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        groups = [{"targets": [t], "labels": labels} for t, labels in zip(targets, target_labels, strict=True)] \
            if target_labels else [{"targets": targets}]  # fmt: skip
        job_config = {"job_name": job, **copy.deepcopy(client or {}), "static_configs": groups}
        if relabel_configs:
            job_config["relabel_configs"] = relabel_configs
        config: dict[str, Any] = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [job_config],
        }
        if alertmanager:
            # Copies: shared dicts would be written as YAML anchors and aliases.
            managers = [{**copy.deepcopy(client or {}), "static_configs": [{"targets": [alertmanager]}]}]
            config["alerting"] = {"alertmanagers": managers}
            if alert_relabel_configs:
                config["alerting"]["alert_relabel_configs"] = alert_relabel_configs
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        binary = prometheus_binary()
        super().__init__(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
                # Alerts are re-sent to Alertmanager every resend-delay: keep it short for a drill.
                "--rules.alert.resend-delay=1s",
            ],
            workdir / "prometheus.log",
            f"{self.url}/-/ready",
        )

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise ServiceError(f"Prometheus {path} failed: {body}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} | ({"time": str(at)} if at is not None else {})
        return self.api("query", **params)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
        return self.api("query_range", query=expr, start=str(start), end=str(end), step=str(step))["result"]

    def wait_for(self, expr: str, timeout: float = 60.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query(expr)
            if result:
                return result
            time.sleep(0.5)
        raise ServiceError(f"no result for {expr!r} after {timeout:g}s")


class Alertmanager(_Process):
    """Routes alerts with `config` (a dict of alertmanager.yml), clustering off.

    `web_config`: its `--web.config.file` (TLS, basic auth); `ready_context` and `ready_headers` then reach it.
    """

    def __init__(
        self, workdir: Path, config: dict[str, Any], *, web_config: Path | None = None,
        ready_context: ssl.SSLContext | None = None, ready_headers: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"{'https' if web_config else 'http'}://127.0.0.1:{self.port}"
        (workdir / "alertmanager.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        binary = alertmanager_binary()
        super().__init__(
            [
                binary,
                f"--config.file={workdir / 'alertmanager.yml'}",
                f"--storage.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
                "--log.level=warn",
                *([f"--web.config.file={web_config}"] if web_config else []),
            ],
            workdir / "alertmanager.log",
            f"{self.url}/-/ready",
            ready_context=ready_context,
            ready_headers=ready_headers,
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"
