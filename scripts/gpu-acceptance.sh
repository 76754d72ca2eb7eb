#!/usr/bin/env bash
# The real-GPU acceptance run (docs/testing.md, "The GPU acceptance run"): the exporter against nvidia-smi, a child
# that allocates GPU memory through the CUDA driver API until CUDA_ERROR_OUT_OF_MEMORY and logs it as vLLM does,
# NVML's cost per scrape, MIG as found. No network, no pip; never changes a GPU's mode or settings. Without a GPU
# it runs the same checks on the stand-in NVML (figures labelled simulated).
#
#   OUT=/some/dir bash scripts/gpu-acceptance.sh        # or: bash scripts/gpu-acceptance.sh --out DIR
#   bash scripts/gpu-acceptance.sh --help               # the options (--mode, --gpu, --climb-seconds...)
#   bash scripts/gpu-acceptance.sh --pack               # here: build/gpu-acceptance/, an interpreter and the
#                                                       # exporter's dependencies to carry where .venv cannot go
#
# Figures: $OUT/gpu-acceptance.json and gpu-acceptance.md; exit 0 everything that ran passed, 1 a check failed,
# 2 the run could not start (the message says why).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
pack="$root/build/gpu-acceptance/runtime.tar.xz"

if [[ "${1:-}" == "--pack" ]]; then
    exec "$root/.venv/bin/python" -m scripts.gpu_acceptance.pack "$root/build/gpu-acceptance"
fi

# The checkout's package first: a virtual environment carried to another path has lost its editable install.
export PYTHONPATH="$root/exporter:$root${PYTHONPATH:+:$PYTHONPATH}"
has_deps() {
    "$1" -c 'import aiohttp, pydantic, yaml, psutil, pynvml, prometheus_client, oomguard.exporter.runtime' >/dev/null 2>&1
}

python=""
for candidate in "${OOMGUARD_ACCEPTANCE_PYTHON:-}" "$root/.venv/bin/python"; do
    if [[ -n "$candidate" && -x "$candidate" ]] && has_deps "$candidate"; then
        python="$candidate"
        break
    fi
done
if [[ -z "$python" && -f "$pack" ]]; then
    # The packed interpreter and dependencies (--pack): unpacked outside the checkout, used from there.
    unpacked="${TMPDIR:-/tmp}/oomguard-acceptance-runtime"
    rm -rf "$unpacked" && mkdir -p "$unpacked"
    tar -xJf "$pack" -C "$unpacked"
    export LD_LIBRARY_PATH="$unpacked/python/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PYTHONPATH="$PYTHONPATH:$unpacked/site"
    if has_deps "$unpacked/python/bin/python3"; then
        python="$unpacked/python/bin/python3"
    fi
fi
if [[ -z "$python" ]] && command -v python3 >/dev/null && has_deps "$(command -v python3)"; then
    python="$(command -v python3)"
fi
if [[ -z "$python" ]]; then
    echo "gpu-acceptance: no Python here can import the exporter's dependencies: tried \$OOMGUARD_ACCEPTANCE_PYTHON," \
        ".venv/bin/python, $pack (make it with --pack on a machine with the .venv, and carry build/gpu-acceptance)" \
        "and python3 on PATH" >&2
    exit 2
fi
exec "$python" -m scripts.gpu_acceptance "$@"
