"""The Dockerfile read: what can be checked without building it (tests/container/test_image.py builds and runs it)."""

from __future__ import annotations

import re
from pathlib import Path

from support import REPO

from oomguard.exporter.config import DEFAULT_PORT
from oomguard.exporter.config_loader import load_config

DOCKERFILE = (REPO / "Dockerfile").read_text()


def instructions(name: str) -> list[str]:
    return [m.group(1) for m in re.finditer(rf"^{name}\s+((?:[^\n]*\\\n)*[^\n]*)", DOCKERFILE, re.M)]


def test_base_is_a_build_argument_and_the_final_stage_is_non_root() -> None:
    assert instructions("ARG") == ["BASE_IMAGE=python:3.11-slim"]
    froms = instructions("FROM")
    assert len(froms) >= 2 and all(f.startswith("${BASE_IMAGE}") for f in froms)
    (user,) = instructions("USER")
    assert user.strip() not in ("root", "0")
    assert instructions("EXPOSE") == [str(DEFAULT_PORT)]
    assert instructions("VOLUME") == ["/var/lib/oomguard"]


def test_wheels_in_dist_are_installed_alone() -> None:
    """An air-gapped build: with dist/*.whl in the context, pip asks no index."""
    (install,) = [run for run in instructions("RUN") if "pip install" in run]
    assert "ls dist/*.whl" in install
    assert "--no-index --find-links dist oomguard" in install
    assert "[report]" not in install  # matplotlib stays out of the node agent
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ignored[ignored.index("*") :].count("*") == 1  # everything out, then what the build needs back in
    for needed in ("!pyproject.toml", "!README.md", "!exporter", "!dist/*.whl"):
        assert needed in ignored, needed


def test_healthcheck_speaks_what_the_listener_speaks() -> None:
    """Not a plain-http one-liner: that fails as soon as the web config turns on TLS or basic auth."""
    (healthcheck,) = instructions("HEALTHCHECK")
    assert healthcheck.rstrip().endswith('CMD ["oomguard", "healthcheck"]')
    assert "http://" not in healthcheck


def test_default_command_discovers_the_local_engines(tmp_path: Path) -> None:
    """No configuration of the user's: serve the image's, which names no target, so local discovery is on."""
    assert instructions("ENTRYPOINT") == ['["oomguard"]']
    assert instructions("CMD") == ['["serve"]']
    assert 'oomguard = "oomguard.cli:main"' in (REPO / "pyproject.toml").read_text()
    assert "OOMGUARD_CONFIG=/etc/oomguard/oomguard.yaml" in instructions("ENV")[0]
    (written,) = re.findall(r"printf '([^']*)'\s*\\\n\s*> /etc/oomguard/oomguard.yaml", DOCKERFILE)
    config = written.encode().decode("unicode_escape")
    path = tmp_path / "oomguard.yaml"
    path.write_text(config)
    loaded = load_config(path)
    assert loaded.discovers_local and loaded.state_dir == "/var/lib/oomguard"


def test_the_docker_run_comment_reaches_the_hosts_engines() -> None:
    """A bridged container's 127.0.0.1 is its own: the engines' ports need the host's network."""
    lines = DOCKERFILE.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("#   docker run -d "))
    end = next(n for n in range(start, len(lines)) if not lines[n].endswith("\\"))
    run = " ".join(lines[start : end + 1])
    for flag in ("--network host", "--pid host", "--gpus all", "-v oomguard-state:/var/lib/oomguard"):
        assert flag in run, flag
