"""No Docker engine runs here: check what can be checked without one."""

from __future__ import annotations

import re
import shlex

from support import REPO

from oomguard.config import DEFAULT_PORT

DOCKERFILE = (REPO / "Dockerfile").read_text()


def instructions(name: str) -> list[str]:
    return [m.group(1) for m in re.finditer(rf"^{name}\s+((?:[^\n]*\\\n)*[^\n]*)", DOCKERFILE, re.M)]


def test_multi_stage_non_root_with_port_and_healthcheck() -> None:
    assert len(instructions("FROM")) >= 2
    (user,) = instructions("USER")
    assert user.strip() not in ("root", "0")
    assert instructions("EXPOSE") == [str(DEFAULT_PORT)]
    (healthcheck,) = instructions("HEALTHCHECK")
    assert f"127.0.0.1:{DEFAULT_PORT}/-/healthy" in healthcheck


def test_entrypoint_is_the_cli_of_the_package() -> None:
    assert instructions("ENTRYPOINT") == ['["oomguard"]']
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'oomguard = "oomguard.cli:main"' in pyproject


def test_copied_files_exist_and_are_not_ignored() -> None:
    ignored = (REPO / ".dockerignore").read_text().split()
    for line in instructions("COPY"):
        if "--from=" in line:
            continue
        *sources, _dest = shlex.split(line)
        for source in sources:
            assert (REPO / source).exists(), source
            assert source.rstrip("/") not in ignored, source


def test_default_config_in_the_image_is_valid() -> None:
    from oomguard.config import load_config

    assert load_config(REPO / "deploy" / "oomguard.yaml").web.listen_address == f":{DEFAULT_PORT}"
