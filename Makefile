# Quick start (a fresh Debian/Ubuntu machine with Python 3.11+):
#   make run    installs oomguard in .venv and runs it on the built-in simulation
#               (make run SCENARIO=slow-leak TIME_SCALE=1 LISTEN=:9848: the variables below)
#   make test   installs everything the tests need and runs the whole suite (TEST_WORKERS=4 pytest workers)
#   make image  builds the container image oomguard:VERSION with podman or docker (no registry holds it)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SCENARIO ?= incident
# The quick start replays the incident 10x faster than life: engine data after 24 s, the first OOM after about
# 1.5 minutes, the restart loop after it. TIME_SCALE=1 is real speed (the first OOM after 14 minutes).
TIME_SCALE ?= 10
LISTEN ?= :9847
# make test's pytest workers: the suite waits on clocks and servers more than it computes (4 on 2 cores).
TEST_WORKERS ?= 4
# The image: no registry holds it, so it is built here and pushed to yours (README, "Run it for real").
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= oomguard:$(VERSION)
# podman where it is installed, else docker; CONTAINER="podman --runtime runc" passes its own flags.
CONTAINER ?= $(shell command -v podman || command -v docker)
# Another base than the Dockerfile's python:3.11-slim, e.g. one in your registry.
BASE_IMAGE ?=

.PHONY: run test install install-test deps lint unit check-generated generate docs clean image

$(BIN)/oomguard: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e .
	touch $@

install: $(BIN)/oomguard

run: install
	$(BIN)/oomguard serve --simulate $(SCENARIO) --simulate.time-scale $(TIME_SCALE) --web.listen-address $(LISTEN)

install-test: install
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'

deps:
	scripts/install-system-deps.sh
	scripts/install-vllm.sh
	scripts/install-llamacpp.sh

lint: install-test
	$(BIN)/ruff check exporter tests bench scripts examples
	$(BIN)/ruff format --check exporter tests bench scripts examples

# Everything installed, then the suite on TEST_WORKERS pytest workers; a line per stage with its time (the stages:
# scripts/test.sh). The installs of vLLM and llama-server run beside the others; once done, they are skipped.
test:
	PYTHON=$(PYTHON) VENV=$(VENV) TEST_WORKERS=$(TEST_WORKERS) scripts/test.sh

# Generated files must match their generator: regenerate into a scratch folder and diff. deploy/kubernetes/ and
# deploy/kubernetes-cluster/ hold copies of the PrometheusRule and the dashboards (kustomize reads no file outside
# its folder).
check-generated: install
	@tmp=$$(mktemp -d); \
	$(BIN)/oomguard docs --output $$tmp/metrics.md >/dev/null; \
	$(BIN)/oomguard generate --output $$tmp >/dev/null; \
	diff -u docs/metrics.md $$tmp/metrics.md && diff -ru rules $$tmp/rules -x tests && diff -ru dashboards $$tmp/dashboards \
	  && diff -u deploy/kubernetes/prometheusrule.yaml $$tmp/deploy/kubernetes/prometheusrule.yaml \
	  && diff -ru deploy/kubernetes/dashboards $$tmp/deploy/kubernetes/dashboards \
	  && diff -u deploy/kubernetes-cluster/prometheusrule.yaml $$tmp/deploy/kubernetes-cluster/prometheusrule.yaml \
	  && diff -ru deploy/kubernetes-cluster/dashboards $$tmp/deploy/kubernetes-cluster/dashboards \
	  || { echo "generated files are stale: run make generate and commit the result"; rm -rf $$tmp; exit 1; }; \
	rm -rf $$tmp; echo "check-generated: up to date"

generate: install
	$(BIN)/oomguard docs --output docs/metrics.md
	$(BIN)/oomguard generate --output .

image:
	@test -n "$(CONTAINER)" || { echo "make image: neither podman nor docker is installed: apt-get install podman (or install Docker)"; exit 1; }
	$(CONTAINER) build $(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) -t $(IMAGE) .

clean:
	rm -rf $(VENV) .venv-vllm .pytest_cache .ruff_cache .hypothesis exporter/*.egg-info
