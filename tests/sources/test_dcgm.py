"""dcgm-exporter as the GPU source (sources/dcgm.py): every endpoint read at once, each node's GPUs in bytes with
their pods, and each way one endpoint fails leaving the others' GPUs whole and saying why."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from support import FIXTURES

from oomguard.common.engine_client import EngineClient
from oomguard.exporter.model import GpuReadings
from oomguard.exporter.sources.dcgm import DcgmEndpoint, DcgmReader
from oomguard.exporter.sources.dcgm_body import parse as parse_body

MIB = 1048576
K8S_BODY = (FIXTURES / "dcgm" / "dcgm-3.x-kubernetes-2gpu.prom").read_text()
HOSTNAME_BODY = (FIXTURES / "dcgm" / "dcgm-main-lowercase-hostname-2gpu.prom").read_text()
BYTES_BODY = (FIXTURES / "dcgm" / "dcgm-4.10-bytes-2gpu.prom").read_text()


class Endpoints:
    """dcgm-exporter stand-ins on one server: /good (the fixture), /slow, /huge, /vllm (not dcgm), /503."""

    def __init__(self) -> None:
        self.requests = 0
        self.body = K8S_BODY
        app = web.Application()
        app.router.add_get("/good", self._good)
        app.router.add_get("/hostname", self._hostname)
        app.router.add_get("/bytes", self._bytes)
        app.router.add_get("/slow", self._slow)
        app.router.add_get("/huge", self._huge)
        app.router.add_get("/vllm", self._vllm)
        app.router.add_get("/503", self._unavailable)
        self.app = app

    async def _good(self, request: web.Request) -> web.Response:
        self.requests += 1
        await asyncio.sleep(0.05)  # long enough for two readers to overlap
        return web.Response(text=self.body)

    async def _hostname(self, request: web.Request) -> web.Response:
        return web.Response(text=HOSTNAME_BODY)

    async def _bytes(self, request: web.Request) -> web.Response:
        return web.Response(text=BYTES_BODY)

    async def _slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response(text=K8S_BODY)

    async def _huge(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        chunk = b"# " + b"x" * 65534 + b"\n"
        for _ in range(1000):  # 64 MB, endlessly for the reader's purposes
            await response.write(chunk)
        return response

    async def _vllm(self, request: web.Request) -> web.Response:
        return web.Response(text=(FIXTURES / "vllm" / "vllm-0.32.0-cpu-under-load.txt").read_text())

    async def _unavailable(self, request: web.Request) -> web.Response:
        return web.Response(status=503, text="starting")


@pytest.fixture
async def server(aiohttp_server) -> tuple[str, Endpoints]:
    endpoints = Endpoints()
    served = await aiohttp_server(endpoints.app, shutdown_timeout=0.1)
    return f"http://127.0.0.1:{served.port}", endpoints


async def test_each_nodes_gpus_in_bytes_with_their_pods(server: tuple[str, Endpoints]) -> None:
    base, _ = server
    async with EngineClient() as client:
        reader = DcgmReader(
            client,
            lambda: [DcgmEndpoint(f"{base}/good", "gpu-a"), DcgmEndpoint(f"{base}/hostname", "")],
            timeout_seconds=2.0,
            max_body_bytes=1 << 20,
        )
        reading = await reader.read()
    assert reading.up and not reading.error
    keys = [g.key for g in reading.gpus]
    # A discovered endpoint's node is its pod's; a configured one's the exporter's own ("" outside Kubernetes), not
    # the body's hostname label: its GPUs are those its configured targets name.
    assert keys == [("", "0"), ("", "1"), ("gpu-a", "0"), ("gpu-a", "1")]
    gpu = reading.gpus[2]
    assert gpu.used_bytes is not None and gpu.used_bytes % MIB == 0 and gpu.total_bytes
    assert gpu.processes is None  # not published: absent, not "no processes"
    assert any(g.pods for g in reading.gpus[2:])


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/slow", "no answer within 0.5s"),
        ("/huge", "body over 1048576 bytes (dcgm.max_body_bytes)"),
        ("/vllm", "no DCGM_FI_DEV_FB_USED_BYTES, DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_FB_FREE_BYTES or DCGM_FI_DEV_FB_"),
        ("/503", "HTTP 503"),
    ],
)
async def test_one_endpoint_failing_leaves_the_others_and_says_why(
    server: tuple[str, Endpoints], path: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    base, _ = server
    async with EngineClient() as client:
        reader = DcgmReader(
            client,
            lambda: [DcgmEndpoint(f"{base}/good", "gpu-a"), DcgmEndpoint(f"{base}{path}", "gpu-b")],
            timeout_seconds=0.5,
            max_body_bytes=1 << 20,
        )
        reading = await reader.read()
        assert reading.up  # gpu-a answers
        assert {g.node for g in reading.gpus} == {"gpu-a"}
        assert why in reading.error and "gpu-b" in reading.error
        # Logged once while it fails, not at every read.
        await reader.read()
    said = [r.getMessage() for r in caplog.records if why in r.getMessage()]
    assert len(said) == 1, said


async def test_no_endpoint_is_no_gpu_source_and_says_where_to_look() -> None:
    async with EngineClient() as client:
        reading = await DcgmReader(client, list, timeout_seconds=1.0, max_body_bytes=1 << 20).read()
    assert not reading.up and "no dcgm-exporter found" in reading.error


async def test_a_scrape_and_a_trend_tick_at_once_share_one_round(server: tuple[str, Endpoints]) -> None:
    base, endpoints = server
    async with EngineClient() as client:
        reader = DcgmReader(
            client, lambda: [DcgmEndpoint(f"{base}/good", "gpu-a")], timeout_seconds=2.0, max_body_bytes=1 << 20
        )
        first, second = await asyncio.gather(reader.read(), reader.read())
        assert first is second and endpoints.requests == 1
        await reader.read()
        assert endpoints.requests == 2  # a read after the round is a new round


async def test_a_body_seen_before_is_not_parsed_again(
    server: tuple[str, Endpoints], monkeypatch: pytest.MonkeyPatch
) -> None:
    """dcgm-exporter samples every 30 s: most scrapes get its last body again, whose GPUs are kept."""
    import oomguard.exporter.sources.dcgm as dcgm

    calls = []
    monkeypatch.setattr(dcgm, "parse", lambda text, **kw: calls.append(1) or parse_body(text, **kw))
    base, _ = server
    async with EngineClient() as client:
        reader = DcgmReader(
            client, lambda: [DcgmEndpoint(f"{base}/good", "gpu-a")], timeout_seconds=2.0, max_body_bytes=1 << 20
        )
        first, second = await reader.read(), await reader.read()
    assert len(calls) == 1 and first.gpus == second.gpus


async def test_what_is_kept_between_reads_does_not_grow_with_the_bodies(server: tuple[str, Endpoints]) -> None:
    """Bodies of a megabyte that change on every read (a comment grows in them): the reader keeps a digest of each
    endpoint's last body, not the body (it kept 3.8 MB bodies of 20 endpoints: RSS 57 -> 242 MiB)."""
    base, endpoints = server
    async with EngineClient() as client:
        reader = DcgmReader(
            client, lambda: [DcgmEndpoint(f"{base}/good", "gpu-a")], timeout_seconds=2.0, max_body_bytes=4 << 20
        )
        for i in range(3):
            endpoints.body = K8S_BODY + f"# {i} " + "x" * (1 << 20) + "\n"
            reading = await reader.read()
            assert reading.up and reading.gpus
        kept = [len(digest) for digest, _ in reader._parsed.values()]
    assert kept == [16]


async def test_a_gpu_it_stops_listing_is_lost_not_gone_without_a_word(server: tuple[str, Endpoints]) -> None:
    """dcgm-exporter stops writing a GPU it cannot read: while the endpoint answers, that GPU is down (the lost-GPU
    page), as NVML reads one; the endpoint gone (its pod deleted), its GPUs are forgotten."""
    base, endpoints = server
    endpoint = DcgmEndpoint(f"{base}/good", "gpu-a")
    listed = [endpoint]
    async with EngineClient() as client:
        reader = DcgmReader(client, lambda: listed, timeout_seconds=2.0, max_body_bytes=1 << 20)
        assert [(g.key, g.up) for g in (await reader.read()).gpus] == [(("gpu-a", "0"), True), (("gpu-a", "1"), True)]
        one_gone = "\n".join(line for line in K8S_BODY.splitlines() if 'gpu="1"' not in line) + "\n"
        endpoints.body = one_gone
        reading = await reader.read()
        assert [(g.key, g.up) for g in reading.gpus] == [(("gpu-a", "0"), True), (("gpu-a", "1"), False)]
        lost = reading.gpus[1]
        assert lost.uuid and "no longer in dcgm-exporter's body" in lost.error
        listed = []
        listed.append(DcgmEndpoint(f"{base}/hostname", "gpu-b"))  # gpu-a's pod deleted, another node's found
        assert {g.node for g in (await reader.read()).gpus} == {"gpu-b"}


async def _mig_node(server: tuple[str, Endpoints]) -> GpuReadings:
    """Node gpu-a's reading of the recorded MIG body (GPU 0 in two 3g.40gb instances, GPU 1 whole)."""
    base, endpoints = server
    endpoints.body = (FIXTURES / "dcgm" / "dcgm-4.x-mig-kubernetes.prom").read_text()
    async with EngineClient() as client:
        reader = DcgmReader(
            client, lambda: [DcgmEndpoint(f"{base}/good", "gpu-a")], timeout_seconds=2.0, max_body_bytes=1 << 20
        )
        return await reader.read()


async def test_mig_instances_are_read_as_gpus_of_their_node(server: tuple[str, Endpoints]) -> None:
    reading = await _mig_node(server)
    assert [g.key for g in reading.gpus] == [("gpu-a", "0/1"), ("gpu-a", "0/2"), ("gpu-a", "1")]
    first = reading.gpus[0]
    assert first.mig is not None and (first.mig.gpu_instance, first.mig.profile) == (1, "3g.40gb")
    assert first.pods == (("ml", "triton-resnet-7c9d8b6f4-p8m2v"),) and first.total_bytes == 40192 * 1048576


async def test_a_pod_on_a_mig_instance_is_judged_on_it(server: tuple[str, Endpoints]) -> None:
    """The cluster mode: dcgm-exporter names the Triton pod on GPU 0's first 3g.40gb instance; the pod's GPUs are that
    instance (35811 of 40192 MiB), not the whole GPU."""
    from oomguard.exporter.join import join_targets
    from oomguard.exporter.model import EngineReading, PodRef, TargetReading

    reading = await _mig_node(server)
    pod = PodRef("ml", "triton-resnet-7c9d8b6f4-p8m2v", "triton", None, "gpu-a")
    target = TargetReading("ml/triton", "triton", "http://10.0.0.5:8000", (), True, "up", 0.01, 200, 0.001,
                           EngineReading(()), pod=pod)  # fmt: skip
    judged = join_targets(reading, (target,))["ml/triton"]
    assert judged.gpus == (("gpu-a", "0/1"),)
    assert (judged.used_bytes, judged.total_bytes) == (35811 * 1048576, 40192 * 1048576)


async def test_each_nodes_naming_is_in_the_reading(
    server: tuple[str, Endpoints], caplog: pytest.LogCaptureFixture
) -> None:
    """A fleet half upgraded: node gpu-a's dcgm-exporter writes 4.8's families in MiB; gpu-b's (4.9 and later) the
    total in bytes. Each node's families and units are in the reading (oomguard_dcgm_memory_family_info) and said
    once in the log."""
    import logging

    base, endpoints = server
    gib = 2**30
    endpoints.body = (
        f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="GPU-b0"}} 2048\n'
        f"# HELP DCGM_FI_DEV_FB_CAPACITY_BYTES Total framebuffer memory (in bytes).\n"
        f'DCGM_FI_DEV_FB_CAPACITY_BYTES{{gpu="0",UUID="GPU-b0"}} {80 * gib}\n'
    )
    async with EngineClient() as client:
        reader = DcgmReader(
            client,
            lambda: [DcgmEndpoint(f"{base}/hostname", "gpu-a"), DcgmEndpoint(f"{base}/good", "gpu-b")],
            timeout_seconds=2.0, max_body_bytes=1 << 20,
        )  # fmt: skip
        with caplog.at_level(logging.INFO):
            reading = await reader.read()
            await reader.read()
    assert ("gpu-a", "used", "DCGM_FI_DEV_FB_USED", "MiB") in reading.dcgm_families
    assert ("gpu-b", "total", "DCGM_FI_DEV_FB_CAPACITY_BYTES", "bytes") in reading.dcgm_families
    assert ("gpu-b", "used", "DCGM_FI_DEV_FB_USED", "MiB") in reading.dcgm_families
    gpu_b = next(g for g in reading.gpus if g.node == "gpu-b")
    assert (gpu_b.used_bytes, gpu_b.total_bytes) == (2 * gib, 80 * gib)
    said = [r.getMessage() for r in caplog.records if "GPU memory from" in r.getMessage()]
    assert len(said) == 2 and any("DCGM_FI_DEV_FB_CAPACITY_BYTES (bytes)" in line for line in said)


async def test_a_fleet_half_upgraded_reads_whole_each_node_exactly(server: tuple[str, Endpoints]) -> None:
    """With no configuration: node gpu-a's dcgm-exporter (4.8's expfmt renderer) writes MiB under the old names,
    gpu-b's (4.10) bytes under DCGM 4.7's. Every GPU of both is read, each in its own unit, to the byte."""
    base, _ = server
    async with EngineClient() as client:
        reader = DcgmReader(
            client,
            lambda: [DcgmEndpoint(f"{base}/hostname", "gpu-a"), DcgmEndpoint(f"{base}/bytes", "gpu-b")],
            timeout_seconds=2.0, max_body_bytes=1 << 20,
        )  # fmt: skip
        reading = await reader.read()
    assert reading.up and not reading.error
    figures = {g.key: (g.used_bytes, g.free_bytes, g.reserved_bytes, g.total_bytes) for g in reading.gpus}
    cap, reserved = 143771 * MIB, 652 * MIB
    assert figures == {
        ("gpu-a", "0"): (126880 * MIB, 16239 * MIB, reserved, cap),
        ("gpu-a", "1"): (9 * MIB, 143110 * MIB, reserved, cap),
        ("gpu-b", "0"): (133_041_528_889, cap - 133_041_528_889 - reserved, reserved, cap),
        ("gpu-b", "1"): (9_438_418, cap - 9_438_418 - reserved, reserved, cap),
    }
    assert ("gpu-b", "used", "DCGM_FI_DEV_FB_USED_BYTES", "bytes") in reading.dcgm_families
    assert ("gpu-a", "used", "DCGM_FI_DEV_FB_USED", "MiB") in reading.dcgm_families
