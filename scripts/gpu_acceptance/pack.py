"""`scripts/gpu-acceptance.sh --pack`: what the run needs on a machine without network, in one file to carry.

The device machines take the repository and up to 64 MiB of ignored paths; the .venv is some 400 MB (the test
tools, matplotlib, vLLM's helpers) and its interpreter is a link to this machine's Python. This writes
`build/gpu-acceptance/runtime.tar.xz`: the interpreter the .venv runs on (its binary, libpython and standard
library, less its tests and tools) under `python/`, and the installed distributions `oomguard` depends on (its
dependencies' closure, read from their metadata) under `site/`. scripts/gpu-acceptance.sh unpacks it when no Python
there can import the exporter's dependencies. Then it is checked: unpacked in a scratch folder and the exporter's
modules imported with it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

# Parts of the standard library the exporter never imports: its tests, the GUI, the tools to build and install.
STDLIB_LEFT_OUT = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages", "pydoc_data"}


def requirement_names(dist: metadata.Distribution) -> list[str]:
    """The distribution's requirements without an extra (those the node agent runs with)."""
    names = []
    for req in dist.requires or ():
        if "extra ==" in req:
            continue
        match = re.match(r"[A-Za-z0-9_.\-]+", req)
        if match:
            names.append(match.group(0))
    return names


def closure(root: str) -> list[metadata.Distribution]:
    seen: dict[str, metadata.Distribution] = {}
    todo = requirement_names(metadata.distribution(root))
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a requirement for another platform or Python
        seen[key] = dist
        todo.extend(requirement_names(dist))
    return list(seen.values())


def site_files(dists: list[metadata.Distribution]) -> set[Path]:
    """Every installed file of the distributions, as paths relative to site-packages (no scripts in bin/)."""
    out: set[Path] = set()
    for dist in dists:
        for file in dist.files or ():
            rel = Path(str(file))
            if rel.parts and rel.parts[0] != ".." and "__pycache__" not in rel.parts:
                out.add(rel)
    return out


def _interpreter_filter(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    parts = Path(info.name).parts
    if "__pycache__" in parts or (len(parts) > 3 and parts[3] in STDLIB_LEFT_OUT):
        return None  # python/lib/python3.X/<part>
    if len(parts) > 3 and parts[3].startswith("config-"):
        return None  # the static library and makefiles, for building extensions
    return info


def pack(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / "runtime.tar.xz"
    base = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    stdlib = base / "lib" / version
    if not stdlib.is_dir():
        raise SystemExit(f"pack: no standard library at {stdlib}: this Python is not laid out as a prefix")
    site = Path(sysconfig.get_paths()["purelib"])
    dists = closure("oomguard")
    with tarfile.open(target, "w:xz", preset=6) as tar:
        binary = Path(sys.executable).resolve()
        tar.add(binary, arcname="python/bin/python3")
        for lib in base.glob("lib/libpython*.so*"):
            tar.add(lib.resolve(), arcname=f"python/lib/{lib.name}")
        tar.add(stdlib, arcname=f"python/lib/{version}", filter=_interpreter_filter)
        for rel in sorted(site_files(dists)):
            if (site / rel).is_file():
                tar.add(site / rel, arcname=f"site/{rel}")
    print(
        f"pack: {target}: {target.stat().st_size / 2**20:.1f} MiB; {len(dists)} distributions: "
        f"{', '.join(sorted(d.metadata['Name'] for d in dists))}"
    )
    check(target)
    return target


def check(target: Path) -> None:
    """Unpacked in a scratch folder, with none of this machine's paths: the exporter's modules must import."""
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as scratch:
        with tarfile.open(target) as tar:
            tar.extractall(scratch, filter="tar")
        env = {
            "PATH": "/usr/bin:/bin",
            "LD_LIBRARY_PATH": f"{scratch}/python/lib",
            "PYTHONPATH": f"{root / 'exporter'}:{root}:{scratch}/site",
            "PYTHONNOUSERSITE": "1",
        }
        code = (
            "import oomguard.exporter.runtime, oomguard.exporter.web, pynvml, prometheus_client.parser, yaml, sys; "
            "print(sys.prefix)"
        )
        done = subprocess.run([f"{scratch}/python/bin/python3", "-c", code], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"pack: the packed runtime does not import the exporter:\n{done.stderr}")
        print(f"pack: checked: the packed interpreter imports the exporter (prefix {done.stdout.strip()})")
    print("pack: carry build/gpu-acceptance with the repository; scripts/gpu-acceptance.sh unpacks it if needed")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    pack(Path(args[0]) if args else Path("build/gpu-acceptance"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
