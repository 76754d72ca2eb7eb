# syntax=docker/dockerfile:1
# The node agent's image: what the DaemonSet (deploy/kubernetes) and hosts without systemd run.
#
# Build:           docker build -t oomguard:0.1.0 .
# Air-gapped:      pip wheel . -w dist && docker build -t oomguard:0.1.0 .
#   With wheels in dist/ (the project's and every dependency's) the image installs from them alone
#   (pip --no-index): no package index is asked. Another base: --build-arg BASE_IMAGE=...
#   (a Debian-like image with Python 3.11+, pip and venv).
#
# Run on a GPU host (local discovery: no configuration needed):
#   docker run -d --name oomguard --network host --pid host --gpus all \
#     -v oomguard-state:/var/lib/oomguard --read-only --cap-drop ALL oomguard:0.1.0
# --network host: the engines' 127.0.0.1 ports are the host's (a bridged container's 127.0.0.1 is its own).
# --pid host: NVML's pids and the engines' command lines (local discovery) are the host's processes.
# --gpus all: the NVIDIA container toolkit mounts the driver's NVML (without it: oomguard_nvml_up 0).
# A configuration of your own: -v $PWD/oomguard.yaml:/etc/oomguard/oomguard.yaml:ro (state_dir
# /var/lib/oomguard keeps read positions and counts on the volume).
# Engines' logs: mount them read-only; files only root may read need --user 0 (see below).
# TLS and basic auth: -v $PWD/web:/etc/oomguard-web:ro -e OOMGUARD_WEB_CONFIG_FILE=/etc/oomguard-web/web-config.yml
#   (the environment variable rather than --web.config.file: the HEALTHCHECK reads it too; so for another
#   port, -e OOMGUARD_WEB_LISTEN_ADDRESS=:PORT rather than --web.listen-address).
# Try it without a GPU: docker run -p 127.0.0.1:9847:9847 oomguard:0.1.0 serve --simulate incident
#
# User: uid 10001 by default. The DaemonSet runs it as uid 0 with every capability dropped
# (runAsUser: 0, capabilities drop ALL, read-only root file system): the kubelet's pod logs and the hostPath
# state dir are root's, and uid 0 without capabilities reads only what it owns (docs/kubernetes.md).
# `docker run --user 0 --cap-drop ALL --read-only` is the same on a host.

ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY . .
# The project in a virtual environment of its own, copied whole into the final stage: no pip, no wheels
# and no build files there. From dist/ when it holds wheels (pip wheel . -w dist), else from the source.
# Without the `report` extra: matplotlib serves only `oomguard diagnose --report`, not the node agent.
RUN python -m venv /opt/oomguard \
    && if ls dist/*.whl >/dev/null 2>&1; then \
           /opt/oomguard/bin/pip install --no-cache-dir --no-index --find-links dist oomguard; \
       else \
           /opt/oomguard/bin/pip install --no-cache-dir . ; \
       fi \
    && /opt/oomguard/bin/pip uninstall --yes pip \
    && /opt/oomguard/bin/oomguard --version

FROM ${BASE_IMAGE}
RUN useradd --uid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin oomguard
COPY --from=build /opt/oomguard /opt/oomguard
ENV PATH=/opt/oomguard/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    OOMGUARD_CONFIG=/etc/oomguard/oomguard.yaml
# The default configuration: nothing but the state dir, so local discovery finds the host's engines (with
# --pid host). The DaemonSet mounts its ConfigMap over /etc/oomguard; `docker run -v` a file of your own.
RUN mkdir -p /etc/oomguard /var/lib/oomguard \
    && printf '# oomguard in its container: engines found on this host (discovery.local: auto).\nstate_dir: /var/lib/oomguard\n' \
        > /etc/oomguard/oomguard.yaml \
    && chown 10001 /var/lib/oomguard
VOLUME /var/lib/oomguard
USER 10001
EXPOSE 9847
# http or https under the web configuration ($OOMGUARD_WEB_CONFIG_FILE; without it http, then https), and a
# 401 behind basic auth counts as an answer: oomguard/exporter/healthcheck.py.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 CMD ["oomguard", "healthcheck"]
ENTRYPOINT ["oomguard"]
CMD ["serve"]
