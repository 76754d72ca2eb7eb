"""The figures each engine gives once it serves, and oomguard_engine_figure_read: a renamed metric shows as a 0.

Every recorded body of tests/fixtures/ has the figures its engine declares (but those fetched apart:
SGLang's reservation from /server_info, llama.cpp's KV use from /slots), so the declaration cries no
wolf; and a real scrape of a vLLM whose KV family was renamed reads 0 for that figure, 1 for the others.
"""

from __future__ import annotations

import pytest
from aiohttp import web
from support import FIXTURES, samples

from oomguard.common.promtext import FamilyExtractor
from oomguard.exporter.config_loader import load_config
from oomguard.exporter.engines import ENGINES
from oomguard.exporter.engines.base import figures_read
from oomguard.exporter.model import FIGURES
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app

FETCHED_APART = {("sglang", "reservation"), ("llamacpp", "kv_cache_usage")}
BODIES = sorted(
    (engine, path.name)
    for engine in ENGINES
    for path in (FIXTURES / engine).glob("*")
    if path.suffix in (".prom", ".txt")
)


def test_every_engine_declares_known_figures() -> None:
    for engine, plugin in ENGINES.items():
        assert plugin.figures and set(plugin.figures) <= set(FIGURES), engine


@pytest.mark.parametrize(("engine", "name"), BODIES)
def test_a_recorded_body_has_every_figure_its_engine_declares(engine: str, name: str) -> None:
    reader = ENGINES[engine].reader()
    reading = reader.read(FamilyExtractor(reader.families).extract((FIXTURES / engine / name).read_text()))
    missing = [f for f, read in figures_read(ENGINES[engine].figures, reading).items() if not read]
    assert [f for f in missing if (engine, f) not in FETCHED_APART] == []


async def test_a_renamed_family_reads_as_a_missing_figure(aiohttp_server, aiohttp_client) -> None:
    body = (FIXTURES / "vllm" / "vllm-0.32.0-cpu-under-load.txt").read_text()
    renamed = body.replace("vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_fraction")  # a future rename

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=renamed if request.match_info["which"] == "renamed" else body)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/{which}/metrics", metrics)
    app.router.add_get("/{which}/health", health)
    server = await aiohttp_server(app)
    base = f"http://127.0.0.1:{server.port}"
    config = load_config(
        None,
        {
            "targets": [{"name": "renamed", "url": "http://127.0.0.1:9"}, {"name": "current", "url": "http://127.0.0.1:9"}],
            "nvml": {"enabled": False}, "events": {"kernel_log": False, "xid": False}, "discovery": {"local": "off"},
            "trend": {"enabled": False},
        },
    )  # fmt: skip
    # Tests only: each target's URL gets its path (configured URLs take no path).
    config = config.model_copy(
        update={"targets": tuple(t.model_copy(update={"url": f"{base}/{t.name}"}) for t in config.targets)}
    )
    client = await aiohttp_client(make_app(Runtime(config, nvml_lib=None)))
    found = samples(await (await client.get("/metrics")).text())
    read = {
        (dict(labels)["target"], dict(labels)["figure"]): value
        for (name, labels), value in found.items()
        if name == "oomguard_engine_figure_read"
    }
    assert read == {
        **{("current", f): 1.0 for f in ENGINES["vllm"].figures},
        **{("renamed", f): 1.0 for f in ENGINES["vllm"].figures if f != "kv_cache_usage"},
        ("renamed", "kv_cache_usage"): 0.0,
    }
