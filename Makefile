# Quick start (a fresh Debian/Ubuntu machine with Python 3.11+):
#   make run    installs oomguard in .venv and runs it on the built-in simulation
#               (make run SCENARIO=slow-leak TIME_SCALE=1 LISTEN=:9848: the variables below)
#   make test   installs everything the tests need and runs the whole suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SCENARIO ?= incident
# The quick start replays the incident 10x faster than life: engine data after 24 s, the first OOM after about
# 1.5 minutes, the restart loop after it. TIME_SCALE=1 is real speed (the first OOM after 14 minutes).
TIME_SCALE ?= 10
LISTEN ?= :9847

.PHONY: run test install install-test deps lint unit check-generated generate docs clean

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
	$(BIN)/ruff check exporter tests bench
	$(BIN)/ruff format --check exporter tests bench

test: deps install-test lint check-generated
	OOMGUARD_REQUIRE_REALVLLM=1 OOMGUARD_REQUIRE_REALLAMACPP=1 $(BIN)/python -m pytest

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

clean:
	rm -rf $(VENV) .venv-vllm .pytest_cache .ruff_cache .hypothesis exporter/*.egg-info
