# syntax=docker/dockerfile:1
# Build: docker build -t oomguard .
# Run on a GPU host (NVML comes from the NVIDIA container toolkit; host PID namespace so
# NVML's pids map to processes):
#   docker run --gpus all --pid=host -p 9847:9847 -v $PWD/oomguard.yaml:/etc/oomguard/oomguard.yaml oomguard
# Try it without a GPU: docker run -p 9847:9847 oomguard serve --simulate overcommit

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin oomguard
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY deploy/oomguard.yaml /etc/oomguard/oomguard.yaml
# state_dir of the example configuration: event read positions and counts.
RUN mkdir -p /var/lib/oomguard && chown 10001 /var/lib/oomguard
VOLUME /var/lib/oomguard
USER 10001
EXPOSE 9847
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9847/-/healthy', timeout=4).status == 200 else 1)"]
ENTRYPOINT ["oomguard"]
CMD ["serve", "--config", "/etc/oomguard/oomguard.yaml"]
