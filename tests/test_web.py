"""The HTTP endpoints, through aiohttp's test client, on the real app with the fake NVML."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import psutil
import pytest
from support import promtool_check_metrics, samples, value
from targets_zoo import Zoo

from oomguard.exporter.config_loader import load_config
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app
from oomguard.simulate.fake_nvml import GIB, FakeGpu, FakeNvml, FakeProcess


def app_for(zoo: Zoo, kinds: list[str], lib: FakeNvml | None = None, gpus: tuple[int, ...] = (0,), **nvml: object):
    config = load_config(
        None,
        {
            "targets": [{"name": k, "url": f"{zoo.base}/{k}".replace(f"/{k}", ""), "gpus": list(gpus)} for k in kinds],
            "scrape": {"timeout_seconds": 1},
            "nvml": {"timeout_seconds": 0.5, **nvml},
            # The event sources have their own tests (tests/events); here they would only add noise.
            "events": {"kernel_log": False, "xid": False},
        },
    )
    # Tests only: each target's URL gets its behaviour's path (config URLs take no path).
    config = config.model_copy(
        update={
            "targets": tuple(
                t.model_copy(update={"url": f"{zoo.base}/{k}"}) for t, k in zip(config.targets, kinds, strict=True)
            )
        }
    )
    lib = lib or FakeNvml([FakeGpu(0, used_bytes=74 * GIB, processes=[FakeProcess(4242, 73 * GIB)])])
    return make_app(Runtime(config, nvml_lib=lib))


async def test_metrics_joins_gpu_and_engine(aiohttp_client, zoo: Zoo, promtool: str) -> None:
    client = await aiohttp_client(app_for(zoo, ["good", "500"]))
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = await response.text()
    assert value(text, "oomguard_gpu_memory_used_ratio", gpu="0") == pytest.approx(74 / 80)
    assert value(text, "oomguard_engine_kv_cache_usage_ratio", target="good", model_name="tiny") == pytest.approx(
        0.714, abs=1e-3
    )
    assert value(text, "oomguard_engine_requests_waiting", target="good", model_name="tiny") == 1.0
    assert value(text, "oomguard_engine_preemptions_total", target="good", model_name="tiny") == 5.0
    # budget: gpu_memory_utilization 0.92 of the body x 80 GiB
    assert value(text, "oomguard_target_memory_budget_bytes", target="good") == pytest.approx(0.92 * 80 * GIB)
    assert value(text, "oomguard_target_memory_over_budget_bytes", target="good") == pytest.approx(
        (74 - 0.92 * 80) * GIB
    )
    assert value(text, "oomguard_target_gpu_memory_used_ratio", target="good") == pytest.approx(74 / 80)
    assert value(text, "oomguard_target_up", target="good") == 1.0
    assert value(text, "oomguard_target_up", target="500") == 0.0
    assert value(text, "oomguard_target_scrape_errors_total", target="500", kind="http_status") == 1.0
    assert value(text, "oomguard_target_state", target="500", state="loading") == 1.0  # never healthy: not down
    assert value(text, "oomguard_source_success", source="nvml") == 1.0
    assert value(text, "oomguard_nvml_up") == 1.0
    assert all(name.startswith("oomguard_") for name, _ in samples(text))
    assert promtool_check_metrics(promtool, text.encode()) == ""


async def test_landing_health_ready(aiohttp_client, zoo: Zoo) -> None:
    client = await aiohttp_client(app_for(zoo, ["good"]))
    assert (await client.get("/-/healthy")).status == 200
    for _ in range(50):  # the warm-up collection runs at start
        if (await client.get("/-/ready")).status == 200:
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("/-/ready never became ready")
    page = await (await client.get("/")).text()
    assert "oomguard" in page and "/metrics" in page and "good" in page and ">up<" in page


async def test_ready_is_503_before_the_first_collection(aiohttp_client, zoo: Zoo) -> None:
    client = await aiohttp_client(app_for(zoo, ["hang"]))
    response = await client.get("/-/ready")
    assert response.status == 503 and "first collection" in await response.text()


async def test_concurrent_scrapes_share_one_collection(aiohttp_client, zoo: Zoo) -> None:
    client = await aiohttp_client(app_for(zoo, ["slow"]))
    await client.get("/metrics")  # let the warm-up finish
    before = zoo.requests["slow"]
    responses = await asyncio.gather(*(client.get("/metrics") for _ in range(8)))
    assert all(r.status == 200 for r in responses)
    assert zoo.requests["slow"] - before == 1


async def test_the_answer_is_rendered_once_a_snapshot_off_the_event_loop(
    aiohttp_client, zoo: Zoo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster's answer takes tens of milliseconds to render: in a thread, never on the loop, once for the
    scrapes that share a snapshot."""
    from oomguard.exporter import web as web_module

    threads: list[threading.Thread] = []
    real_render = web_module.render

    def render(snapshot):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread())
        return real_render(snapshot)

    monkeypatch.setattr(web_module, "render", render)
    client = await aiohttp_client(app_for(zoo, ["slow"]))
    await client.get("/metrics")
    threads.clear()
    responses = await asyncio.gather(*(client.get("/metrics") for _ in range(8)))
    assert all(r.status == 200 for r in responses)
    assert len(threads) == 1 and threads[0] is not threading.main_thread()
    bodies = {await r.read() for r in responses}
    assert len(bodies) == 1 and b"oomguard_build_info" in next(iter(bodies))


async def test_the_status_view_is_built_once_a_snapshot_from_the_snapshot(
    aiohttp_client, zoo: Zoo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Looks at `/` and `/status.json` that share a collection share one view, built from the snapshot: the
    exposition is not rendered for them (the view was built at each look by parsing the text the snapshot was
    rendered to: megabytes a look on a cluster)."""
    from oomguard.exporter import web as web_module
    from oomguard.exporter.status import view as view_module

    rendered: list[object] = []
    built: list[object] = []
    real_render = web_module.render

    def render(snapshot):  # type: ignore[no-untyped-def]
        rendered.append(snapshot)
        return real_render(snapshot)

    class CountedView(view_module.StatusView):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            built.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(web_module, "render", render)
    monkeypatch.setattr(view_module, "StatusView", CountedView)
    client = await aiohttp_client(app_for(zoo, ["slow"]))
    await client.get("/metrics")  # let the warm-up finish
    before = zoo.requests["slow"]
    rendered.clear()
    built.clear()
    responses = await asyncio.gather(*(client.get(path) for path in ("/", "/status.json") * 4))
    assert all(r.status == 200 for r in responses)
    assert zoo.requests["slow"] - before == 1  # one collection: one snapshot for the eight
    assert rendered == [] and len(built) == 1
    documents = [await r.json() for r in responses[1::2]]
    assert all(d == documents[0] for d in documents) and [t["name"] for t in documents[0]["targets"]] == ["slow"]
    pages = [await r.text() for r in responses[::2]]
    assert all(page == pages[0] for page in pages) and ">slow<" in pages[0]


async def test_hung_nvml_does_not_hang_the_scrape(aiohttp_client, zoo: Zoo) -> None:
    release = threading.Event()
    lib = FakeNvml([FakeGpu(0)])
    lib.before_call = lambda call: release.wait(10) if call == "nvmlDeviceGetCount" else None
    client = await aiohttp_client(app_for(zoo, ["good"], lib=lib))
    try:
        started = time.perf_counter()
        text = await (await client.get("/metrics")).text()
        assert time.perf_counter() - started < 2.5
        assert value(text, "oomguard_source_success", source="nvml") == 0.0
        assert value(text, "oomguard_target_up", target="good") == 1.0
        await client.get("/metrics")
        # The hung read is waited on, not stacked: still one call in flight.
        assert lib.calls["nvmlDeviceGetCount"] == 1
    finally:
        release.set()
    for _ in range(50):
        text = await (await client.get("/metrics")).text()
        if value(text, "oomguard_source_success", source="nvml") == 1.0:
            break
        await asyncio.sleep(0.05)
    assert value(text, "oomguard_gpu_up", gpu="0") == 1.0


async def test_no_driver_serves_everything_else(aiohttp_client, zoo: Zoo) -> None:
    client = await aiohttp_client(app_for(zoo, ["good"], lib=FakeNvml(library_present=False)))
    text = await (await client.get("/metrics")).text()
    assert value(text, "oomguard_nvml_up") == 0.0
    assert value(text, "oomguard_source_success", source="nvml") == 0.0
    assert value(text, "oomguard_target_up", target="good") == 1.0
    assert "oomguard_gpu_memory_used_bytes" not in text
    assert "oomguard_target_memory_budget_bytes" not in text  # no GPU total: no budget in bytes


async def test_source_exception_is_isolated(aiohttp_client, zoo: Zoo) -> None:
    lib = FakeNvml([FakeGpu(0)])

    def explode(call: str) -> None:
        if call == "nvmlDeviceGetCount":
            raise RuntimeError("a bug in a source")

    lib.before_call = explode
    client = await aiohttp_client(app_for(zoo, ["good"], lib=lib))
    response = await client.get("/metrics")
    assert response.status == 200
    text = await response.text()
    assert value(text, "oomguard_source_success", source="nvml") == 0.0
    assert value(text, "oomguard_target_up", target="good") == 1.0


async def test_local_target_is_joined_with_its_own_gpu_processes(aiohttp_client, zoo: Zoo) -> None:
    # The zoo listens in this very process, so this process is the "engine" found by port.
    lib = FakeNvml(
        [FakeGpu(0, used_bytes=74 * GIB, processes=[FakeProcess(os.getpid(), 70 * GIB), FakeProcess(4242, 4 * GIB)])]
    )
    client = await aiohttp_client(app_for(zoo, ["good"], lib=lib))
    text = await (await client.get("/metrics")).text()
    assert value(text, "oomguard_target_process_gpu_memory_bytes", target="good") == 70 * GIB
    assert value(text, "oomguard_target_memory_over_budget_bytes", target="good") == pytest.approx(
        (70 - 0.92 * 80) * GIB
    )
    rss = value(text, "oomguard_target_resident_memory_bytes", target="good")
    # The engine is this process and its children: the test session may hold some (a Prometheus of a
    # session fixture), and the exporter rightly counts them as the engine's workers.
    me = psutil.Process()
    family = sum(p.memory_info().rss for p in (me, *me.children(recursive=True)) if p.is_running())
    assert rss == pytest.approx(family, rel=0.2)


async def test_gpus_are_found_from_processes_when_not_configured(aiohttp_client, zoo: Zoo) -> None:
    lib = FakeNvml(
        [FakeGpu(0, used_bytes=GIB), FakeGpu(1, used_bytes=50 * GIB, processes=[FakeProcess(os.getpid(), 49 * GIB)])]
    )
    client = await aiohttp_client(app_for(zoo, ["good"], lib=lib, gpus=()))
    text = await (await client.get("/metrics")).text()
    assert ("oomguard_target_gpu_info", (("gpu", "1"), ("target", "good"))) in samples(text)
    assert ("oomguard_target_gpu_info", (("gpu", "0"), ("target", "good"))) not in samples(text)
    assert value(text, "oomguard_target_gpu_memory_used_bytes", target="good") == 50 * GIB
