#!/usr/bin/env bash
# Debian packages the tests use: promtool (prometheus) and amtool (prometheus-alertmanager).
# Installs only what is missing; uses sudo when not root.
set -euo pipefail

missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v amtool >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-system-deps: promtool and amtool present"
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
