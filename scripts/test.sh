#!/usr/bin/env bash
# `make test`: install everything the tests need, then run the whole suite; a line per stage with its time.
#
# Stages, each timed:
#   1. Debian packages (scripts/install-system-deps.sh; the compiler the llama-server build needs is among them)
#   2. vLLM's CPU build (scripts/install-vllm.sh) and llama-server (scripts/install-llamacpp.sh), in the background:
#      downloads and a compile that the stages below do not wait for
#   3. oomguard and its test tools in .venv, ruff, the drift check of generated files
#   4. pytest on TEST_WORKERS workers (pytest-xdist, a module per worker at a time: a module's fixtures are made
#      once), the longest modules first (tests/conftest.py); with the real engines' tests if their installs are done
#   5. the real engines' tests left out of stage 4, once their installs are done
# Once installed, stages 1 to 3 take seconds and stage 5 has nothing left to run.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
WORKERS="${TEST_WORKERS:-4}"
logs="$(mktemp -d "${TMPDIR:-/tmp}/oomguard-make-test.XXXXXX")"
begun=$(date +%s)
pids=()
trap 'for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done' EXIT

say() { echo "make test: [$(( $(date +%s) - begun )) s] $*"; }

# stage NAME COMMAND...: runs it in the foreground, says how long it took (or that it failed, and exits).
stage() {
    local name=$1 started
    shift
    started=$(date +%s)
    say "$name ..."
    if ! "$@"; then
        say "$name FAILED after $(( $(date +%s) - started )) s"
        exit 1
    fi
    say "$name done in $(( $(date +%s) - started )) s"
}

# background NAME LOG COMMAND...: runs it beside the stages that follow; `finished NAME` waits for it.
declare -A job_pid job_log job_start
background() {
    local name=$1 log=$2
    shift 2
    job_start[$name]=$(date +%s)
    job_log[$name]=$log
    say "$name ... (in the background: $log)"
    # Its end time noted when it ends, so that its duration is its own, not the wait for it.
    { "$@" && status=0 || status=$?; date +%s >"$log.end"; exit "$status"; } >"$log" 2>&1 &
    job_pid[$name]=$!
    pids+=("$!")
}
# ready NAME: true once the job has ended (well or not).
ready() { ! kill -0 "${job_pid[$1]}" 2>/dev/null; }
finished() {
    local name=$1 status=0 ended
    wait "${job_pid[$name]}" || status=$?
    ended=$(cat "${job_log[$name]}.end" 2>/dev/null || date +%s)
    cat "${job_log[$name]}"
    if [ "$status" -ne 0 ]; then
        say "$name FAILED after $(( ended - job_start[$name] )) s"
        exit 1
    fi
    say "$name done in $(( ended - job_start[$name] )) s"
}

stage "Debian packages" scripts/install-system-deps.sh
background "vLLM CPU build" "$logs/vllm.log" scripts/install-vllm.sh
background "llama-server" "$logs/llamacpp.log" scripts/install-llamacpp.sh
stage "oomguard and its test tools" make --no-print-directory install-test PYTHON="$PYTHON" VENV="$VENV"
stage "ruff" make --no-print-directory lint VENV="$VENV"
stage "generated files" make --no-print-directory check-generated VENV="$VENV"

export OOMGUARD_REQUIRE_REALVLLM=1 OOMGUARD_REQUIRE_REALLAMACPP=1
pytest=("$VENV/bin/python" -m pytest -n "$WORKERS" --dist loadscope --no-loadscope-reorder)
later=()
ready "vLLM CPU build" || later+=(realvllm)
ready "llama-server" || later+=(realllamacpp)
if [ ${#later[@]} -eq 0 ]; then
    finished "vLLM CPU build"
    finished "llama-server"
    stage "pytest on $WORKERS workers" "${pytest[@]}"
else
    # Installs still running: everything else now, their tests after them.
    skip="not ${later[0]}"
    [ ${#later[@]} -eq 2 ] && skip="$skip and not ${later[1]}"
    stage "pytest on $WORKERS workers, without $(IFS=,; echo "${later[*]}") (still installing)" \
        "${pytest[@]}" -m "$skip"
    finished "vLLM CPU build"
    finished "llama-server"
    only="${later[0]}"
    [ ${#later[@]} -eq 2 ] && only="$only or ${later[1]}"
    stage "pytest of $only" "${pytest[@]}" -m "$only"
fi
rm -rf "$logs"
say "all passed in $(( $(date +%s) - begun )) s"
