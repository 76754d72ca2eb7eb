"""More log streams than descriptors: `oomguard serve` in the cluster mode, as a process under RLIMIT_NOFILE 256,
against the stand-in API with 300 engine pods, each an engine answering at its own pod IP and a followed log.
Without the descriptor budget, `accept()` fails with EMFILE, /proc/meminfo cannot be read, /metrics times out.
With it /metrics answers, every target is up, the streams over the budget are refused and counted, and an OOM logged
by a container without a stream is still counted (its log read by turns)."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
from aiohttp import web
from support import vllm_body

from oomguard.common.descriptors import budget
from oomguard.simulate import kubernetes_objects as objects
from oomguard.simulate.kubernetes_api import StandIn
from tests.sources.kubernetes.k8s_harness import free_port, kubeconfig, wait_for

PODS, NOFILE = 300, 256
TRACEBACK = "Traceback (most recent call last):"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB"


def pod_ip(i: int) -> str:
    return f"127.3.{i // 250}.{i % 250 + 1}"


@contextlib.contextmanager
def descriptors_for_the_cluster() -> Iterator[None]:
    """This process holds 300 listeners and the exporter's connections to them and to the API: more than a soft
    limit of 1,024 may leave, so it is raised to the hard limit (as far as 8,192) while the test runs."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = soft if hard == resource.RLIM_INFINITY and soft >= 8192 else min(8192, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@contextlib.asynccontextmanager
async def cluster(api: StandIn) -> AsyncIterator[int]:
    """300 engine pods answering at their IPs, with a line each in their logs; the stand-in API's port."""
    body = vllm_body("vllm-0.32.0-cpu-under-load.txt")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=body)

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    engines = web.Application()
    engines.router.add_get("/metrics", metrics)
    engines.router.add_get("/health", health)
    runners = [web.AppRunner(app, access_log=None, shutdown_timeout=0.1) for app in (engines, api.app())]
    for runner in runners:
        await runner.setup()
    try:
        port = free_port(pod_ip(0))
        for i in range(PODS):
            await web.TCPSite(runners[0], pod_ip(i), port).start()
            name = f"vllm-{i:03d}"
            await api.put("pods", objects.pod(name, pod_ip(i), port, node=f"gpu-{i % 50:03d}"))
            await api.log("llm", name, "vllm", f"INFO {name} started", container_id="a" * 64)
        site = web.TCPSite(runners[1], "127.0.0.1", 0)
        await site.start()
        yield runners[1].addresses[0][1]
    finally:
        for runner in runners:
            await runner.cleanup()


def serve(tmp: Path, api_port: int, web_port: int, log: Path) -> subprocess.Popen[bytes]:
    config = tmp / "config.yaml"
    config.write_text(
        f"state_dir: {tmp / 'state'}\n"
        "events: {kernel_log: false, xid: false}\n"
        "nvml: {enabled: false}\n"
        "kubernetes: {scope: cluster, port: http, label_selector: app.kubernetes.io/name=vllm, "
        f"kubeconfig: {kubeconfig(tmp / 'kubeconfig', api_port)}}}\n"
    )
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "oomguard", "serve", "--config", str(config),
             "--web.listen-address", f"127.0.0.1:{web_port}"],
            stdout=out, stderr=subprocess.STDOUT,
            # A hard limit of 256 too (`ulimit -n 256`): serve raises the soft limit to the hard one.
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE)),
        )  # fmt: skip


class Answer:
    """A /metrics answer of 300 targets (3 MB), read by line prefix: prometheus_client's parser takes a second of
    this process's CPU over it, which the exporter on the same two cores would wait for."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()

    def values(self, name: str, *having: str) -> list[float]:
        """The values of the series of `name` whose labels hold each of `having` (`key="value"`)."""
        out = []
        for line in self.lines:
            if line.startswith(name) and line[len(name)] in "{ ":
                series, _, value = line.rpartition(" ")
                if all(h in series for h in having):
                    out.append(float(value))
        return out

    def value(self, name: str) -> float | None:
        found = self.values(name)
        return found[0] if len(found) == 1 else None


async def scrape(port: int) -> Answer:
    """One /metrics on a new connection (as a scraper that reconnects: accept() must succeed), within 10 s."""
    connector = aiohttp.TCPConnector(force_close=True)
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        assert response.status == 200
        return Answer(await response.text())


async def test_300_log_streams_under_256_descriptors_leave_metrics_answering(tmp_path: Path) -> None:
    api = StandIn()
    shares = budget(NOFILE)
    log = tmp_path / "oomguard.log"
    with descriptors_for_the_cluster():
        async with cluster(api) as api_port:
            web_port = free_port()
            proc = serve(tmp_path, api_port, web_port, log)
            try:

                async def settled() -> Answer | None:
                    assert proc.poll() is None, log.read_text()
                    await asyncio.sleep(0.2)
                    with contextlib.suppress(aiohttp.ClientConnectionError):
                        found = await scrape(web_port)
                        up = found.values("oomguard_target_up").count(1.0)
                        waiting = found.value("oomguard_log_streams_waiting")
                        return found if up == PODS and waiting == PODS - shares.log_streams else None
                    return None

                found = await wait_for(settled, "300 targets up, the streams over the budget waiting", 60)
                assert found.value("oomguard_log_streams_limit") == shares.log_streams == 84
                assert found.value("oomguard_log_streams_open") == shares.log_streams
                assert (found.value("oomguard_log_streams_refused_total") or 0) >= PODS - shares.log_streams
                # A container without a stream logs an OOM: read by its turns, counted.
                followed = {r.split("/pods/")[1].split("/")[0] for r in api.requests if "follow=true" in r}
                waiting = sorted({f"vllm-{i:03d}" for i in range(PODS)} - followed)
                assert len(waiting) == PODS - shares.log_streams
                for line in (TRACEBACK, OOM):
                    await api.log("llm", waiting[0], "vllm", line)

                async def counted() -> bool:
                    await asyncio.sleep(0.2)
                    ooms = (await scrape(web_port)).values(
                        "oomguard_target_events_total", 'kind="cuda_oom"', f'pod="{waiting[0]}"'
                    )
                    return ooms == [1.0]

                # Its turn comes within pod_logs.TURN_SECONDS (10 s), and the runner's poll after it.
                await wait_for(counted, "the OOM of a container without a stream", 30)
                for _ in range(3):  # /metrics keeps answering on new connections
                    assert (await scrape(web_port)).value("oomguard_log_streams_open") == shares.log_streams
                    await asyncio.sleep(0.2)
            finally:
                proc.terminate()
                await asyncio.to_thread(proc.wait, 30)
    said = log.read_text()
    assert "Too many open files" not in said and "EMFILE" not in said, said[-3000:]
    assert said.count("84 log streams open, the most allowed (the logs' share of 256 file descriptors") == 1, said
    assert "every followed log has its stream again" not in said  # the stop is no recovery
