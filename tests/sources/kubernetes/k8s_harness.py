"""The pieces of a discovery test: the stand-in API on a port of its own, engines at pod IPs
(127.0.0.x), a kubeconfig naming the stand-in, and a runtime reading them."""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web
from support import samples, vllm_body

from oomguard.exporter.config import Config
from oomguard.exporter.config_loader import CHECKS
from oomguard.exporter.exposition import render
from oomguard.exporter.runtime import Runtime
from oomguard.simulate import kubernetes_objects as objects
from oomguard.simulate.kubernetes_api import StandIn
from oomguard.simulate.kubernetes_objects import NODE

# An engine's OOM as its log has it: PyTorch's exception ends a traceback.
TRACEBACK = "Traceback (most recent call last):"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB"


async def wait_for(condition: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    """Poll `condition` (sync or async) until it is truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def equals(value: Awaitable[Any], wanted: Any) -> bool:
    """Whether the awaitable gives `wanted` (a condition for wait_for)."""
    return (await value) == wanted


def dcgm_body(node: str, gpus: list[tuple[int, int, int, str]], namespace: str = "llm", container: str = "vllm") -> str:
    """A dcgm-exporter 4.x body with its Kubernetes mapping (tests/fixtures/dcgm/ has the real shapes): per GPU
    (index, used MiB, free MiB, the pod using it, in `namespace` and `container`, or "")."""
    out = []
    for family, column, help_text in (
        ("DCGM_FI_DEV_FB_FREE", 2, "Framebuffer memory free (in MiB)."),
        ("DCGM_FI_DEV_FB_USED", 1, "Framebuffer memory used (in MiB)."),
        ("DCGM_FI_DEV_FB_RESERVED", None, "Framebuffer memory reserved (in MiB)."),
    ):
        out += [f"# HELP {family} {help_text}", f"# TYPE {family} gauge"]
        for gpu in gpus:
            pod = f',container="{container}",namespace="{namespace}",pod="{gpu[3]}"' if gpu[3] else ""
            labels = (f'gpu="{gpu[0]}",UUID="GPU-{node}-{gpu[0]}",pci_bus_id="00000000:1{gpu[0]}:00.0",'
                      f'device="nvidia{gpu[0]}",modelName="NVIDIA H100 80GB HBM3",Hostname="{node}"{pod}')  # fmt: skip
            out.append(f"{family}{{{labels}}} {gpu[column] if column else 0}")
    return "\n".join(out) + "\n"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Server:
    """An aiohttp app on a fixed host and port, that can be stopped and started again (an outage)."""

    def __init__(self, app: web.Application, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        self.app, self.host, self.port, self.tls = app, host, port, tls
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        self.runner = web.AppRunner(self.app, handle_signals=False, shutdown_timeout=0.1)
        await self.runner.setup()
        await web.TCPSite(self.runner, self.host, self.port, ssl_context=self.tls).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


class Engine:
    """A stub vLLM at a pod IP: loading (503) until `serving` is set."""

    def __init__(self, host: str, port: int, *, serving: bool = True) -> None:
        self.serving = serving
        self.started = time.time()  # its process start, as its /metrics says
        self.body = re.sub(
            r"^process_start_time_seconds .*$",
            f"process_start_time_seconds {self.started}",
            vllm_body("vllm-0.32.0-cpu-under-load.txt"),
            flags=re.MULTILINE,
        )
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        self.server = Server(app, host, port)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.body) if self.serving else web.Response(status=503)

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.serving else 503)


@asynccontextmanager
async def engine_up(host: str = "127.0.0.2", *, serving: bool = True) -> AsyncIterator[Engine]:
    """A stub vLLM at a free port of `host` (its `server.port`), served until the block ends."""
    engine = Engine(host, free_port(host), serving=serving)
    await engine.server.start()
    try:
        yield engine
    finally:
        await engine.server.stop()


def kubeconfig(path: Path, port: int) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
        f"clusters: [{{name: stand-in, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: oomguard, user: {token: not-checked}}]\n"
        "contexts: [{name: test, context: {cluster: stand-in, user: oomguard}}]\n"
    )
    return path


def config(
    tmp: Path, api_port: int, trend: dict[str, Any] | None = None, top: dict[str, Any] | None = None, **kubernetes: Any
) -> Config:
    """`top`: more top-level sections (the cluster mode's `dcgm:`)."""
    (tmp / "pods").mkdir(exist_ok=True)
    (tmp / "proc").mkdir(exist_ok=True)
    return Config.model_validate(
        {
            "state_dir": str(tmp / "state"),
            "kubernetes": {
                "label_selector": "app.kubernetes.io/name=vllm",
                "port": "http",
                "node_name": NODE,
                "kubeconfig": str(kubeconfig(tmp / "kubeconfig", api_port)),
                "retry_max_seconds": 0.2,
                "proc_dir": str(tmp / "proc"),
                **kubernetes,
            },
            "events": {
                "kernel_log": False,
                "xid": False,
                "poll_interval_seconds": 0.05,
                "quiet_seconds": 0.2,
                "k8s_pods_dir": str(tmp / "pods"),
            },
            "trend": trend or {"enabled": False},
            "scrape": {"timeout_seconds": 1.0},
            **(top or {}),
        },
        context=CHECKS,  # each part's section checked, as load_config does
    )


class Cluster:
    """The stand-in API and a runtime discovering from it."""

    def __init__(
        self,
        tmp: Path,
        nvml: Any = None,
        trend: dict[str, Any] | None = None,
        top: dict[str, Any] | None = None,
        api: StandIn | None = None,
        **kubernetes: Any,
    ) -> None:
        """`api`: a stand-in kept from another runtime's test (an exporter restarted against the same cluster)."""
        self.api = api or StandIn()
        self.server = Server(self.api.app(), "127.0.0.1", free_port())
        self.runtime = Runtime(config(tmp, self.server.port, trend, top, **kubernetes), nvml_lib=nvml)

    async def __aenter__(self) -> Cluster:
        await self.server.start()
        await self.runtime.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runtime.stop()
        await self.server.stop()

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        assert self.runtime.collection is not None
        return samples(render(await self.runtime.collection.snapshot()).decode())

    async def value(self, name: str, **labels: str) -> float | None:
        return (await self.metrics()).get((name, tuple(sorted((k, v) for k, v in labels.items() if v))))

    def targets(self) -> list[str]:
        assert self.runtime.collection is not None
        return sorted(s.name for s in self.runtime.targets.scrapers())


class Dcgm:
    """A dcgm-exporter stand-in at a pod IP."""

    def __init__(self, host: str, port: int, body: str) -> None:
        self.body = body
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self.server = Server(app, host, port)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.body)


def dcgm_pod(
    name: str, ip: str, node: str, *, namespace: str = "gpu-operator", owner: tuple[str, str] | None = None
) -> dict[str, Any]:
    """A pod of the GPU Operator's dcgm-exporter DaemonSet (`owner`: its controller, (kind, name)), or a pose."""
    obj = objects.pod(name, ip, 9400, namespace=namespace, node=node, labels={"app": "nvidia-dcgm-exporter"})
    obj["spec"]["containers"][0]["name"] = "nvidia-dcgm-exporter"
    kind, owner_name = owner or ("DaemonSet", "nvidia-dcgm-exporter")
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": kind, "name": owner_name, "uid": f"uid-{owner_name}", "controller": True}
    ]
    return obj


@asynccontextmanager
async def two_shards(folder: Path, servers: list[Server], **config: Any) -> AsyncIterator[tuple[Cluster, Cluster]]:
    """The servers started, then a cluster mode sharded in two (shards 2, shard 0 and 1): two runtimes against one
    stand-in API, each on its own state folder under `folder`; the servers stopped on leaving."""
    for server in servers:
        await server.start()
    (folder / "0").mkdir()
    (folder / "1").mkdir()
    try:
        async with (
            Cluster(folder / "0", shards=2, shard=0, **config) as shard0,
            Cluster(folder / "1", api=shard0.api, shards=2, shard=1, **config) as shard1,
        ):
            yield shard0, shard1
    finally:
        for server in servers:
            await server.stop()
