"""The Dockerfile built and run with podman: air-gapped from wheels, then run as the DaemonSet runs it.

Nothing is installed here: podman, runc and debootstrap come from scripts/install-system-deps.sh. No image
registry is reachable, so the base is a Python 3.11 made from Debian's packages (debootstrap, from the mirror
apt uses), kept between runs. Podman's settings for these machines: ../shared/reference/container-image.md
(runc, not crun; no default rlimits). Where containers cannot run here, the tests skip and say why.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import REPO

from oomguard.common.ports import free_port
from oomguard.drill.tls import DrillTls, make_drill_tls

BASE = "localhost/oomguard-test-python:3.11"
# runc and debootstrap live in /usr/sbin, which a user's PATH may lack.
PATH = f"/usr/sbin:/usr/bin:/sbin:/bin:{os.environ.get('PATH', '')}"
SUITE = "bookworm"  # Debian 12: Python 3.11, as python:3.11-slim
# What python:3.11-slim has that the Dockerfile uses: python with pip and venv, and useradd (passwd).
BASE_PACKAGES = "python3,python3-pip,python3-venv,python-is-python3,ca-certificates,passwd"


@dataclass(frozen=True)
class Podman:
    conf: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "PATH": PATH, "CONTAINERS_CONF": str(self.conf)}

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["podman", "--runtime", "runc", *args], capture_output=True, text=True, timeout=timeout,
            env=self.env,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: exit {result.returncode}\n{result.stderr[-3000:]}")
        return result


def debian_mirror() -> str | None:
    """The Debian mirror apt uses (deb822 .sources or one-line sources.list), for the base suite."""
    apt = Path("/etc/apt")
    for path in sorted(apt.glob("sources.list.d/*.sources")):
        for stanza in path.read_text().split("\n\n"):
            fields = dict(re.findall(r"(?m)^(\w[\w-]*):\s*(.+)$", stanza))
            if SUITE in fields.get("Suites", "").split() and "deb" in fields.get("Types", "").split():
                return fields["URIs"].split()[0]
    for path in [apt / "sources.list", *sorted(apt.glob("sources.list.d/*.list"))]:
        if path.exists():
            for match in re.finditer(rf"(?m)^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+{SUITE}\s", path.read_text()):
                return match.group(1)
    return None


def make_base(podman: Podman) -> None:
    """Python 3.11 from Debian's packages, as a stand-in for python:3.11-slim; about a minute, once."""
    if podman("image", "exists", BASE, check=False).returncode == 0:
        return
    if not shutil.which("debootstrap", path=PATH):
        pytest.skip("debootstrap is not installed (scripts/install-system-deps.sh installs it)")
    if os.geteuid() != 0:
        pytest.skip(f"making the base image {BASE} with debootstrap needs root; import one made as root")
    mirror = debian_mirror()
    if mirror is None:
        pytest.skip(f"no Debian {SUITE} mirror in /etc/apt's sources to debootstrap the base image from")
    with tempfile.TemporaryDirectory(prefix="oomguard-base-") as scratch:
        root = Path(scratch) / "root"
        made = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", SUITE, str(root), mirror],
            capture_output=True, text=True, timeout=600, env=podman.env,
        )  # fmt: skip
        if made.returncode != 0:
            pytest.skip(f"debootstrap {SUITE} from {mirror} failed: {(made.stderr or made.stdout)[-500:]}")
        for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
            marker.unlink()  # pip installs system-wide, as in python:3.11-slim
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["podman", "--runtime", "runc", "import", "-", BASE], stdin=tar.stdout, capture_output=True, text=True,
            timeout=300, env=podman.env,
        )  # fmt: skip
        tar.wait(timeout=60)
        assert imported.returncode == 0, imported.stderr


@dataclass(frozen=True)
class Built:
    podman: Podman
    image: str
    tls: DrillTls


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    missing = [tool for tool in ("podman", "runc") if not shutil.which(tool, path=PATH)]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (scripts/install-system-deps.sh installs them)")
    work = tmp_path_factory.mktemp("image")
    conf = work / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = []\n")  # the sandbox forbids podman's default rlimits
    podman = Podman(conf)
    info = podman("info", check=False, timeout=60)
    if info.returncode != 0:
        pytest.skip(f"podman cannot run here: {info.stderr.strip()[-500:]}")
    make_base(podman)
    probe = podman("run", "--rm", BASE, "python3", "-c", "pass", check=False)
    if probe.returncode != 0:
        pytest.skip(f"this kernel or sandbox refuses containers: {probe.stderr.strip()[-500:]}")

    # The build context: the files the Dockerfile copies, and the wheels of an air-gapped build.
    context = work / "context"
    context.mkdir()
    for name in ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, context / name)
    shutil.copytree(REPO / "exporter", context / "exporter", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    wheels = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", str(context), "-w",
         str(context / "dist")], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if wheels.returncode != 0:
        pytest.skip(f"pip wheel cannot reach the package index: {wheels.stderr.strip()[-500:]}")
    image = f"localhost/oomguard-test:{uuid.uuid4().hex[:12]}"
    # --network none: nothing but the wheels can be installed (pip --no-index), as in an air-gapped network.
    podman("build", "--format", "docker", "--layers=false", "--network", "none", "--build-arg",
           f"BASE_IMAGE={BASE}", "-t", image, str(context), timeout=600)  # fmt: skip
    try:
        yield Built(podman, image, make_drill_tls(work / "web", bcrypt_cost=4))
    finally:
        podman("rmi", "--force", image, check=False)


def wait_for_200(podman: Podman, container: str, fetch, what: str, timeout: float = 60) -> bytes:
    """Polls `fetch` until it answers 200 (or the container exits), with a deadline."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            status, body = fetch()
            if status == 200:
                return body
            last = f"status {status}"
        except OSError as exc:
            last = f"{type(exc).__name__}: {exc}"
        state = podman("inspect", "--format", "{{.State.Status}}", container, check=False).stdout.strip()
        if state not in ("running", "created", "configured"):
            break
        time.sleep(0.2)  # between polls of the condition, not instead of it
    logs = podman("logs", container, check=False)
    raise AssertionError(f"{what}: no 200 ({last}); container {state}\n{logs.stdout[-2000:]}{logs.stderr[-3000:]}")


def run_detached(built: Built, *args: str) -> str:
    name = f"oomguard-test-{uuid.uuid4().hex[:12]}"
    built.podman("run", "-d", "--name", name, *args)
    return name


def test_runs_as_the_daemonset_runs_it_https_with_basic_auth(built: Built) -> None:
    """uid 0, every capability dropped, read-only root, host PID namespace, the web config's TLS (tls overlay)."""
    port = free_port()
    tls = built.tls
    container = run_detached(
        built, "--user", "0", "--cap-drop=ALL", "--read-only", "--security-opt", "no-new-privileges", "--pid=host",
        "-v", f"{tls.folder}:/etc/oomguard-web:ro", "-p", f"127.0.0.1:{port}:9847", built.image,
        "serve", "--config", "/etc/oomguard/oomguard.yaml", "--web.config.file", "/etc/oomguard-web/web-config.yml",
    )  # fmt: skip
    try:
        url = f"https://127.0.0.1:{port}/metrics"
        body = wait_for_200(built.podman, container, lambda: tls.get(url), "https /metrics with the password").decode()
        assert re.search(r'(?m)^oomguard_build_info\{.*version="0\.1\.0"', body), body[:2000]
        assert re.search(r"(?m)^oomguard_nvml_up 0", body)  # no driver here: said, and the rest still served
        assert tls.get(url, auth=False)[0] == 401
        assert tls.get(url, password="wrong")[0] == 401
        # The image's HEALTHCHECK, which knows neither the flag's web config nor the password: https, 401.
        health = built.podman("healthcheck", "run", container, check=False)
        assert health.returncode == 0, health
        told = built.podman("exec", container, "oomguard", "healthcheck", check=False)
        assert told.returncode == 0, told
        assert told.stdout.strip() == "https://127.0.0.1:9847/-/healthy: 401, answering behind basic auth"
        assert built.podman("exec", container, "id", "-u").stdout.strip() == "0"
    finally:
        built.podman("rm", "--force", "--time", "2", "--volumes", container, check=False)


def test_default_command_non_root_local_discovery_state_volume(built: Built) -> None:
    """No configuration, no arguments: uid 10001, local discovery on, the state volume writable."""
    port = free_port()
    container = run_detached(built, "--cap-drop=ALL", "--read-only", "-p", f"127.0.0.1:{port}:9847", built.image)
    try:

        def fetch() -> tuple[int, bytes]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    return response.status, response.read()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read()

        body = wait_for_200(built.podman, container, fetch, "http /metrics").decode()
        assert re.search(r'(?m)^oomguard_source_success\{source="local_discovery"\} 1', body), body[:2000]
        # The status page's template is a data file of the package: in the image only if the wheel carries it.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
            assert response.status == 200 and "<h1>oomguard 0.1.0</h1>" in response.read().decode()
        health = built.podman("healthcheck", "run", container, check=False)
        assert health.returncode == 0, health
        assert built.podman("exec", container, "id", "-u").stdout.strip() == "10001"
        assert built.podman("exec", container, "test", "-w", "/var/lib/oomguard", check=False).returncode == 0
    finally:
        built.podman("rm", "--force", "--time", "2", "--volumes", container, check=False)


def test_the_image_has_no_report_extra_nor_build_tools(built: Built) -> None:
    """matplotlib serves only `diagnose --report`: not in the node agent's image, and the command says so."""
    python = ("run", "--rm", "--read-only", "--entrypoint", "python", built.image, "-c")
    found = built.podman(*python, "import importlib.util as u; print([m for m in ('matplotlib', 'numpy', 'pip') "
                         "if u.find_spec(m)])").stdout.strip()  # fmt: skip
    assert found == "[]"
    missing = built.podman(*python, "from oomguard.diagnose.report import plot_png; plot_png(None)", check=False)
    assert "pip install 'oomguard[report]'" in missing.stderr
    inspected = built.podman("image", "inspect", "--format", "{{.Config.User}} {{.Config.Healthcheck.Test}}",
                             built.image).stdout.strip()  # fmt: skip
    assert inspected == "10001 [CMD oomguard healthcheck]"
