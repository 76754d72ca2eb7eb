"""The cluster mode at the size it is built for: 500 engine pods on 100 nodes, one exporter.

One process plays the cluster: the stand-in API server of the tests (tests/sources/kubernetes/stand_in.py: list,
watch, pods/log) with 500 vLLM pods, 5 per node, and 100 dcgm-exporter pods, one per node; each engine pod is an
aiohttp site at its own pod IP (127.1.x.y:8000) serving the real 50 kB vLLM body, each dcgm-exporter one at its
own (127.2.x.y:9400) serving 8 GPUs, 5 of them used by that node's pods; every engine's log holds a few lines and
is followed. Another process is the exporter in the cluster mode (deploy/kubernetes-cluster/oomguard.yaml's
settings), with a state folder. Once every target is up, the client scrapes it sequentially; reported: the
exporter's RSS with the pods against one with none (the growth per target), its CPU time per scrape (all its
threads) with the background's (the event poller over every log, the trend sampler) measured apart and taken
out, the scrape's wall time, the open log streams, the list and watch requests (filtered by the server).
Run: python bench/bench_cluster.py [--pods 500] [--nodes 100] [--scrapes 20]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

import aiohttp
import psutil
from _common import FIXTURE, _ctx, _started, cpu_mark, machine, median, other_load, percentile
from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the tests' stand-in API and objects

WARMUP = 3
IDLE_SECONDS = 10.0
ENGINE_PORT, DCGM_PORT = 8000, 9400
GOAL_MS_PER_TARGET = 0.4  # the scrape-cost issue's goal, at 500 targets


def engine_ip(i: int) -> str:
    return f"127.1.{i // 250}.{i % 250 + 1}"


def dcgm_ip(n: int) -> str:
    return f"127.2.{n // 250}.{n % 250 + 1}"


def dcgm_body(node: str, pods: list[str]) -> str:
    lines = []
    for family in ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_GPU_UTIL"):
        lines += [f"# HELP {family} (bench)", f"# TYPE {family} gauge"]
        for gpu in range(8):
            pod = f',container="vllm",namespace="llm",pod="{pods[gpu]}"' if gpu < len(pods) else ""
            value = {"DCGM_FI_DEV_FB_FREE": 8000, "DCGM_FI_DEV_FB_USED": 73000, "DCGM_FI_DEV_FB_RESERVED": 512,
                     "DCGM_FI_DEV_GPU_UTIL": 80}[family]  # fmt: skip
            lines.append(
                f'{family}{{gpu="{gpu}",UUID="GPU-{node}-{gpu}",pci_bus_id="00000000:{16 + gpu:02X}:00.0",'
                f'device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="{node}"{pod}}} {value}'
            )
    return "\n".join(lines) + "\n"


def _serve_cluster(pods: int, nodes: int, conn: Connection) -> None:
    from tests.sources.kubernetes import objects
    from tests.sources.kubernetes.stand_in import StandIn

    body = FIXTURE.read_bytes()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def main() -> None:
        api = StandIn()
        runners = []
        engines = web.Application()
        engines.router.add_get("/metrics", metrics)
        engines.router.add_get("/health", health)
        runner = web.AppRunner(engines, access_log=None)
        await runner.setup()
        runners.append(runner)
        per_node: dict[int, list[str]] = {}
        for i in range(pods):
            await web.TCPSite(runner, engine_ip(i), ENGINE_PORT).start()
            node = i % nodes
            name = f"vllm-{i:03d}"
            per_node.setdefault(node, []).append(name)
            await api.put("pods", objects.pod(name, engine_ip(i), ENGINE_PORT, node=f"gpu-{node:03d}"))
            for n in range(3):
                await api.log("llm", name, "vllm", f"INFO line {n} of {name}", container_id="a" * 64)
        for node in range(nodes):
            text = dcgm_body(f"gpu-{node:03d}", per_node.get(node, []))

            async def dcgm(_: web.Request, text: str = text) -> web.Response:
                return web.Response(text=text)

            app = web.Application()
            app.router.add_get("/metrics", dcgm)
            dcgm_runner = web.AppRunner(app, access_log=None)
            await dcgm_runner.setup()
            runners.append(dcgm_runner)
            await web.TCPSite(dcgm_runner, dcgm_ip(node), DCGM_PORT).start()
            pod = objects.pod(f"dcgm-{node:03d}", dcgm_ip(node), DCGM_PORT, namespace="gpu-operator",
                              node=f"gpu-{node:03d}", labels={"app": "nvidia-dcgm-exporter"})  # fmt: skip
            pod["metadata"]["ownerReferences"] = [  # the GPU Operator's DaemonSet: the only dcgm-exporter taken
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "nvidia-dcgm-exporter", "controller": True}
            ]
            await api.put("pods", pod)
        api_runner = web.AppRunner(api.app(), access_log=None)
        await api_runner.setup()
        site = web.TCPSite(api_runner, "127.0.0.1", 0)
        await site.start()
        conn.send(api_runner.addresses[0][1])
        while True:  # answer the client's questions about the API's side
            await asyncio.sleep(0.2)
            if conn.poll():
                conn.recv()
                streams = sum(1 for r in api.log_requests if r.get("follow") == "true")
                conn.send({"requests": len(api.requests), "log_streams": streams,
                           "lists_and_watches": [r for r in api.requests if "/log" not in r]})  # fmt: skip

    asyncio.run(main())


def _serve_exporter(api_port: int, state: str, with_pods: bool, conn: Connection) -> None:
    from _common import serve

    from oomguard.config_file import load_config
    from oomguard.runtime import Runtime
    from oomguard.web import make_app

    kubeconfig = Path(state) / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: bench\n"
        f"clusters: [{{name: bench, cluster: {{server: 'http://127.0.0.1:{api_port}'}}}}]\n"
        "users: [{name: oomguard, user: {token: bench}}]\n"
        "contexts: [{name: bench, context: {cluster: bench, user: oomguard}}]\n"
    )
    selector = "app.kubernetes.io/name=vllm" if with_pods else "app.kubernetes.io/name=none"
    config = load_config(None, {
        "state_dir": state,
        "events": {"kernel_log": False, "xid": False},
        "kubernetes": {"scope": "cluster", "port": "http", "label_selector": selector, "kubeconfig": str(kubeconfig)},
        "dcgm": {"discover": True, "port": DCGM_PORT},
    })  # fmt: skip
    asyncio.run(serve(make_app(Runtime(config)), conn))


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def start(target: object, *args: object) -> tuple[object, Connection, object]:
    parent, child = _ctx.Pipe()
    proc = _ctx.Process(target=target, args=(*args, child), daemon=True)
    proc.start()
    return proc, parent, _started(proc, parent)


async def _wait_until_up(port: int, pods: int, nodes: int, timeout: float) -> tuple[float, str]:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                text = await response.text()
            up = sum(
                1 for line in text.splitlines() if line.startswith("oomguard_target_up{") and line.endswith(" 1.0")
            )
            gpus = sum(1 for line in text.splitlines() if line.startswith("oomguard_gpu_memory_used_bytes{"))
            if up >= pods and gpus >= 8 * nodes:
                return time.monotonic() - (deadline - timeout), text
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {up} of {pods} targets up, {gpus} GPUs after {timeout:g}s")
            await asyncio.sleep(0.5)


async def _scrapes(port: int, n: int) -> list[float]:
    times = []
    async with aiohttp.ClientSession() as session:
        for i in range(WARMUP + n):
            started = time.perf_counter()
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                await response.read()
            if i >= WARMUP:
                times.append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--scrapes", type=int, default=20)
    args = parser.parse_args()
    cluster, ask, api_port = start(_serve_cluster, args.pods, args.nodes)
    rss: dict[bool, float] = {}
    try:
        for with_pods in (False, True):
            with tempfile.TemporaryDirectory(prefix="oomguard-bench-") as state:
                exporter, _, port = start(_serve_exporter, api_port, state, with_pods)
                try:
                    took, text = asyncio.run(_wait_until_up(port, args.pods if with_pods else 0, args.nodes, 300))
                    time.sleep(5)  # the log streams opened, the first trend ticks done
                    proc = psutil.Process(exporter.pid)
                    if with_pods:
                        # What runs without a scrape (the event poller over every log, the trend sampler, the
                        # watches), per second, then the scrapes: their CPU with the background's share taken out.
                        idle_before, idle_started = _cpu(proc), time.perf_counter()
                        time.sleep(IDLE_SECONDS)
                        background = (_cpu(proc) - idle_before) / (time.perf_counter() - idle_started)
                        mark = cpu_mark()
                        before, started = _cpu(proc), time.perf_counter()
                        times = asyncio.run(_scrapes(port, args.scrapes))
                        spent, wall = _cpu(proc) - before, time.perf_counter() - started
                        other = other_load(mark)
                        cpu = (spent - background * wall) * 1000 / args.scrapes
                        answer = len(text.encode())
                    rss[with_pods] = proc.memory_info().rss / 2**20
                finally:
                    exporter.kill()
        ask.send("stats")
        stats = ask.recv()
    finally:
        cluster.kill()
    per_target = (rss[True] - rss[False]) * 1024 / args.pods
    print(f"## The cluster mode: {args.pods} engine pods on {args.nodes} nodes, {args.scrapes} sequential scrapes")
    print(f"({machine()})\n")
    print("| figure | value |")
    print("|---|---:|")
    print(f"| all {args.pods} targets up and every node's GPUs read, from the exporter's start | {took:.1f} s |")
    print(f"| exporter RSS without pods / with them | {rss[False]:.0f} / {rss[True]:.0f} MiB |")
    print(f"| RSS per target | {per_target:.0f} KiB |")
    print(f"| scrape median / p99 | {median(times):.0f} / {percentile(times, 99):.0f} ms |")
    print(f"| exporter CPU in the background, no scrape | {background * 1000:.0f} ms/s |")
    print(
        f"| exporter CPU per scrape, the background's taken out | {cpu:.0f} ms ({cpu / args.pods:.2f} ms per target) |"
    )
    print(f"| answer | {answer / 1024:.0f} kB |")
    print(f"| log streams opened (one per engine container) | {stats['log_streams']} |")
    print(f"| other load during the scrapes | {other:.0f} % |")
    watches = sorted({r.split("&resourceVersion")[0] for r in stats["lists_and_watches"]})
    print("\nlist and watch requests (each filtered by the server):\n")
    print("\n".join(f"- `{r}`" for r in watches[:6]))
    verdict = "met" if cpu / args.pods <= GOAL_MS_PER_TARGET else "not met"
    print(f"\ngoal: at most {GOAL_MS_PER_TARGET:g} ms of exporter CPU per target: {cpu / args.pods:.2f} ({verdict})")


if __name__ == "__main__":
    main()
