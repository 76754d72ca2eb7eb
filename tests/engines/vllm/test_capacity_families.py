"""vLLM's requests refused at admission and its KV offloading families, read and exported.

`vllm-0.32.0-kv-offload.txt` is the 0.32 body under load with the families vLLM 0.32.0's own metric code writes
with KV offloading to CPU (tests/fixtures/vllm/README.md): the flat `vllm:kv_offload_{load,store}_bytes_total`,
`vllm:kv_offload_allocation_failure_total`, and the older `vllm:kv_offload_total_bytes_total{transfer_type}` still
written beside them; and `vllm:admission_rejections_total{reason}` at 7 refusals.
"""

from __future__ import annotations

from aiohttp import web
from support import samples, value, vllm_body

from oomguard.common.promtext import FamilyExtractor
from oomguard.exporter.config_loader import load_config
from oomguard.exporter.engines.vllm.reader import VllmReader
from oomguard.exporter.model import EngineReading
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app

OFFLOAD = "vllm-0.32.0-kv-offload.txt"


def read(body: str) -> EngineReading:
    return VllmReader().read(FamilyExtractor(VllmReader.families).extract(body))


def without(body: str, *prefixes: str) -> str:
    """The body less every line (samples, HELP, TYPE) of the families whose names start with one of `prefixes`."""

    def name(line: str) -> str:
        return line.split(" ")[2] if line.startswith("# ") else line.split("{")[0].split(" ")[0]

    return "".join(line + "\n" for line in body.splitlines() if not name(line).startswith(prefixes))


def test_the_offloading_families_and_the_refusals_are_read() -> None:
    (model,) = read(vllm_body(OFFLOAD)).models
    assert model.admission_rejections_total == 7.0  # 7 for max_num_queued_reqs, 0 for max_num_queued_tokens
    assert model.kv_offload_store_bytes_total == 805306368.0
    assert model.kv_offload_load_bytes_total == 268435456.0
    assert model.kv_offload_allocation_failures_total == 2.0


def test_before_the_flat_names_the_transfer_type_counter_is_read() -> None:
    """Releases before the flat names (and out-of-tree specs, which skip the old family) write one counter with
    `transfer_type`: a direction into the GPU is a load, out of it a store, whatever the case of its medium."""
    body = without(vllm_body(OFFLOAD), "vllm:kv_offload_load_bytes", "vllm:kv_offload_store_bytes")
    body = body.replace('transfer_type="CPU_to_GPU"', 'transfer_type="cpu_to_gpu"')
    (model,) = read(body).models
    assert (model.kv_offload_store_bytes_total, model.kv_offload_load_bytes_total) == (805306368.0, 268435456.0)


def test_an_engine_without_offloading_has_no_offload_figures_and_counts_its_refusals() -> None:
    (model,) = read(vllm_body("vllm-0.32.0-cpu-under-load.txt")).models
    assert model.admission_rejections_total == 0.0  # 0.32 writes both reasons from its start
    assert model.kv_offload_store_bytes_total is None
    assert model.kv_offload_load_bytes_total is None
    assert model.kv_offload_allocation_failures_total is None
    (old,) = read(vllm_body("vllm-0.10.x-gpu-ngc.txt")).models
    assert old.admission_rejections_total is None  # not in 0.10


def test_data_parallel_ranks_are_summed() -> None:
    body = (
        "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1\n"
        "vllm:kv_offload_store_bytes_total{engine=\"0\",model_name=\"m\"} 100\n"
        "vllm:kv_offload_store_bytes_total{engine=\"1\",model_name=\"m\"} 50\n"
        "vllm:kv_offload_allocation_failure_total{engine=\"1\",model_name=\"m\"} 3\n"
        "vllm:admission_rejections_total{model_name=\"m\",reason=\"max_num_queued_reqs\"} 4\n"
        "vllm:admission_rejections_total{model_name=\"m\",reason=\"max_num_queued_tokens\"} 5\n"
    )  # fmt: skip
    (model,) = read(body).models
    assert (model.kv_offload_store_bytes_total, model.kv_offload_allocation_failures_total) == (150.0, 3.0)
    assert model.kv_offload_load_bytes_total is None  # no load yet: vLLM makes the series at its first
    assert model.admission_rejections_total == 9.0


async def test_they_are_exported_per_served_model(aiohttp_server, aiohttp_client) -> None:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=vllm_body(OFFLOAD))

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    server = await aiohttp_server(app)
    config = load_config(
        None,
        {
            "targets": [{"name": "offloading", "url": f"http://127.0.0.1:{server.port}"}],
            "nvml": {"enabled": False}, "events": {"kernel_log": False, "xid": False}, "discovery": {"local": "off"},
            "trend": {"enabled": False},
        },
    )  # fmt: skip
    client = await aiohttp_client(make_app(Runtime(config, nvml_lib=None)))
    text = await (await client.get("/metrics")).text()
    labels = {"target": "offloading", "model_name": "tiny"}
    assert value(text, "oomguard_engine_admission_rejections_total", **labels) == 7.0
    assert value(text, "oomguard_engine_kv_offload_store_bytes_total", **labels) == 805306368.0
    assert value(text, "oomguard_engine_kv_offload_load_bytes_total", **labels) == 268435456.0
    assert value(text, "oomguard_engine_kv_offload_allocation_failures_total", **labels) == 2.0
    assert not [name for name, _ in samples(text) if name.startswith("vllm:")]
