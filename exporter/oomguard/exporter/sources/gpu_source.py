"""The GPU sources: where the GPUs' memory is read, one source per exporter, chosen by the configuration.

A source reads every GPU it knows into one `GpuReadings` (model.py); the collection (each scrape) and the trend
sampler (each tick) call its `read`, through nothing that knows which source it is. Two are registered: NVML on this
host (sources/nvml_reader.py) and NVIDIA's dcgm-exporter, on one node or every node (sources/dcgm.py).

To add a GPU source (docs/architecture.md, "How to add a GPU source"): write its reader (a `GpuSource`), its
configuration key (config.py), its `GpuSourcePlugin` below and its line in GPU_SOURCE_PLUGINS, before those it
replaces; its name in model.py's GPU_SOURCES; its section in docs/configuration.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from oomguard.common.engine_client import EngineClient
from oomguard.exporter.config import Config
from oomguard.exporter.model import GpuReadings
from oomguard.exporter.sources.dcgm import DcgmEndpoint, DcgmReader
from oomguard.exporter.sources.dcgm_body import Fields
from oomguard.exporter.sources.nvml import NvmlSource
from oomguard.exporter.sources.nvml_reader import NvmlReader


@runtime_checkable
class GpuSource(Protocol):
    """Reads the GPUs: every scrape and every trend tick, concurrent callers possibly."""

    name: str  # the `source` label of oomguard_source_success{source}; one of model.py's GPU_SOURCES

    async def read(self) -> GpuReadings:
        """Every GPU it reads, `up=False` with an `error` where it reads none; raises TimeoutError past its
        timeout (the scrape and the tick go on without GPUs). Blocking work runs off the event loop."""
        ...

    def close(self) -> None:
        """Lets go of what it holds; called once, in a worker thread, when the runtime stops."""
        ...


@dataclass(frozen=True, slots=True)
class GpuSourceContext:
    """What the runtime has for a source's builder besides the configuration."""

    client: EngineClient  # the runtime's HTTP client (an exporter's /metrics read over HTTP)
    nvml_lib: ModuleType | Any | None  # pynvml, a stand-in or the simulation's; None: no NVML here
    # Where dcgm-exporter runs, as the Kubernetes discovery finds it (the cluster mode); None without discovery.
    dcgm_endpoints: Callable[[], Sequence[DcgmEndpoint]] | None = None


@dataclass(frozen=True, slots=True)
class GpuSourcePlugin:
    """A kind of GPU source: its name, the configuration key that turns it on, and how it is built and described."""

    name: str  # the `source` label, its `GpuSource.name`
    config_key: str  # the top-level key of the configuration (config.py's Config) that holds its settings
    title: str  # what it reads, in a few words
    chosen: Callable[[Config], bool]  # whether the configuration reads the GPUs from it
    build: Callable[[Config, GpuSourceContext], GpuSource | None]  # None: nothing to read it with here
    describe: Callable[[Config], str]  # its line of `oomguard check-config` (describe.py)


def _nvml_chosen(config: Config) -> bool:
    return config.nvml.enabled


def _build_nvml(config: Config, context: GpuSourceContext) -> GpuSource | None:
    if context.nvml_lib is None:
        return None  # a runtime built without GPUs (nvml_lib=None)
    source = NvmlSource(context.nvml_lib, per_process=config.nvml.per_process, node=config.local_node)
    return NvmlReader(source, config.nvml.timeout_seconds)


def _describe_nvml(config: Config) -> str:
    if config.nvml.per_process:
        return "GPUs: every GPU NVML finds, with each process's memory (nvml.per_process: true)"
    return "GPUs: every GPU NVML finds, with no per-process memory (nvml.per_process: false)"


def _dcgm_chosen(config: Config) -> bool:
    return config.dcgm is not None


def _build_dcgm(config: Config, context: GpuSourceContext) -> GpuSource | None:
    dcgm = config.dcgm
    assert dcgm is not None
    configured = [DcgmEndpoint(url, config.local_node) for url in dcgm.urls]
    endpoints = context.dcgm_endpoints if dcgm.discover and context.dcgm_endpoints is not None else lambda: configured
    return DcgmReader(
        context.client, endpoints, timeout_seconds=dcgm.timeout_seconds, max_body_bytes=dcgm.max_body_bytes,
        fields=Fields(**dcgm.fields.model_dump()),
    )  # fmt: skip


def _describe_dcgm(config: Config) -> str:
    dcgm = config.dcgm
    assert dcgm is not None
    if dcgm.discover:
        return (
            f"GPUs: every node's, from its dcgm-exporter pod ({dcgm.label_selector} in {', '.join(dcgm.namespaces)}, "
            f"port {dcgm.port}, controlled by DaemonSet {' or '.join(dcgm.daemonsets)}); no per-process memory, no XIDs"
        )
    return f"GPUs: this node's, from dcgm-exporter at {', '.join(dcgm.urls)}; no per-process memory, no XIDs"


NVML = GpuSourcePlugin(
    name="nvml", config_key="nvml", title="NVML on this host (pynvml)", chosen=_nvml_chosen, build=_build_nvml,
    describe=_describe_nvml,
)  # fmt: skip
DCGM = GpuSourcePlugin(
    name="dcgm", config_key="dcgm", title="NVIDIA's dcgm-exporter, this node's or every node's",
    chosen=_dcgm_chosen, build=_build_dcgm, describe=_describe_dcgm,
)  # fmt: skip

# The first the configuration turns on is read: a source that replaces NVML (set only where NVML may not be read)
# stands before it, NVML (on by default) last.
GPU_SOURCE_PLUGINS: dict[str, GpuSourcePlugin] = {plugin.name: plugin for plugin in (DCGM, NVML)}
NO_GPUS = "GPUs: none (nvml.enabled is false): no GPU memory, no memory alerts"


def chosen_gpu_source(config: Config) -> GpuSourcePlugin | None:
    """The GPU source the configuration reads from; None: no GPUs read."""
    return next((plugin for plugin in GPU_SOURCE_PLUGINS.values() if plugin.chosen(config)), None)


def build_gpu_source(config: Config, context: GpuSourceContext) -> GpuSource | None:
    """The configuration's GPU source, built; None when it reads no GPUs."""
    plugin = chosen_gpu_source(config)
    return plugin.build(config, context) if plugin is not None else None  # fmt: skip


def describe_gpus(config: Config) -> str:
    """The configuration's GPUs in one line (`oomguard check-config`)."""
    plugin = chosen_gpu_source(config)
    return plugin.describe(config) if plugin is not None else NO_GPUS
