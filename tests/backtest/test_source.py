"""A history read from a Prometheus (an aiohttp stand-in): the presets' queries put together into steps, and a
server that refuses, hangs, drips, floods or is no Prometheus at all: a clear BacktestError, in bounded time."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import pytest
from aiohttp import web

from oomguard.backtest import BacktestError, source
from oomguard.backtest.source import PrometheusHistory, load_mapping
from oomguard.exporter.config import ConfigError

T0 = 1_714_521_600.0
MIB = 2**20
MODE = web.AppKey("mode", str)
QUERIES = web.AppKey("queries", list)


def _grid(request: web.Request) -> list[float]:
    start, end, step = (float(request.query[k]) for k in ("start", "end", "step"))
    out, t = [], start
    while t <= end + 1e-9:
        out.append(t)
        t += step
    return out


def dcgm_answer(request: web.Request) -> dict:
    """dcgm-exporter's GPUs 0 and 1 of node-1 (0 used by pod llm/vllm-0) and vLLM's own series, as Prometheus
    answers the dcgm preset's queries."""
    query, times = request.query["query"], _grid(request)
    gpu = {"Hostname": "node-1", "instance": "10.0.0.1:9400", "job": "dcgm"}
    series = []
    if "DCGM_FI_DEV_FB_USED" in query or "DCGM_FI_DEV_FB_FREE" in query:
        used = "USED" in query
        for index, pod in ((0, {"exported_namespace": "llm", "exported_pod": "vllm-0"}), (1, {})):
            mib = (72_000 if index == 0 else 500) if used else (9_000 if index == 0 else 80_500)
            series.append({"metric": {**gpu, "gpu": str(index), **pod}, "values": [[t, str(mib * MIB)] for t in times]})
    elif "vllm:cache_config_info" in query:
        series.append({"metric": {"__name__": "vllm:cache_config_info", "namespace": "llm", "pod": "vllm-0",
                                  "gpu_memory_utilization": "0.9"}, "values": [[t, "1"] for t in times]})  # fmt: skip
    elif "vllm:" in query:
        value = {"kv_cache": "0.5", "waiting": "2", "running": "7", "preemptions": "3"}
        figure = next(v for k, v in value.items() if k in query)
        series.append({"metric": {"namespace": "llm", "pod": "vllm-0"}, "values": [[t, figure] for t in times]})
    return {"status": "success", "data": {"resultType": "matrix", "result": series}}


def dcgm_bytes_answer(request: web.Request) -> dict:
    """node-2's GPU 0 as Prometheus holds a dcgm-exporter 4.10's series: bytes no MiB divides, the label `hostname`
    and the driver label DCGM_FI_SYSTEM_DRIVER_VERSION. Only a query that names the byte families finds them."""
    query, times = request.query["query"], _grid(request)
    labels = {"hostname": "node-2", "instance": "10.0.0.2:9400", "job": "dcgm", "gpu": "0",
              "DCGM_FI_SYSTEM_DRIVER_VERSION": "580.105.08", "exported_namespace": "llm",
              "exported_pod": "vllm-1"}  # fmt: skip
    value = {"DCGM_FI_DEV_FB_USED_BYTES": 60_000_000_001, "DCGM_FI_DEV_FB_FREE_BYTES": 24_000_000_000,
             "DCGM_FI_DEV_FB_RESERVED_BYTES": 500_000_123, "DCGM_FI_DEV_FB_CAPACITY_BYTES": 84_500_000_124}  # fmt: skip
    series = [
        {"metric": {"__name__": name, **labels}, "values": [[t, str(v)] for t in times]}
        for name, v in value.items()
        if name in query
    ]
    return {"status": "success", "data": {"resultType": "matrix", "result": series}}


async def _handler(request: web.Request) -> web.StreamResponse:
    mode = request.app[MODE]
    request.app[QUERIES].append(request.query.get("query", ""))
    if mode == "500":
        return web.json_response(
            {"status": "error", "error": "query processing would load too many samples"}, status=500
        )
    if mode == "403":
        return web.Response(status=403, text="forbidden by the proxy")
    if mode == "hang":
        await asyncio.sleep(10)
    if mode == "drip":  # every chunk well within the socket's timeout, the whole far beyond the deadline
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(40):
            await response.write(b" ")
            await asyncio.sleep(0.1)
        return response
    if mode == "huge":
        return web.Response(text='{"status":"success","data":{"result":[]}}' + " " * 5000)
    if mode == "html":
        return web.Response(text="<html>Grafana</html>", content_type="text/html")
    if mode == "bytes":  # a fleet of dcgm-exporter 4.9 and later: memory in bytes under DCGM 4.7's names, `hostname`
        return web.json_response(dcgm_bytes_answer(request))
    if mode == "events":  # oomguard's OOM counter of one target: two OOMs, a restart of the exporter, one more
        counts = ["0", "0", "1", "1", "3", "0", "0", "1", "1"]
        values = [[t, c] for t, c in zip(_grid(request), counts, strict=False)]
        result = [{"metric": {"instance": "node-1:9847", "target": "vllm"}, "values": values}]
        return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": result}})
    return web.json_response(dcgm_answer(request))


@pytest.fixture
async def stand_in(aiohttp_server):
    async def serve(mode: str) -> tuple[str, list[str]]:
        app = web.Application()
        app[MODE], app[QUERIES] = mode, []
        app.router.add_get("/api/v1/query_range", _handler)
        server = await aiohttp_server(app)
        return f"http://127.0.0.1:{server.port}", app[QUERIES]

    return serve


def history(url: str, *, timeout: float = 5.0, preset: str = "dcgm", minutes: float = 2.0) -> PrometheusHistory:
    return PrometheusHistory(
        url, load_mapping(preset, None), start=T0, end=T0 + minutes * 60, step=15.0, timeout=timeout
    )


async def test_the_dcgm_preset_reads_the_gpus_and_the_engines_on_them(stand_in) -> None:
    url, queries = await stand_in("ok")
    steps = await asyncio.to_thread(list, history(url))
    assert [s.t for s in steps] == [T0 + 15 * i for i in range(9)]
    first = steps[0]
    by_gpu = {g.gpu: g for g in first.gpus}
    assert by_gpu["0"].node == "node-1" and by_gpu["0"].used == 72_000 * MIB and by_gpu["0"].free == 9_000 * MIB
    assert by_gpu["0"].targets == ["llm/vllm-0"] and by_gpu["1"].targets == []
    engine = first.engines["llm/vllm-0"]
    assert (engine.kv_cache_usage, engine.waiting, engine.running, engine.preemptions_total) == (0.5, 2, 7, 3)
    assert engine.gpu_memory_utilization == 0.9  # a label of vllm:cache_config_info
    assert any("DCGM_FI_DEV_FB_USED_BYTES or on" in q and "DCGM_FI_DEV_FB_USED, " in q for q in queries)


async def test_the_dcgm_preset_reads_dcgm_exporter_4_10s_byte_families(stand_in) -> None:
    """A Prometheus of dcgm-exporter 4.9 and later holds no DCGM_FI_DEV_FB_USED: the preset reads the byte families,
    to the byte, the node from `hostname`."""
    url, _ = await stand_in("bytes")
    steps = await asyncio.to_thread(list, history(url))
    (gpu,) = steps[0].gpus
    assert (gpu.node, gpu.gpu, gpu.targets) == ("node-2", "0", ["llm/vllm-1"])
    assert (gpu.used, gpu.free, gpu.reserved, gpu.total) == (60_000_000_001, 24e9, 500_000_123, 84_500_000_124)


def test_the_dcgm_presets_queries_in_a_real_prometheus(promtool: str, tmp_path: Path) -> None:
    """The preset's queries as Prometheus evaluates them (promtool's engine): a fleet half upgraded reads whole, node
    a (4.8: MiB, `Hostname`) in MiB times 2^20 and node b (4.10: bytes, `hostname`) in bytes; on node c, whose
    counters CSV lists both names, the byte family alone. No query keys on the driver-version label, which differs on
    every node here."""
    mapping = load_mapping("dcgm", None).gpu
    old = 'gpu="0",Hostname="a",instance="10.0.0.1:9400",job="dcgm",DCGM_FI_DRIVER_VERSION="570.133.20"'
    new = 'gpu="0",hostname="b",instance="10.0.0.2:9400",job="dcgm",DCGM_FI_SYSTEM_DRIVER_VERSION="580.105.08"'
    both = 'gpu="0",hostname="c",instance="10.0.0.3:9400",job="dcgm",DCGM_FI_SYSTEM_DRIVER_VERSION="580.126.09"'
    series = {  # name: {labels: value}; samples every minute from 7 s, read at 97 s (no sample on a window's edge)
        "DCGM_FI_DEV_FB_USED": {old: 70_000, both: 57_220},
        "DCGM_FI_DEV_FB_USED_BYTES": {new: 60_000_000_001, both: 60_000_000_002},
        "DCGM_FI_DEV_FB_FREE": {old: 11_000, both: 22_888},
        "DCGM_FI_DEV_FB_FREE_BYTES": {new: 24_000_000_000, both: 24_000_000_001},
        "DCGM_FI_DEV_FB_RESERVED": {old: 500, both: 476},
        "DCGM_FI_DEV_FB_RESERVED_BYTES": {new: 500_000_123, both: 500_000_124},
        "DCGM_FI_DEV_FB_CAPACITY_BYTES": {new: 84_500_000_124, both: 84_500_000_127},
    }
    inputs = [f"      - series: '{name}{{{labels}}}'\n        values: '{value}x3'"
              for name, by in series.items() for labels, value in by.items()]  # fmt: skip

    def expect(query: str, samples: list[tuple[str, str, float]]) -> str:
        lines = [f"      - expr: '{query}'\n        eval_time: 97s\n        exp_samples:"]
        for name, labels, value in samples:
            lines.append(f"          - labels: '{name}{{{labels}}}'\n            value: {value:.0f}")
        return "\n".join(lines)

    def as_old(labels: str) -> str:  # 4.8's series times 2^20: no name, and `hostname` beside `Hostname`
        return labels + ',hostname="a"'

    cases = [
        expect(mapping.used_bytes, [("", as_old(old), 70_000 * MIB), ("DCGM_FI_DEV_FB_USED_BYTES", new, 60_000_000_001),
                                    ("DCGM_FI_DEV_FB_USED_BYTES", both, 60_000_000_002)]),
        expect(mapping.free_bytes, [("", as_old(old), 11_000 * MIB), ("DCGM_FI_DEV_FB_FREE_BYTES", new, 24e9),
                                    ("DCGM_FI_DEV_FB_FREE_BYTES", both, 24_000_000_001)]),
        expect(mapping.reserved_bytes, [("", as_old(old), 500 * MIB),
                                        ("DCGM_FI_DEV_FB_RESERVED_BYTES", new, 500_000_123),
                                        ("DCGM_FI_DEV_FB_RESERVED_BYTES", both, 500_000_124)]),
        expect(mapping.total_bytes, [("DCGM_FI_DEV_FB_CAPACITY_BYTES", new, 84_500_000_124),
                                     ("DCGM_FI_DEV_FB_CAPACITY_BYTES", both, 84_500_000_127)]),
    ]  # fmt: skip
    test = tmp_path / "dcgm-preset.yaml"
    test.write_text(
        "rule_files: []\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n"
        + "\n".join(inputs).replace("values: '", "values: '_ ")  # the first sample at 1 min, none at 0
        + "\n    promql_expr_test:\n"
        + "\n".join(cases)
        + "\n"
    )
    run = subprocess.run([promtool, "test", "rules", str(test)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


async def test_a_long_window_is_read_in_chunks(stand_in, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source, "CHUNK_POINTS", 4)
    url, queries = await stand_in("ok")
    steps = await asyncio.to_thread(list, history(url))
    assert len(steps) == 9 and len({s.t for s in steps}) == 9
    used = [q for q in queries if "FB_USED" in q]
    assert len(used) == 3  # 9 points in chunks of 4


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("500", "answered HTTP 500 Internal Server Error: query processing would load too many samples"),
        ("403", "answered HTTP 403 Forbidden: forbidden by the proxy; it refuses this client"),
        ("html", "did not answer as a Prometheus HTTP API does"),
    ],
)
async def test_a_prometheus_that_refuses(stand_in, mode: str, said: str) -> None:
    url, _ = await stand_in(mode)
    with pytest.raises(BacktestError) as caught:
        await asyncio.to_thread(list, history(url))
    assert said in str(caught.value) and url in str(caught.value)


@pytest.mark.parametrize("mode", ["hang", "drip"])
async def test_a_prometheus_that_does_not_answer_in_time(stand_in, mode: str) -> None:
    url, _ = await stand_in(mode)
    started = time.monotonic()
    with pytest.raises(BacktestError, match=r"did not answer within 0\.5s.*a longer --timeout"):
        await asyncio.to_thread(list, history(url, timeout=0.5))
    assert time.monotonic() - started < 2.5


async def test_an_answer_over_the_limit_is_refused(stand_in, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source, "MAX_ANSWER_BYTES", 1000)
    url, _ = await stand_in("huge")
    with pytest.raises(BacktestError, match="answered more than 1,000 bytes for one query"):
        await asyncio.to_thread(list, history(url))


async def test_the_ooms_are_oomguards_own_counters_increases(stand_in) -> None:
    url, queries = await stand_in("events")
    ooms = await asyncio.to_thread(history(url, preset="oomguard").ooms)
    assert [(o.t - T0) / 15 for o in ooms] == [2, 4, 4, 7]  # a rise of 2 is two OOMs; the reset is none
    assert {o.target for o in ooms} == {"node-1:9847/vllm"}
    assert 'kind=~"cuda_oom|startup_memory"' in queries[0]


def test_nothing_listening() -> None:
    from oomguard.common.ports import free_port

    with pytest.raises(BacktestError, match=r"cannot reach Prometheus at .*check --prometheus"):
        list(history(f"http://127.0.0.1:{free_port()}"))


def test_the_window_and_the_url_are_checked() -> None:
    with pytest.raises(BacktestError, match="give its base URL"):
        history("prometheus:9090")
    with pytest.raises(BacktestError, match="over 5,000,000: a longer --step"):
        PrometheusHistory("http://p", load_mapping("dcgm", None), start=0, end=1e9, step=15, timeout=1)


def test_a_mapping_overrides_the_preset(tmp_path: Path) -> None:
    path = tmp_path / "mapping.yaml"
    path.write_text(
        "preset: nvidia_gpu_exporter\n"
        "gpu:\n  used_bytes: 'nvidia_smi_memory_used_bytes{cluster=\"a\"}'\n"
        "engine:\n  target_labels: [pod]\n  waiting: 'sum by (pod) (vllm:num_requests_waiting)'\n"
    )
    mapping = load_mapping("dcgm", path)
    assert mapping.preset == "nvidia_gpu_exporter" and mapping.gpu.gpu_label == ("uuid",)
    assert mapping.gpu.used_bytes == 'nvidia_smi_memory_used_bytes{cluster="a"}'
    assert mapping.gpu.total_bytes == "nvidia_smi_memory_total_bytes"
    path.write_text("gpu:\n  used_byte: x\n")
    with pytest.raises(ConfigError, match="used_byte"):
        load_mapping("dcgm", path)
    path.write_text("gpu:\n  used_bytes: null\n  free_bytes: null\n")
    with pytest.raises(BacktestError, match="reads no GPU memory"):
        load_mapping("dcgm", path)
    with pytest.raises(BacktestError, match="preset 'dcmg': one of dcgm, nvidia_gpu_exporter, oomguard"):
        load_mapping("dcmg", None)
