"""The GPU sources' registry (sources/gpu_source.py): each registered source has what docs/architecture.md's recipe,
"How to add a GPU source", asks of it, and the configuration chooses one.

A registered source must have: its configuration key, a key of config.py's `Config`, with its section in
docs/configuration.md; its name in model.py's GPU_SOURCES (the `source` label the exposition reads the GPUs under);
an example configuration below that chooses it; a built source that is a `GpuSource` of its name and reads a
`GpuReadings`; a line of `oomguard check-config`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from oomguard.common.engine_client import EngineClient
from oomguard.common.ports import free_port
from oomguard.exporter.config import Config
from oomguard.exporter.model import GPU_SOURCES, GpuReadings
from oomguard.exporter.sources.gpu_source import (
    DCGM,
    GPU_SOURCE_PLUGINS,
    NO_GPUS,
    NVML,
    GpuSource,
    GpuSourceContext,
    GpuSourcePlugin,
    build_gpu_source,
    chosen_gpu_source,
    describe_gpus,
)
from oomguard.simulate.fake_nvml import FakeNvml

ROOT = Path(__file__).resolve().parents[2]

# A configuration that reads the GPUs from each source, offline: NVML through the fake library, dcgm-exporter at a
# port nobody listens on (its read says so: up 0 and the error).
EXAMPLES: dict[str, dict[str, Any]] = {
    "nvml": {},
    "dcgm": {"dcgm": {"urls": [f"http://127.0.0.1:{free_port()}/metrics"], "timeout_seconds": 2}},
}


async def problems(plugins: Mapping[str, GpuSourcePlugin], client: EngineClient) -> list[str]:
    """What each registered source lacks of the recipe, one line each."""
    config_doc = (ROOT / "docs" / "configuration.md").read_text()
    out: list[str] = []
    for name, plugin in plugins.items():
        if plugin.name != name:
            out.append(f"{name}: registered under another name than its own ({plugin.name!r})")
        if plugin.config_key not in Config.model_fields:
            out.append(f"{name}: its config_key {plugin.config_key!r} is no key of config.py's Config")
        if f"## `{plugin.config_key}`" not in config_doc:
            out.append(f"{name}: docs/configuration.md has no section ## `{plugin.config_key}`")
        if name not in GPU_SOURCES:
            out.append(f"{name}: not in model.py's GPU_SOURCES (the exposition reads no GPUs under its name)")
        if name not in EXAMPLES:
            out.append(f"{name}: no example configuration in EXAMPLES (tests/sources/test_gpu_sources.py)")
            continue
        config = Config.model_validate(EXAMPLES[name])
        chosen = chosen_gpu_source(config)
        if chosen is not plugin:
            out.append(f"{name}: its example configuration reads {chosen.name if chosen else 'no GPUs'}")
            continue
        if not plugin.describe(config).startswith("GPUs: "):
            out.append(f"{name}: its check-config line does not start with 'GPUs: '")
        source = plugin.build(config, GpuSourceContext(client, FakeNvml()))
        if not isinstance(source, GpuSource) or source.name != name:
            out.append(f"{name}: its build gives {source!r}, not a GpuSource named {name!r}")
            continue
        try:
            reading = await source.read()
        finally:
            source.close()
        if not isinstance(reading, GpuReadings):
            out.append(f"{name}: its read gives {type(reading).__name__}, not GpuReadings")
    unregistered = [name for name in GPU_SOURCES if name not in plugins]
    out += [f"{name}: in model.py's GPU_SOURCES, but no source is registered" for name in unregistered]
    return out


async def test_every_registered_gpu_source_has_what_the_recipe_asks() -> None:
    client = EngineClient()
    try:
        assert await problems(GPU_SOURCE_PLUGINS, client) == []
    finally:
        await client.close()


async def test_a_source_registered_alone_is_named_for_each_step_it_lacks() -> None:
    """The check can fail: a source registered in gpu_source.py and nowhere else is named for each missing step."""
    amd = GpuSourcePlugin(
        name="amd_smi", config_key="amd_smi", title="AMD's amd-smi exporter", chosen=lambda config: False,
        build=NVML.build, describe=NVML.describe,
    )  # fmt: skip
    client = EngineClient()
    try:
        found = await problems({**GPU_SOURCE_PLUGINS, "amd_smi": amd}, client)
    finally:
        await client.close()
    assert found == [
        "amd_smi: its config_key 'amd_smi' is no key of config.py's Config",
        "amd_smi: docs/configuration.md has no section ## `amd_smi`",
        "amd_smi: not in model.py's GPU_SOURCES (the exposition reads no GPUs under its name)",
        "amd_smi: no example configuration in EXAMPLES (tests/sources/test_gpu_sources.py)",
    ]
    # and one named in GPU_SOURCES without its plugin
    only_nvml = {"nvml": NVML}
    client = EngineClient()
    try:
        assert await problems(only_nvml, client) == ["dcgm: in model.py's GPU_SOURCES, but no source is registered"]
    finally:
        await client.close()


def test_the_first_source_the_configuration_turns_on_is_read() -> None:
    dcgm = {"dcgm": {"urls": ["http://127.0.0.1:9400/metrics"]}}
    assert chosen_gpu_source(Config()) is NVML  # NVML is on by default
    assert chosen_gpu_source(Config.model_validate(dcgm)) is DCGM  # dcgm: replaces NVML, left on
    assert chosen_gpu_source(Config.model_validate({**dcgm, "nvml": {"enabled": False}})) is DCGM
    off = Config.model_validate({"nvml": {"enabled": False}})
    assert chosen_gpu_source(off) is None
    assert describe_gpus(off) == NO_GPUS


def test_nvml_without_a_library_reads_no_gpus() -> None:
    """A runtime built with nvml_lib=None (no GPUs): NVML chosen, nothing built to read it with."""
    assert build_gpu_source(Config(), GpuSourceContext(EngineClient(), None)) is None
