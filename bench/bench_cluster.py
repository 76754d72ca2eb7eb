"""The cluster mode at fleet size: engine pods on nodes, read by one exporter or by N shards.

One process plays the API server (the stand-in, oomguard/simulate/kubernetes_api.py: list, watch, pods/log
with sinceTime) and every node's dcgm-exporter (at its own 127.2.x.y:9400, 8 GPUs each, named with its node's pods);
the engine pods are aiohttp sites at their own pod IPs (127.1.x.y:8000, the real 50 kB vLLM body), 1,000 to a
process (each process's descriptors stay under its limit). Each engine's log holds a few lines and is followed.

Measured, in this order, against the same stand-in cluster:
1. **Shards.** N exporters in the cluster mode (deploy/kubernetes-cluster/oomguard.yaml's settings, each with its
   own state folder; `kubernetes.shards: N`, `kubernetes.shard: K` when N > 1). Per shard: the targets it took
   (checked against the node hash: together every pod exactly once), its RSS against the same shard watching no
   engine pod (the growth a target), its CPU a scrape (all threads; the background's rate, measured apart while
   nothing scrapes, taken out) and the full garbage collections' time in it (gc.callbacks: the bench's probe in the
   exporter's process), the answer's size, its series, and the event loop's lag while it scrapes and renders (a
   /-/healthy request's latency, sent every few ms during the scrape), the objects the exporter froze
   (gc.get_freeze_count) and what a full refreeze's pass takes. The goals of issue 50's items 1 and 5 are printed
   met or not: the loop's longest stall during a scrape at most 50 ms, the idle CPU at most 20 ms a second at
   1,000 pods (below 1,000, their share of it).
2. **Ratios, in turns on the same machine:** the first shard's scrape against a node-mode exporter (the same
   engines as static `targets:`, 8 fake GPUs, local_process: no, as bench_many_targets.py) and against the bare
   aiohttp client fetching the same bodies (each engine's /metrics and /health at once, and the shard's
   dcgm-exporters', as bench_client.py measures: the client's own process time). `--freeze-probe`: the first shard's
   turns again after a gc.freeze() in its process once its targets are up (the bench's probe, not the exporter's code).
3. **A shard restarted** (`--restart`): OOMs logged in some of its pods just before it is killed (SIGKILL), and
   in others while it is down; started again on its state folder, every OOM must be counted once
   (oomguard_target_events_total{kind="cuda_oom"}).
4. **Where a target's memory goes** (`--tracemalloc`): the first shard and its no-pod baseline again, under
   tracemalloc (8 frames), the traced memory grouped by the innermost oomguard frame and by allocating line;
   (`--trend-full`) their RSS once the trend's window is full (compressed tenfold: 901 samples a series in 3 min).

The bench raises its RLIMIT_NOFILE soft limit to the hard one (its children inherit it) and reports the most
descriptors each of its processes held. CPU times are read in the kernel's ticks (10 ms): the figures a target mean
something from a few hundred targets on.
Run: python bench/bench_cluster.py [--pods 4000] [--nodes 500] [--shards 4] [--scrapes 10] [--restart]
     [--freeze-probe] [--tracemalloc] [--trend-full] [--no-ratios] [--block K]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from _common import FIXTURE, _ctx, _started, cpu_mark, machine, median, other_load, percentile
from aiohttp import web

from oomguard.exporter.sources.kubernetes.shards import shard_of

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the tests' stand-in API and objects

WARMUP = 3
IDLE_SECONDS = 10.0
SETTLE_SECONDS = 5.0  # after every target is up: the log streams opened, the first trend ticks done
ENGINE_PORT, DCGM_PORT = 8000, 9400
ENGINES_PER_PROCESS = 1000
GPUS_PER_NODE = 8
TURNS = 3
# The goals (docs/performance.md, "The cluster mode at fleet size").
GOAL_VS_NODE = 1.2  # a cluster-mode target's CPU a scrape, against a node-mode target's
GOAL_VS_CLIENT = 2.0  # a scrape's CPU, against only fetching its bodies with the bare aiohttp client
GOAL_KIB_PER_TARGET = 64.0
GOAL_STALL_MS = 50.0  # the event loop's longest stall while a scrape of the targets runs (/-/healthy's longest wait)
GOAL_IDLE_MS_S = 20.0  # the CPU a second at 1,000 pods while nothing scrapes (its share of them, below 1,000)
TRACEBACK = "Traceback (most recent call last):"  # PyTorch's OOM is the exception that ends one
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB"
CONTAINER_ID = "a" * 64
_TARGET = re.compile(r'[{,]target="([^"]*)"')


# `--block K`: the engines at 127.(2K+1).x.y and the dcgm-exporters at 127.(2K+2).x.y, so that two runs on one
# machine do not take each other's addresses; an environment variable, which the bench's processes inherit.
BLOCK = "OOMGUARD_BENCH_CLUSTER_BLOCK"


def _block() -> int:
    return int(os.environ.get(BLOCK, "0"))


def engine_ip(i: int) -> str:
    return f"127.{2 * _block() + 1}.{i // 250}.{i % 250 + 1}"


def dcgm_ip(n: int) -> str:
    return f"127.{2 * _block() + 2}.{n // 250}.{n % 250 + 1}"


def pod_name(i: int) -> str:
    return f"vllm-{i:04d}"


def node_name(n: int) -> str:
    return f"gpu-{n:03d}"


def target_name(i: int) -> str:
    return f"llm/{pod_name(i)}"


def dcgm_body(node: str, pods: list[str]) -> str:
    lines = []
    for family in ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_GPU_UTIL"):
        lines += [f"# HELP {family} (bench)", f"# TYPE {family} gauge"]
        for gpu in range(GPUS_PER_NODE):
            pod = f',container="vllm",namespace="llm",pod="{pods[gpu]}"' if gpu < len(pods) else ""
            value = {"DCGM_FI_DEV_FB_FREE": 8000, "DCGM_FI_DEV_FB_USED": 73000, "DCGM_FI_DEV_FB_RESERVED": 512,
                     "DCGM_FI_DEV_GPU_UTIL": 80}[family]  # fmt: skip
            lines.append(
                f'{family}{{gpu="{gpu}",UUID="GPU-{node}-{gpu}",pci_bus_id="00000000:{16 + gpu:02X}:00.0",'
                f'device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="{node}"{pod}}} {value}'
            )
    return "\n".join(lines) + "\n"


# -- the cluster's processes -------------------------------------------------------------------------------------
def _serve_engines(first: int, count: int, conn: Connection) -> None:
    """Engine pods first..first+count-1, each an aiohttp site at its own pod IP."""
    body = FIXTURE.read_bytes()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def main() -> None:
        logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)  # a killed exporter's connections reset
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/health", health)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        for i in range(first, first + count):
            await web.TCPSite(runner, engine_ip(i), ENGINE_PORT).start()
        conn.send(count)
        await asyncio.Event().wait()

    asyncio.run(main())


def _serve_cluster(pods: int, nodes: int, conn: Connection) -> None:
    """The API server's stand-in and every node's dcgm-exporter; answers the bench's questions and writes its lines."""
    from oomguard.simulate import kubernetes_objects as objects
    from oomguard.simulate.kubernetes_api import StandIn

    async def main() -> None:
        logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)  # a killed exporter's streams reset
        api = StandIn()
        # The sharded layout's hand-over ConfigMap, as deploy/kubernetes-sharded ships it (the kubeconfig names no
        # namespace: the exporter's is "default").
        handover = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "oomguard-shards", "namespace": "default"},
        }
        await api.put("configmaps", handover)
        runners = []
        per_node: dict[int, list[str]] = {}
        for i in range(pods):
            node = i % nodes
            per_node.setdefault(node, []).append(pod_name(i))
            await api.put("pods", objects.pod(pod_name(i), engine_ip(i), ENGINE_PORT, node=node_name(node)))
            for n in range(3):
                await api.log("llm", pod_name(i), "vllm", f"INFO line {n} of {pod_name(i)}", container_id=CONTAINER_ID)
        for node in range(nodes):
            text = dcgm_body(node_name(node), per_node.get(node, []))

            async def dcgm(_: web.Request, text: str = text) -> web.Response:
                return web.Response(text=text)

            app = web.Application()
            app.router.add_get("/metrics", dcgm)
            dcgm_runner = web.AppRunner(app, access_log=None)
            await dcgm_runner.setup()
            runners.append(dcgm_runner)
            await web.TCPSite(dcgm_runner, dcgm_ip(node), DCGM_PORT).start()
            pod = objects.pod(f"dcgm-{node:03d}", dcgm_ip(node), DCGM_PORT, namespace="gpu-operator",
                              node=node_name(node), labels={"app": "nvidia-dcgm-exporter"})  # fmt: skip
            pod["metadata"]["ownerReferences"] = [  # the GPU Operator's DaemonSet: the only dcgm-exporter taken
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "nvidia-dcgm-exporter", "controller": True}
            ]
            await api.put("pods", pod)
        api_runner = web.AppRunner(api.app(), access_log=None)
        await api_runner.setup()
        site = web.TCPSite(api_runner, "127.0.0.1", 0)
        await site.start()
        conn.send(api_runner.addresses[0][1])
        while True:  # the bench's questions about the API's side, and the lines it has the engines write
            await asyncio.sleep(0.1)
            if not conn.poll():
                continue
            question, *rest = conn.recv()
            if question == "oom":  # an engine's allocator failing: its traceback, as vLLM logs it
                for name in rest[0]:
                    await api.log("llm", name, "vllm", TRACEBACK, container_id=CONTAINER_ID)
                    await api.log("llm", name, "vllm", OOM, container_id=CONTAINER_ID)
                conn.send(len(rest[0]))
                continue
            if question == "info":  # a line that counts nothing
                for name in rest[0]:
                    await api.log("llm", name, "vllm", f"INFO another line of {name}", container_id=CONTAINER_ID)
                conn.send(len(rest[0]))
                continue
            follows: Counter[str] = Counter()
            for path in api.requests:
                if "/log?" in path and "follow=true" in path:
                    follows[path.split("/pods/")[1].split("/log")[0]] += 1
            conn.send({"requests": len(api.requests), "follows": dict(follows),
                       "lists_and_watches": [r for r in api.requests if "/log" not in r]})  # fmt: skip

    asyncio.run(main())


# -- the exporters ---------------------------------------------------------------------------------------------
def _tracemalloc_stats() -> dict[str, Any]:
    """The traced memory now, grouped by the innermost oomguard frame (the code of ours that asked, whatever library
    allocated) and by the allocating line."""
    import gc
    import tracemalloc

    gc.collect()
    snapshot = tracemalloc.take_snapshot()
    ours: Counter[str] = Counter()
    files: Counter[str] = Counter()
    lines: Counter[str] = Counter()
    for stat in snapshot.statistics("traceback"):
        frames = list(stat.traceback)  # oldest first
        top = frames[-1]
        lines[f"{_short(top.filename)}:{top.lineno}"] += stat.size
        inner = next((f for f in reversed(frames) if "/oomguard/" in f.filename), None)
        key = f"{_short(inner.filename)}:{inner.lineno}" if inner else f"(no oomguard frame) {_short(top.filename)}"
        ours[key] += stat.size
        files[key.rsplit(":", 1)[0] if inner else key] += stat.size
    return {"total": sum(lines.values()), "files": dict(files), "ours": dict(ours), "lines": dict(lines)}


def _short(path: str) -> str:
    for marker in ("/oomguard/", "/site-packages/", "/lib/python3.11/"):
        if marker in path:
            return path.split(marker, 1)[1] if marker != "/oomguard/" else "oomguard/" + path.split(marker, 1)[1]
    return path


_GC_PASSES: list[float] = []  # the full garbage collections' durations, ms, in this exporter's process


def _time_full_collections() -> None:
    """The bench's own probe in the exporter's process (gc.callbacks): how long each full collection held the
    interpreter (every thread, the event loop's included)."""
    import gc

    started = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            _GC_PASSES.append((time.perf_counter() - started[0]) * 1000)

    gc.callbacks.append(callback)


async def _serve_probed(app: web.Application, conn: Connection, trace: bool) -> None:
    from _common import serve

    async def passes(_: web.Request) -> web.Response:
        return web.json_response(_GC_PASSES)

    async def freeze(_: web.Request) -> web.Response:  # `--freeze-probe`: what a freeze once the targets are up does
        import gc

        gc.collect()
        gc.freeze()
        return web.Response(text=str(gc.get_freeze_count()))

    async def frozen(_: web.Request) -> web.Response:  # what the exporter froze itself (runtime.py's freezer)
        import gc

        return web.Response(text=str(gc.get_freeze_count()))

    async def refreeze(_: web.Request) -> web.Response:  # what runtime.py's TargetFreezer does after the target set
        import gc  # changed (at most every REFREEZE_SECONDS): everything thawed, one full pass, frozen again

        gc.unfreeze()
        started = time.perf_counter()
        gc.collect()
        took = (time.perf_counter() - started) * 1000
        gc.freeze()
        return web.Response(text=f"{took:.1f}")

    app.router.add_get("/-/bench/gc", passes)
    app.router.add_get("/-/bench/frozen", frozen)
    app.router.add_get("/-/bench/refreeze", refreeze)
    app.router.add_get("/-/bench/freeze", freeze)
    if trace:

        async def dump(_: web.Request) -> web.Response:
            return web.json_response(await asyncio.to_thread(_tracemalloc_stats))

        app.router.add_get("/-/bench/tracemalloc", dump)
    await serve(app, conn)


# The trend's window compressed tenfold (`--trend-full`): the same 901 samples a series once full, in 3 minutes.
TREND_COMPRESSED = {"interval_seconds": 0.2, "short_window_seconds": 12.0, "long_window_seconds": 180.0,
                    "analysis_interval_seconds": 1.0}  # fmt: skip


def _serve_exporter(api_port: int, state: str, with_pods: bool, shards: int, shard: int, mode: str,
                    conn: Connection) -> None:  # fmt: skip
    """The cluster mode. `mode`: "" as shipped; "trace" under tracemalloc (8 frames; the scrape's timeouts
    raised to 60 s, which it needs at 1,000 targets); "trend" with the trend's window compressed tenfold."""
    if mode == "trace":
        import tracemalloc

        tracemalloc.start(8)
    _time_full_collections()
    from oomguard.exporter.config_loader import load_config
    from oomguard.exporter.runtime import Runtime
    from oomguard.exporter.web import make_app

    kubeconfig = Path(state) / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: bench\n"
        f"clusters: [{{name: bench, cluster: {{server: 'http://127.0.0.1:{api_port}'}}}}]\n"
        "users: [{name: oomguard, user: {token: bench}}]\n"
        "contexts: [{name: bench, context: {cluster: bench, user: oomguard}}]\n"
    )
    selector = "app.kubernetes.io/name=vllm" if with_pods else "app.kubernetes.io/name=none"
    kubernetes: dict[str, Any] = {"scope": "cluster", "port": "http", "label_selector": selector,
                                  "kubeconfig": str(kubeconfig)}  # fmt: skip
    if shards > 1:
        kubernetes |= {"shards": shards, "shard": shard}
    settings: dict[str, Any] = {
        "state_dir": state,
        "events": {"kernel_log": False, "xid": False},
        "kubernetes": kubernetes,
        "dcgm": {"discover": True, "port": DCGM_PORT, "namespaces": ["gpu-operator"]},
    }
    if mode == "trace":
        settings["scrape"] = {"timeout_seconds": 60.0}
        settings["dcgm"]["timeout_seconds"] = 60.0
    if mode == "trend":
        settings["trend"] = TREND_COMPRESSED
    config = load_config(None, settings)
    asyncio.run(_serve_probed(make_app(Runtime(config)), conn, mode == "trace"))


def _serve_node_exporter(pods: list[int], state: str, log_files: bool, conn: Connection) -> None:
    """The node mode: the same engines as static targets, 8 fake GPUs, local_process: no (bench_many_targets.py);
    `log_files`: each target follows a log file of its own (a node agent's log source), for its series."""
    from oomguard.exporter.config_loader import load_config
    from oomguard.exporter.runtime import Runtime
    from oomguard.exporter.web import make_app
    from oomguard.simulate.fake_nvml import GIB, FakeGpu, FakeNvml, FakeProcess

    targets = []
    for i in pods:
        target: dict[str, Any] = {"url": f"http://{engine_ip(i)}:{ENGINE_PORT}", "name": target_name(i),
                                  "gpus": [i % GPUS_PER_NODE], "local_process": "no"}  # fmt: skip
        if log_files:
            path = Path(state) / f"{pod_name(i)}.log"
            path.write_text("".join(f"INFO line {n} of {pod_name(i)}\n" for n in range(3)))
            target["logs"] = [str(path)]
        targets.append(target)
    _time_full_collections()
    config = load_config(None, {"state_dir": state, "events": {"kernel_log": False, "xid": False}, "targets": targets})
    gpus = [
        FakeGpu(i, used_bytes=60 * GIB, utilization_percent=70,
                processes=[FakeProcess(900_000 + 2 * i + k, 30 * GIB) for k in range(2)])
        for i in range(GPUS_PER_NODE)
    ]  # fmt: skip
    asyncio.run(_serve_probed(make_app(Runtime(config, nvml_lib=FakeNvml(gpus))), conn, False))


def _serve_bare_client(urls: list[str], dcgm_urls: list[str], conn: Connection) -> None:
    """bench_client.py's aiohttp measure: every engine's /metrics and /health at once (and the dcgm-exporters'
    /metrics), a round at a time, connections kept; the process time a round, sent back."""

    async def main() -> None:
        connector = aiohttp.TCPConnector(limit=4096, limit_per_host=4)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def get(url: str) -> bytes:
                async with asyncio.timeout(30), session.get(url, allow_redirects=False) as response:
                    return await response.read()

            async def target(url: str) -> None:
                health = asyncio.ensure_future(get(f"{url}/health"))
                await get(f"{url}/metrics")
                await health

            async def round_() -> None:
                await asyncio.gather(*(target(url) for url in urls), *(get(url) for url in dcgm_urls))

            for _ in range(WARMUP):  # connections opened, caches warm
                await round_()
            conn.send("ready")
            while True:
                rounds = await asyncio.to_thread(conn.recv)
                started = time.process_time()
                for _ in range(rounds):
                    await round_()
                conn.send((time.process_time() - started) / rounds)

    asyncio.run(main())


# -- the bench's side ----------------------------------------------------------------------------------------
def start(target: object, *args: object) -> tuple[BaseProcess, Connection, Any]:
    parent, child = _ctx.Pipe()
    proc = _ctx.Process(target=target, args=(*args, child), daemon=True)
    proc.start()
    return proc, parent, _started(proc, parent)


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def raise_nofile() -> tuple[int, int, int]:
    """RLIMIT_NOFILE's soft limit raised to the hard one (the children inherit it): (soft before, hard, soft now)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return soft, hard, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@dataclass
class Exporter:
    """One exporter process and what was measured of it."""

    name: str
    proc: BaseProcess
    port: int
    expected: set[str]  # the targets it should take
    state: str = ""
    rss_mib: float = 0.0
    baseline_mib: float = 0.0
    background: float = 0.0  # CPU seconds a second, no scrape
    cpu_ms: list[float] = field(default_factory=list)  # a scrape's, the background's taken out
    gc_ms: list[float] = field(default_factory=list)  # the full garbage collections' time a scrape
    wall_ms: list[float] = field(default_factory=list)
    text: str = ""
    took_s: float = 0.0
    lag: dict[str, float] = field(default_factory=dict)
    frozen: int = 0  # the objects the exporter had frozen (gc.get_freeze_count) after its scrapes
    refreeze_ms: float = 0.0  # a full refreeze's pass (thawed, collected, frozen again), once, after the scrapes

    @property
    def ps(self) -> psutil.Process:
        return psutil.Process(self.proc.pid)


def series_by_target(text: str) -> dict[str, Counter[str]]:
    """Each target's series, counted by family, from an answer."""
    out: dict[str, Counter[str]] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        found = _TARGET.search(line)
        if found:
            out.setdefault(found.group(1), Counter())[line.split("{", 1)[0]] += 1
    return out


def up_targets(text: str) -> set[str]:
    return {
        found.group(1)
        for line in text.splitlines()
        if line.startswith("oomguard_target_up{") and line.endswith(" 1.0") and (found := _TARGET.search(line))
    }


def _per_target(text: str, family: str, marker: str) -> dict[str, float]:
    """Each target's value of `family` on the lines that also hold `marker`."""
    out = {}
    for line in text.splitlines():
        if line.startswith(family + "{") and marker in line and (found := _TARGET.search(line)):
            out[found.group(1)] = float(line.rsplit(" ", 1)[1])
    return out


def lines_read(text: str) -> dict[str, float]:
    """Each target's lines read from its log through the API."""
    return _per_target(text, "oomguard_event_source_lines_read_total", 'source="k8s-log:')


def cuda_ooms(text: str) -> dict[str, float]:
    return _per_target(text, "oomguard_target_events_total", 'kind="cuda_oom"')


async def _get(port: int, path: str = "/metrics", timeout: float = 120) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}{path}") as response:
        assert response.status == 200, response.status
        return await asyncio.wait_for(response.text(), timeout)


def wait_until(exporters: list[Exporter], gpus: dict[str, int], timeout: float) -> None:
    """Until each exporter has its expected targets up and its nodes' GPUs read (its answer kept)."""
    started = time.monotonic()
    waiting = list(exporters)
    while waiting:
        for e in list(waiting):
            e.text = asyncio.run(_get(e.port))
            read = sum(1 for line in e.text.splitlines() if line.startswith("oomguard_gpu_memory_used_bytes{"))
            if up_targets(e.text) >= e.expected and read >= gpus[e.name]:
                e.took_s = time.monotonic() - started
                waiting.remove(e)
        if time.monotonic() - started > timeout:
            state = ", ".join(f"{e.name}: {len(up_targets(e.text))} of {len(e.expected)} up" for e in waiting)
            raise RuntimeError(f"after {timeout:g}s: {state}")
        time.sleep(2.0)


def measure_background(exporters: list[Exporter]) -> None:
    """Each exporter's CPU a second while nothing scrapes (the event poller, the trend sampler, the watches)."""
    before = [(_cpu(e.ps), time.perf_counter()) for e in exporters]
    time.sleep(IDLE_SECONDS)
    for e, (cpu, at) in zip(exporters, before, strict=True):
        e.background = (_cpu(e.ps) - cpu) / (time.perf_counter() - at)


async def _scrapes(port: int, n: int, warmup: int) -> tuple[list[float], str]:
    times, text = [], ""
    async with aiohttp.ClientSession() as session:
        for i in range(warmup + n):
            started = time.perf_counter()
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                text = await response.text()
            if i >= warmup:
                times.append((time.perf_counter() - started) * 1000)
    return times, text


def scrape(e: Exporter, n: int, warmup: int = WARMUP) -> None:
    """n sequential scrapes: the CPU each (the background's share taken out), the wall time, and the time the full
    garbage collections took meanwhile (a share of that CPU: the background's passes among them)."""
    asyncio.run(_scrapes(e.port, 0, warmup))
    passes = len(_gc_passes(e.port))
    before, started = _cpu(e.ps), time.perf_counter()
    times, e.text = asyncio.run(_scrapes(e.port, n, 0))
    spent, wall = _cpu(e.ps) - before, time.perf_counter() - started
    e.cpu_ms.append((spent - e.background * wall) * 1000 / n)
    e.gc_ms.append(sum(_gc_passes(e.port)[passes:]) / n)
    e.wall_ms += times


def _gc_passes(port: int) -> list[float]:
    return json.loads(asyncio.run(_get(port, "/-/bench/gc")))


async def _lag(port: int, scrapes: int) -> dict[str, float]:
    """/-/healthy's latency, idle and while a scrape runs (a request every 2 ms, one at a time), and the full garbage
    collections meanwhile (each holds every thread)."""
    idle: list[float] = []
    busy: list[float] = []
    async with aiohttp.ClientSession() as session:

        async def ping(into: list[float]) -> None:
            started = time.perf_counter()
            async with session.get(f"http://127.0.0.1:{port}/-/healthy") as response:
                await response.read()
            into.append((time.perf_counter() - started) * 1000)

        for _ in range(100):
            await ping(idle)
            await asyncio.sleep(0.002)
        async with session.get(f"http://127.0.0.1:{port}/-/bench/gc") as response:
            passes_before = len(await response.json())
        walls = []
        for _ in range(scrapes):
            done = asyncio.Event()

            async def pinger(done: asyncio.Event = done) -> None:
                while not done.is_set():
                    await ping(busy)
                    await asyncio.sleep(0.002)

            task = asyncio.create_task(pinger())
            started = time.perf_counter()
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                await response.read()
            walls.append((time.perf_counter() - started) * 1000)
            done.set()
            await task
        async with session.get(f"http://127.0.0.1:{port}/-/bench/gc") as response:
            passes = (await response.json())[passes_before:]
    return {"idle_p50": median(idle), "idle_max": max(idle), "busy_p50": median(busy),
            "busy_p99": percentile(busy, 99), "busy_max": max(busy), "pings": len(busy),
            "scrape_ms": median(walls), "scrapes": scrapes, "gc_passes": len(passes),
            "gc_max_ms": max(passes, default=0.0), "gc_median_ms": median(passes) if passes else 0.0}  # fmt: skip


def _fds(procs: list[BaseProcess], most: dict[str, int], kind: str) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            most[kind] = max(most.get(kind, 0), psutil.Process(proc.pid).num_fds())


def _start_exporters(api_port: int, states: list[str], with_pods: bool, shards: int,
                     expected: list[set[str]], mode: str = "") -> list[Exporter]:  # fmt: skip
    out = []
    for k, state in enumerate(states):
        proc, _, port = start(_serve_exporter, api_port, state, with_pods, shards, k, mode)
        out.append(Exporter(f"shard {k}" if shards > 1 else "replica", proc, port, expected[k], state))
    return out


def _restart(api_port: int, ask: Connection, shards: list[Exporter], expected: list[set[str]], gpus: dict[str, int],
             extra: list[BaseProcess]) -> dict[str, Any]:  # fmt: skip
    """A shard killed mid-run (SIGKILL), restarted on its state folder; three groups of its pods:
    - `counted`: an OOM logged and counted while it ran, then the kill: counted once after the restart, not twice;
    - `read`: a line of their log read while it ran (a position saved), an OOM logged while it is down;
    - `unread`: no line logged since the shard started (their lines all older), an OOM logged while it is down."""
    k = 1 if len(shards) > 1 else 0
    e = shards[k]
    mine = [t.split("/")[1] for t in sorted(e.expected)]
    groups = {"counted": mine[:5], "read": mine[5:15], "unread": mine[15:25]}
    lines_before = lines_read(asyncio.run(_get(e.port)))
    ask.send(("info", groups["read"]))
    ask.recv()
    ask.send(("oom", groups["counted"]))
    ask.recv()
    deadline = time.monotonic() + 120
    while True:  # counted and read by the running shard: then it is killed at once
        text = asyncio.run(_get(e.port))
        counts, read = cuda_ooms(text), lines_read(text)
        done = all(counts.get(f"llm/{p}") == 1.0 for p in groups["counted"]) and all(
            read.get(f"llm/{p}", 0.0) > lines_before.get(f"llm/{p}", 0.0) for p in groups["read"]
        )
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    counted_before = sum(counts.get(f"llm/{p}", 0.0) for p in groups["counted"])
    time.sleep(1.0)  # the poll after the count has saved the state (every 0.5 s when it changed)
    e.proc.kill()
    e.proc.join()
    killed = time.monotonic()
    time.sleep(1.0)
    ask.send(("oom", groups["read"] + groups["unread"]))
    ask.recv()
    time.sleep(2.0)
    proc, _, port = start(_serve_exporter, api_port, e.state, True, len(shards), k, "")
    extra.append(proc)
    restarted = Exporter(e.name, proc, port, expected[k], e.state)
    wait_until([restarted], gpus, 600)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        counts = cuda_ooms(asyncio.run(_get(port)))
        if all(counts.get(f"llm/{p}", 0.0) >= 1.0 for group in groups.values() for p in group):
            break
        time.sleep(1.0)
    waited = time.monotonic() - killed
    time.sleep(10.0)  # a late count would show now
    text = asyncio.run(_get(port))
    counts = cuda_ooms(text)
    ours = {f"llm/{p}" for group in groups.values() for p in group}
    return {
        "shard": e.name,
        "counted_before_kill": counted_before,
        "up_again_s": restarted.took_s,
        "waited_s": waited,
        "groups": {
            name: {
                "pods": len(group),
                "once": sum(1 for p in group if counts.get(f"llm/{p}") == 1.0),
                "twice": sum(1 for p in group if counts.get(f"llm/{p}", 0.0) > 1.0),
                "missed": sum(1 for p in group if counts.get(f"llm/{p}", 0.0) < 1.0),
            }
            for name, group in groups.items()
        },
        "others_counted": {t: v for t, v in counts.items() if t not in ours and v},
        "targets_after": len(up_targets(text)),
    }


def _traced(api_port: int, shards: int, name: str, expected: set[str], gpus: dict[str, int]) -> dict[str, Any]:
    """The first shard (and its no-pod baseline) under tracemalloc: where a target's traced memory goes."""
    out: dict[str, Any] = {}
    for with_pods in (False, True):
        with tempfile.TemporaryDirectory(prefix="oomguard-bench-") as state:
            proc, _, port = start(_serve_exporter, api_port, state, with_pods, shards, 0, "trace")
            e = Exporter(name, proc, port, expected if with_pods else set(), state)
            try:
                wait_until([e], gpus, 900)
                time.sleep(SETTLE_SECONDS)
                for _ in range(3):
                    asyncio.run(_get(port))
                out[str(with_pods)] = json.loads(asyncio.run(_get(port, "/-/bench/tracemalloc", 600)))
                out[f"rss {with_pods}"] = e.ps.memory_info().rss / 2**20
            finally:
                proc.kill()
    return out


def _trend_full(api_port: int, shards: int, first: Exporter, gpus: dict[str, int], root: str) -> dict[str, Any]:
    """The first shard and its no-pod baseline with the trend's window compressed tenfold (TREND_COMPRESSED), their
    RSS once every series holds its full window (901 samples; 30 minutes as shipped)."""
    window = TREND_COMPRESSED["long_window_seconds"]
    pair = []
    for with_pods in (False, True):
        state = tempfile.mkdtemp(prefix="trend-", dir=root)
        proc, _, port = start(_serve_exporter, api_port, state, with_pods, shards, 0, "trend")
        pair.append(Exporter(first.name, proc, port, first.expected if with_pods else set(), state))
    try:
        wait_until(pair, gpus, 600)
        started = time.monotonic()
        rss = []
        for at in (30.0, window):  # early, about when the main measurement takes it; then with the window full
            time.sleep(max(0.0, started + at - time.monotonic()))
            rss.append([e.ps.memory_info().rss / 2**20 for e in pair])
        samples = re.search(r"^oomguard_trend_samples_total (\S+)$", asyncio.run(_get(pair[1].port)), re.M)
    finally:
        for e in pair:
            e.proc.kill()
    targets = len(first.expected)
    return {"targets": targets, "samples": float(samples.group(1)) if samples else 0.0,
            "early": rss[0], "full": rss[1], "window": window}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=4000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--scrapes", type=int, default=10, help="sequential scrapes a shard (and a turn)")
    parser.add_argument("--restart", action="store_true", help="kill a shard mid-run, log OOMs, restart it")
    parser.add_argument("--tracemalloc", action="store_true", help="where the first shard's memory goes")
    parser.add_argument("--trend-full", action="store_true", help="the RSS once the trend's window is full")
    parser.add_argument("--freeze-probe", action="store_true", help="the first shard again after a gc.freeze()")
    parser.add_argument("--no-ratios", action="store_true", help="skip the node mode and the bare client")
    parser.add_argument("--block", type=int, default=0, choices=range(0, 60),
                        help="the addresses' block: engines at 127.(2K+1).x.y, dcgm-exporters at 127.(2K+2).x.y "
                        "(another run on the same machine takes another)")  # fmt: skip
    args = parser.parse_args()
    os.environ[BLOCK] = str(args.block)  # the bench's processes inherit it
    if args.pods > args.nodes * GPUS_PER_NODE:
        parser.error(f"at most {GPUS_PER_NODE} pods a node (one a GPU)")
    soft_before, hard, soft = raise_nofile()
    started_at = time.monotonic()
    header = machine()
    node_shard = [shard_of(node_name(n), args.shards) if args.shards > 1 else 0 for n in range(args.nodes)]
    expected = [
        {target_name(i) for i in range(args.pods) if node_shard[i % args.nodes] == k} for k in range(args.shards)
    ]
    names = ["replica"] if args.shards == 1 else [f"shard {k}" for k in range(args.shards)]
    gpus = {name: GPUS_PER_NODE * node_shard.count(k) for k, name in enumerate(names)}
    fds: dict[str, int] = {}
    engines = [
        start(_serve_engines, first, min(ENGINES_PER_PROCESS, args.pods - first))[0]
        for first in range(0, args.pods, ENGINES_PER_PROCESS)
    ]
    cluster, ask, api_port = start(_serve_cluster, args.pods, args.nodes)
    print(f"cluster up in {time.monotonic() - started_at:.0f} s", file=sys.stderr)
    root = tempfile.mkdtemp(prefix="oomguard-bench-")  # the state folders, removed at the end
    states = [tempfile.mkdtemp(prefix=f"shard-{k}-", dir=root) for k in range(args.shards)]
    shards: list[Exporter] = []
    extra: list[BaseProcess] = []
    results: dict[str, Any] = {}
    try:
        # The baselines: each shard watching no engine pod (its nodes' dcgm-exporters still read), all at once.
        baselines = _start_exporters(api_port, [tempfile.mkdtemp(dir=root) for _ in states], False, args.shards,
                                     [set()] * args.shards)  # fmt: skip
        try:
            wait_until(baselines, gpus, 300)
            time.sleep(SETTLE_SECONDS)
            base = [b.ps.memory_info().rss / 2**20 for b in baselines]
        finally:
            for b in baselines:
                b.proc.kill()
        print(f"baselines done at {time.monotonic() - started_at:.0f} s", file=sys.stderr)

        shards = _start_exporters(api_port, states, True, args.shards, expected)
        wait_until(shards, gpus, 1200)
        time.sleep(SETTLE_SECONDS)
        print(f"shards up at {time.monotonic() - started_at:.0f} s", file=sys.stderr)
        _fds([cluster], fds, "API stand-in and dcgm-exporters")
        _fds(engines, fds, "engines (a process of 1,000)")
        _fds([s.proc for s in shards], fds, "an exporter")
        taken = [up_targets(s.text) for s in shards]
        everyone = {target_name(i) for i in range(args.pods)}
        counted = Counter(t for ts in taken for t in ts)
        results["coverage"] = {
            "taken": sum(len(t) for t in taken),
            "missing": len(everyone - set(counted)),
            "twice": sum(1 for n in counted.values() if n > 1),
            "as_hashed": all(t == x for t, x in zip(taken, expected, strict=True)),
        }
        for s, b in zip(shards, base, strict=True):
            s.baseline_mib = b
        measure_background(shards)
        mark = cpu_mark()
        for s in shards:
            scrape(s, args.scrapes)
            s.rss_mib = s.ps.memory_info().rss / 2**20
        results["other_load"] = other_load(mark)
        print(f"shards measured at {time.monotonic() - started_at:.0f} s", file=sys.stderr)
        for s in shards:
            s.lag = asyncio.run(_lag(s.port, 3))
            s.frozen = int(asyncio.run(_get(s.port, "/-/bench/frozen")))
            s.refreeze_ms = float(asyncio.run(_get(s.port, "/-/bench/refreeze")))
        _fds([cluster], fds, "API stand-in and dcgm-exporters")
        _fds(engines, fds, "engines (a process of 1,000)")
        _fds([s.proc for s in shards], fds, "an exporter")

        first = shards[0]
        mine = sorted(int(t.rsplit("-", 1)[1]) for t in first.expected)
        if not args.no_ratios:
            # The node mode on the same engines, and the bare client on the same bodies, in turns with the shard.
            node_state = tempfile.mkdtemp(prefix="node-", dir=root)
            node_proc, _, node_port = start(_serve_node_exporter, mine, node_state, False)
            extra.append(node_proc)
            node = Exporter("node mode", node_proc, node_port, first.expected)
            wait_until([node], {"node mode": GPUS_PER_NODE}, 600)
            time.sleep(SETTLE_SECONDS)
            dcgm_urls = [f"http://{dcgm_ip(n)}:{DCGM_PORT}/metrics" for n in range(args.nodes) if node_shard[n] == 0]
            bare_proc, bare, _ = start(
                _serve_bare_client, [f"http://{engine_ip(i)}:{ENGINE_PORT}" for i in mine], dcgm_urls
            )
            extra.append(bare_proc)
            _fds(engines, fds, "engines (a process of 1,000)")
            turn_shard = Exporter(first.name, first.proc, first.port, first.expected)
            measure_background([turn_shard, node])
            client_ms: list[float] = []
            mark = cpu_mark()
            for _ in range(TURNS):
                scrape(turn_shard, args.scrapes, warmup=1)
                scrape(node, args.scrapes, warmup=1)
                bare.send(args.scrapes)
                client_ms.append(bare.recv() * 1000)
            results["turns_other_load"] = other_load(mark)
            bare_proc.kill()
            node.lag = asyncio.run(_lag(node.port, 3))
            node.rss_mib = node.ps.memory_info().rss / 2**20
            node_proc.kill()
            # The node mode's series a target with a log file followed (a node agent's log source), 10 targets.
            logs_state = tempfile.mkdtemp(prefix="node-logs-", dir=root)
            logs_proc, _, logs_port = start(_serve_node_exporter, mine[:10], logs_state, True)
            extra.append(logs_proc)
            with_logs = Exporter("node mode, logs", logs_proc, logs_port, {target_name(i) for i in mine[:10]})
            wait_until([with_logs], {"node mode, logs": GPUS_PER_NODE}, 120)
            time.sleep(SETTLE_SECONDS)
            with_logs.text = asyncio.run(_get(logs_port))
            logs_proc.kill()
            results["turns"] = {"shard": turn_shard, "node": node, "client_ms": client_ms, "node_logs": with_logs}
            print(f"ratios measured at {time.monotonic() - started_at:.0f} s", file=sys.stderr)
            if args.freeze_probe:
                # The bench's probe, not the exporter's code: gc.freeze() in its process once every target is up (the
                # exporter freezes what exists at its start, before any pod is discovered); the same turns again.
                frozen_count = int(asyncio.run(_get(first.port, "/-/bench/freeze")))
                frozen = Exporter(first.name, first.proc, first.port, first.expected)
                measure_background([frozen])
                for _ in range(TURNS):
                    scrape(frozen, args.scrapes, warmup=1)
                frozen.lag = asyncio.run(_lag(frozen.port, 3))
                results["frozen"] = {"exporter": frozen, "objects": frozen_count}
        if args.restart:
            try:
                results["restart"] = _restart(api_port, ask, shards, expected, gpus, extra)
            except Exception as exc:  # the figures above are still reported
                results.setdefault("errors", []).append(f"the restart: {exc!r}")
            print(f"restart done at {time.monotonic() - started_at:.0f} s", file=sys.stderr)
        ask.send(("stats",))
        results["stats"] = ask.recv()
        if args.trend_full:
            for proc in [s.proc for s in shards] + extra:
                proc.kill()
            try:
                results["trend_full"] = _trend_full(api_port, args.shards, first, gpus, root)
            except Exception as exc:
                results.setdefault("errors", []).append(f"the trend's full window: {exc!r}")
            print(f"trend's full window done at {time.monotonic() - started_at:.0f} s", file=sys.stderr)
        if args.tracemalloc:
            for proc in [s.proc for s in shards] + extra:
                proc.kill()
            try:
                results["traced"] = _traced(api_port, args.shards, first.name, first.expected, gpus)
            except Exception as exc:
                results.setdefault("errors", []).append(f"tracemalloc: {exc!r}")
            print(f"tracemalloc done at {time.monotonic() - started_at:.0f} s", file=sys.stderr)
    finally:
        for s in shards:
            s.proc.kill()
        for proc in extra:
            proc.kill()
        cluster.kill()
        for proc in engines:
            proc.kill()
        shutil.rmtree(root, ignore_errors=True)
    report(args, results, shards, header, (soft_before, hard, soft), fds, time.monotonic() - started_at)


def report(args: argparse.Namespace, results: dict[str, Any], shards: list[Exporter], header: str,
           nofile: tuple[int, int, int], fds: dict[str, int], seconds: float) -> None:  # fmt: skip
    soft_before, hard, soft = nofile
    n = args.pods
    layout = f"{args.shards} shards" if args.shards > 1 else "one replica"
    print(f"## The cluster mode: {n} engine pods on {args.nodes} nodes, {layout}, {args.scrapes} sequential scrapes")
    print(f"({header}; {seconds / 60:.1f} min in all)\n")
    raised = f"raised from {soft_before} to the hard limit" if soft_before != soft else "already the hard limit"
    print(f"Descriptors: RLIMIT_NOFILE soft {soft} ({raised} {hard}); the most held: "
          + ", ".join(f"{k} {v}" for k, v in fds.items()) + "\n")  # fmt: skip
    cover = results["coverage"]
    print(f"Targets taken: {cover['taken']} of {n}, {cover['missing']} missing, {cover['twice']} by two shards; "
          f"each shard took its nodes' pods as hashed: {'yes' if cover['as_hashed'] else 'NO'}\n")  # fmt: skip
    follows = results["stats"]["follows"]
    print("| exporter | targets | up after | RSS (no pods) | RSS a target | background | CPU a scrape | a target "
          "| full GC in it | scrape median / p99 | answer | series a target | log streams open |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in shards:
        targets = len(up_targets(s.text))
        per = series_by_target(s.text)
        series = statistics.median(sum(c.values()) for c in per.values()) if per else 0
        open_ = re.search(r"^oomguard_log_streams_open (\S+)$", s.text, re.M)
        cpu = median(s.cpu_ms)
        wall, streams = f"{median(s.wall_ms):.0f} / {percentile(s.wall_ms, 99):.0f}", open_.group(1) if open_ else "?"
        print(
            f"| {s.name} | {targets} | {s.took_s:.0f} s | {s.rss_mib:.0f} MiB ({s.baseline_mib:.0f}) "
            f"| {(s.rss_mib - s.baseline_mib) * 1024 / max(1, targets):.0f} KiB | {s.background * 1000:.0f} ms/s "
            f"| {cpu:.0f} ms | {cpu / max(1, targets):.3f} ms | {median(s.gc_ms):.0f} ms | {wall} ms "
            f"| {len(s.text.encode()) / 2**20:.1f} MiB "
            f"| {series:.0f} | {float(streams):.0f} |"
        )
    print(
        "\nThe event loop while a scrape is answered: /-/healthy's latency (a request every 2 ms during 3 scrapes) and "
        "the full garbage collections meanwhile (each holds every thread, the loop's included):\n"
    )
    print("| exporter | /-/healthy idle p50 | in a scrape p50 / p99 / max | scrape | full GC passes | median / max |")
    print("|---|---:|---:|---:|---:|---:|")
    lagged = [*shards, results["turns"]["node"]] if "turns" in results else shards
    for s in lagged:
        lag = s.lag
        print(f"| {s.name} | {lag['idle_p50']:.1f} ms | {lag['busy_p50']:.1f} / {lag['busy_p99']:.0f} / "
              f"{lag['busy_max']:.0f} ms ({lag['pings']:.0f} pings) | {lag['scrape_ms']:.0f} ms | {lag['gc_passes']} "
              f"in {lag['scrapes']} scrapes | {lag['gc_median_ms']:.0f} / {lag['gc_max_ms']:.0f} ms |")  # fmt: skip
    print(f"\nother load during the shards' scrapes: {results['other_load']:.0f} %; log streams asked (follow=true) "
          f"{sum(follows.values())} for {len(follows)} pods")  # fmt: skip
    watches = sorted({r.split("&resourceVersion")[0] for r in results["stats"]["lists_and_watches"]})
    print("\nlist and watch requests (each filtered by the server):\n")
    print("\n".join(f"- `{r}`" for r in watches[:6]))

    kib = [(s.rss_mib - s.baseline_mib) * 1024 / max(1, len(up_targets(s.text))) for s in shards]
    print("\n### Goals\n")
    _loop_goals(shards)
    print(f"- at most {GOAL_KIB_PER_TARGET:g} KiB of RSS a target: {min(kib):.0f} to {max(kib):.0f} KiB "
          f"({_verdict(max(kib), GOAL_KIB_PER_TARGET)})")  # fmt: skip
    if "turns" in results:
        turns = results["turns"]
        shard, node, client = turns["shard"], turns["node"], turns["client_ms"]
        targets = len(shard.expected)
        c, m, b = median(shard.cpu_ms) / targets, median(node.cpu_ms) / targets, median(client) / targets
        print(f"- a cluster-mode target at most {GOAL_VS_NODE:g}x a node-mode target's CPU a scrape ({shard.name}, "
              f"{targets} targets, {TURNS} turns of {args.scrapes} scrapes): {c:.3f} against {m:.3f} ms, "
              f"**{c / m:.2f}x** ({_verdict(c / m, GOAL_VS_NODE)}); turns {_turns(shard.cpu_ms, targets)} and "
              f"{_turns(node.cpu_ms, targets)}")  # fmt: skip
        print(
            f"- a scrape at most {GOAL_VS_CLIENT:g}x the bare client fetching the same bodies ({targets} engines' "
            f"/metrics and /health, the shard's dcgm-exporters): {c:.3f} against {b:.3f} ms a target, "
            f"**{c / b:.2f}x** ({_verdict(c / b, GOAL_VS_CLIENT)}); the node mode: {m / b:.2f}x; client turns "
            f"{', '.join(f'{x / targets:.3f}' for x in client)}; other load {results['turns_other_load']:.0f} %"
        )
        cg, mg = median(shard.gc_ms) / targets, median(node.gc_ms) / targets
        print(f"  (the full garbage collections, a target: {cg:.3f} ms of it in the cluster mode, {mg:.3f} in the node "
              f"mode; without them {c - cg:.3f} against {m - mg:.3f} ms, {(c - cg) / (m - mg):.2f}x)")  # fmt: skip
        if "frozen" in results:
            f, objects = results["frozen"]["exporter"], results["frozen"]["objects"]
            fc, fg = median(f.cpu_ms) / targets, median(f.gc_ms) / targets
            print(f"  (the bench's probe, gc.freeze() in the exporter once its targets are up ({objects} objects "
                  f"frozen): {fc:.3f} ms a target, **{fc / m:.2f}x** the node mode's, {fg:.3f} of it full collections; "
                  f"turns {_turns(f.cpu_ms, targets)}; /-/healthy in a scrape p99 / max {f.lag['busy_p99']:.0f} / "
                  f"{f.lag['busy_max']:.0f} ms, {f.lag['gc_passes']} full passes in 3 scrapes, at most "
                  f"{f.lag['gc_max_ms']:.0f} ms)")  # fmt: skip
        print(f"  (the node mode: background {node.background * 1000:.0f} ms/s, scrape median "
              f"{median(node.wall_ms):.0f} ms, answer {len(node.text.encode()) / 2**20:.1f} MiB, RSS "
              f"{node.rss_mib:.0f} MiB)")  # fmt: skip
        cluster_series = series_by_target(shards[0].text)
        node_series = series_by_target(node.text)
        logs_series = series_by_target(turns["node_logs"].text)
        _series(cluster_series, node_series, logs_series)
    if "restart" in results:
        r = results["restart"]
        print(f"\n### {r['shard']} killed mid-run (SIGKILL) and restarted on its state folder\n")
        print(
            f"Up again with {r['targets_after']} targets {r['up_again_s']:.0f} s after its start; the OOMs waited for "
            f"up to {r['waited_s']:.0f} s after the kill; {r['counted_before_kill']:g} counted before the kill.\n"
        )
        print("| its pods | pods | counted once | twice | missed |\n|---|---:|---:|---:|---:|")
        titles = {
            "counted": "an OOM counted, then the kill",
            "read": "a line read before the kill, an OOM while down",
            "unread": "no line since the shard's first start, an OOM while down",
        }
        for name, g in r["groups"].items():
            print(f"| {titles[name]} | {g['pods']} | {g['once']} | {g['twice']} | {g['missed']} |")
        print(f"\nother pods counted: {r['others_counted'] or 'none'}")
    if "trend_full" in results:
        t = results["trend_full"]
        early, full = ((with_ - without) * 1024 / t["targets"] for without, with_ in (t["early"], t["full"]))
        print(f"\n### The trend's window full (compressed tenfold: {t['window']:g} s, 901 samples a series)\n")
        print(f"RSS a target, {t['targets']} targets against none: **{early:.0f} KiB** 30 s after the start, "
              f"**{full:.0f} KiB** once the window is full ({t['samples']:.0f} samples taken); RSS "
              f"{t['early'][1]:.0f} -> {t['full'][1]:.0f} MiB (no pods: {t['early'][0]:.0f} -> {t['full'][0]:.0f}); "
              f"{_verdict(full, GOAL_KIB_PER_TARGET)}")  # fmt: skip
    for error in results.get("errors", []):
        print(f"\n**Failed:** {error}")
    if "traced" in results:
        _traced_report(results["traced"], len(shards[0].expected) if shards else n)


def _loop_goals(shards: list[Exporter]) -> None:
    """Issue 50's items 1 and 5: the loop's longest stall in a scrape, and the idle cost (at 1,000 pods; for fewer,
    their share of the goal)."""
    worst = max(shards, key=lambda s: s.lag["busy_max"])
    lag, frozen = worst.lag, ", ".join(f"{s.frozen}" for s in shards)
    print(f"- the event loop's longest stall during a scrape at most {GOAL_STALL_MS:g} ms (/-/healthy's longest wait, "
          f"{lag['pings']:.0f} pings in 3 scrapes of {len(worst.expected)} targets, {worst.name}): "
          f"**{lag['busy_max']:.0f} ms** ({_verdict(lag['busy_max'], GOAL_STALL_MS)}); full passes {lag['gc_passes']}, "
          f"the longest {lag['gc_max_ms']:.0f} ms; frozen by the exporter: {frozen} objects")  # fmt: skip
    print(f"  (a refreeze after the target set changed, at most every 10 minutes: one full pass of "
          f"{', '.join(f'{s.refreeze_ms:.0f}' for s in shards)} ms)")  # fmt: skip
    for s in shards:
        targets = max(1, len(s.expected))
        goal = GOAL_IDLE_MS_S * min(1.0, targets / 1000)
        scaled = "" if targets >= 1000 else f" (its {targets} pods' share of {GOAL_IDLE_MS_S:g} ms/s at 1,000)"
        print(f"- the idle cost at most {goal:.1f} ms of CPU a second{scaled}, {s.name}: **{s.background * 1000:.1f} "
              f"ms/s** ({_verdict(s.background * 1000, goal)}; as at 1,000 pods: "
              f"{s.background * 1000 * 1000 / targets:.0f} ms/s)")  # fmt: skip


def _turns(values: list[float], targets: int) -> str:
    return "(" + ", ".join(f"{v / targets:.3f}" for v in values) + ")"


def _verdict(value: float, goal: float) -> str:
    if value <= goal:
        return "met"
    return f"not met, {value / goal:.2f}x the goal"


def _series(cluster: dict[str, Counter[str]], node: dict[str, Counter[str]], logs: dict[str, Counter[str]]) -> None:
    def typical(per: dict[str, Counter[str]]) -> Counter[str]:
        count = statistics.median_low(sum(c.values()) for c in per.values())
        return next(c for c in per.values() if sum(c.values()) == count)

    c, m, lf = typical(cluster), typical(node), typical(logs)
    print(
        f"- no more series a target than the node mode: {sum(c.values())} against {sum(m.values())} "
        f"({_verdict(sum(c.values()), sum(m.values()))}); the node mode with a log file followed: {sum(lf.values())}"
    )
    print("\n| family | cluster mode | node mode | node mode, a log file followed |\n|---|---:|---:|---:|")
    for family in sorted(set(c) | set(m) | set(lf)):
        if c[family] != m[family]:
            print(f"| `{family}` | {c[family]} | {m[family]} | {lf[family]} |")


def _traced_report(traced: dict[str, Any], targets: int) -> None:
    with_pods, without = traced["True"], traced["False"]
    total = (with_pods["total"] - without["total"]) / 1024 / targets
    rss = (traced["rss True"] - traced["rss False"]) * 1024 / targets
    print(f"\n### Where a target's memory goes (tracemalloc, 8 frames; {targets} targets against none)\n")
    print(f"traced by Python's allocator: {total:.1f} KiB a target (the RSS under tracemalloc: {rss:.0f} KiB a target, "
          "tracemalloc's own tables in it)\n")  # fmt: skip
    titles = (("files", "module of the innermost oomguard frame"), ("ours", "innermost oomguard frame"),
              ("lines", "allocating line"))  # fmt: skip
    for key, title in titles:
        diff = Counter({k: v - without[key].get(k, 0) for k, v in with_pods[key].items()})
        print(f"| {title} | KiB a target |\n|---|---:|")
        for where, size in diff.most_common(15):
            print(f"| `{where}` | {size / 1024 / targets:.2f} |")
        print()


if __name__ == "__main__":
    main()
