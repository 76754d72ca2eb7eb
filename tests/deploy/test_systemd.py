"""deploy/systemd: the unit's sandbox, checked by systemd-analyze where it is installed, and its example web config."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

from oomguard import cli
from oomguard.exporter.web_config.model import parse

UNIT = REPO / "deploy" / "systemd" / "oomguard.service"
WEB_CONFIG = REPO / "deploy" / "systemd" / "web-config.yml"


def directives(text: str) -> dict[str, list[str]]:
    """Key -> every value it is given (keys repeat: DeviceAllow=), continuation lines joined."""
    out: dict[str, list[str]] = {}
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_the_unit_sandboxes_the_exporter() -> None:
    unit = directives(UNIT.read_text())
    one = {key: values[-1] for key, values in unit.items()}
    assert one["User"] == "oomguard" and one["Group"] == "oomguard"
    assert unit["CapabilityBoundingSet"] == [""] and unit["AmbientCapabilities"] == [""]
    for key, expected in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
                          "PrivateTmp": "yes", "DevicePolicy": "closed", "StateDirectory": "oomguard",
                          "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
                          "ProtectControlGroups": "yes", "RestrictSUIDSGID": "yes"}.items():  # fmt: skip
        assert one.get(key) == expected, key
    assert unit["ReadWritePaths"] == ["/var/lib/oomguard"]  # the state directory, nothing else
    assert all("nvidia" in device for device in unit["DeviceAllow"]), unit["DeviceAllow"]
    assert set(one["RestrictAddressFamilies"].split()) == {"AF_INET", "AF_INET6", "AF_UNIX"}
    assert "@system-service" in unit["SystemCallFilter"]


def test_the_units_command_line_is_one_the_cli_accepts() -> None:
    command = shlex.split(directives(UNIT.read_text())["ExecStart"][0])
    args = cli._parser().parse_args(command[1:])
    assert args.command == "serve" and args.web_config_file == "/etc/oomguard/web-config.yml"


def test_the_example_web_config_is_valid() -> None:
    model = parse(WEB_CONFIG)  # the keys and the hash; its certificate files exist only on a real host
    assert (
        model.tls_server_config is not None and model.tls_server_config.client_auth_type == "RequireAndVerifyClientCert"
    )
    assert model.basic_auth_users


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed: only the parsed checks above ran")
    # verify checks that ExecStart's binary exists: point it at this checkout's oomguard.
    unit = tmp_path / "oomguard.service"
    unit.write_text(
        UNIT.read_text().replace("/opt/oomguard/bin/oomguard", str(Path(sys.executable).parent / "oomguard"))
    )
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    security = subprocess.run([analyze, "security", "--offline=yes", str(unit)], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
    exposure = re.search(r"Overall exposure level for \S+: ([\d.]+)", security.stdout)
    if exposure is None:
        pytest.skip(f"systemd-analyze security --offline is not supported here: {security.stderr.strip()[:200]}")
    assert float(exposure.group(1)) <= 2.5, security.stdout  # systemd calls below 3 "OK"; ours was 1.7
