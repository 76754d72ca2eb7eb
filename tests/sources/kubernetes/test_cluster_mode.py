"""The cluster mode against the stand-in API: every node's engine pods, their GPUs from each node's dcgm-exporter
(found as pods), and their logs through `pods/log`, resumed without a line lost or counted twice."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from oomguard.diagnose.core import diagnose_data
from oomguard.diagnose.query import fetch_exporter
from oomguard.exporter.exposition import render
from oomguard.simulate import kubernetes_objects as objects
from oomguard.simulate.kubernetes_api import StandIn
from tests.sources.kubernetes.k8s_harness import (
    OOM,
    TRACEBACK,
    Cluster,
    Dcgm,
    Engine,
    Server,
    dcgm_body,
    dcgm_pod,
    engine_up,
    free_port,
    two_shards,
    wait_for,
)

MIB = 1048576
A, B = "llm/vllm-a", "llm/vllm-b"
POD_A = {"namespace": "llm", "pod": "vllm-a", "container": "vllm", "target": A}
POD_B = {"namespace": "llm", "pod": "vllm-b", "container": "vllm", "target": B}
UID = "11111111-1111-4111-8111-111111111111"
STARTED = "INFO 12-05 12:00:00 [api_server.py:1885] vLLM API server version 0.11.0"


def cluster_config(dcgm_port: int) -> dict[str, Any]:
    dcgm = {"discover": True, "port": dcgm_port, "timeout_seconds": 1.0, "namespaces": ["gpu-operator"]}
    return {"scope": "cluster", "top": {"dcgm": dcgm}}


async def test_two_nodes_gpus_from_their_dcgm_exporters_joined_to_their_pods(tmp_path: Path) -> None:
    port, dcgm_port = free_port("127.0.0.2"), free_port("127.0.0.4")
    # Node gpu-a: vllm-a on GPU 0 at its reservation (0.9 of 80 GiB, 74 GiB used); node gpu-b: vllm-b on its GPU 0,
    # 40 GiB used. The same GPU index on two nodes: two GPUs.
    engines = [Engine("127.0.0.2", port), Engine("127.0.0.3", port)]
    exporters = [
        Dcgm("127.0.0.4", dcgm_port, dcgm_body("gpu-a", [(0, 74 * 1024, 6 * 1024, "vllm-a"), (1, 0, 80 * 1024, "")])),
        Dcgm("127.0.0.5", dcgm_port, dcgm_body("gpu-b", [(0, 40 * 1024, 40 * 1024, "vllm-b")])),
    ]
    for server in [*(e.server for e in engines), *(d.server for d in exporters)]:
        await server.start()
    try:
        async with Cluster(tmp_path, **cluster_config(dcgm_port)) as k8s:
            await k8s.api.put("pods", objects.pod("vllm-a", "127.0.0.2", port, node="gpu-a"))
            await k8s.api.put("pods", objects.pod("vllm-b", "127.0.0.3", port, node="gpu-b"))
            await k8s.api.put("pods", dcgm_pod("dcgm-a", "127.0.0.4", "gpu-a"))
            await k8s.api.put("pods", dcgm_pod("dcgm-b", "127.0.0.5", "gpu-b"))
            await wait_for(lambda: k8s.targets() == [A, B], "both nodes' pods as targets")
            await wait_for(lambda: k8s.value("oomguard_gpu_memory_used_bytes", node="gpu-b", gpu="0"), "gpu-b's GPU 0")
            metrics = await k8s.metrics()

            def value(name: str, **labels: str) -> float | None:
                return metrics.get((name, tuple(sorted((k, v) for k, v in labels.items() if v))))

            assert value("oomguard_gpu_memory_used_bytes", node="gpu-a", gpu="0") == 74 * 1024 * MIB
            assert value("oomguard_gpu_memory_used_bytes", node="gpu-b", gpu="0") == 40 * 1024 * MIB
            assert value("oomguard_gpu_memory_total_bytes", node="gpu-a", gpu="1") == 80 * 1024 * MIB
            assert value("oomguard_nvml_up") == 1.0
            assert value("oomguard_source_success", source="dcgm") == 1.0
            # Each pod's GPUs are those its node's dcgm-exporter names it on.
            assert value("oomguard_target_gpu_info", node="gpu-a", gpu="0", **POD_A) == 1.0
            assert value("oomguard_target_gpu_info", node="gpu-b", gpu="0", **POD_B) == 1.0
            assert value("oomguard_target_gpu_info", node="gpu-b", gpu="0", **POD_A) is None
            assert value("oomguard_target_gpu_memory_used_bytes", **POD_B) == 40 * 1024 * MIB
            # The reservation join, from the engine's own gpu_memory_utilization (its /metrics), per node's GPU.
            assert value("oomguard_gpu_memory_engine_reserved_bytes", node="gpu-a", gpu="0") is not None
            assert value("oomguard_gpu_memory_headroom_used_ratio", node="gpu-b", gpu="0") is not None
            # Per-process memory is not published by dcgm-exporter: absent, and said so, never a guessed 0.
            assert value("oomguard_gpu_process_query_success", node="gpu-a", gpu="0") == 0.0
            assert not [k for k in metrics if k[0] == "oomguard_gpu_process_memory_used_bytes"]
            assert value("oomguard_target_process_gpu_memory_bytes", **POD_A) is None
            assert value("oomguard_gpu_memory_engine_used_bytes", node="gpu-a", gpu="0") is None
            # The cluster mode reads no host's /proc: no such source.
            assert value("oomguard_source_success", source="pod_processes") is None
            await _diagnose_each_pod_on_its_own_nodes_gpu(k8s)

            # gpu-b's dcgm-exporter stops answering: its GPUs go, gpu-a's stay, and the source says it fails.
            await exporters[1].server.stop()
            await wait_for(
                lambda: _equals(lambda: k8s.value("oomguard_source_success", source="dcgm"), 0.0),
                "the dcgm source failing",
            )
            assert await k8s.value("oomguard_gpu_memory_used_bytes", node="gpu-b", gpu="0") is None
            assert await k8s.value("oomguard_gpu_memory_used_bytes", node="gpu-a", gpu="0") == 74 * 1024 * MIB
            # Its pod goes (the DaemonSet's pod deleted): the endpoint is forgotten, the source is whole again.
            await k8s.api.delete("pods", "gpu-operator", "dcgm-b")
            await wait_for(
                lambda: _equals(lambda: k8s.value("oomguard_source_success", source="dcgm"), 1.0), "dcgm-b forgotten"
            )
    finally:
        for server in [*(e.server for e in engines), *(d.server for d in exporters)]:
            await server.stop()


async def test_logs_through_the_api_every_oom_once_across_drops_restarts_and_an_exporter_restart(
    tmp_path: Path,
) -> None:
    # The node's clock is an hour behind the exporter's: nothing here may depend on them agreeing (a pod found at
    # start had none of its lines read).
    api = StandIn(node_offset=-3600.0)
    first_id, second_id, third_id = "a" * 64, "b" * 64, "c" * 64
    config = {"scope": "cluster", "top": {"nvml": {"enabled": False}}}
    async with engine_up() as engine:
        port = engine.server.port
        async with Cluster(tmp_path, api=api, **config) as k8s:
            await api.log("llm", "vllm-a", "vllm", STARTED, container_id=first_id)
            await k8s.api.put(
                "pods",
                objects.pod(
                    "vllm-a", "127.0.0.2", port, node="gpu-a", uid=UID, container_id=f"containerd://{first_id}"
                ),
            )
            await wait_for(lambda: k8s.targets() == [A], "the pod's target")
            # A pod found at start: its log from now on, as the node counts it (what it logged before may be counted
            # already).
            await wait_for(lambda: [r for r in api.log_requests if r.get("follow")], "the log followed")
            first = next(r for r in api.log_requests if r.get("follow"))
            assert first["follow"] == "true" and first["timestamps"] == "true" and "sinceSeconds" in first

            async def ooms() -> float | None:
                return await k8s.value("oomguard_target_events_total", kind="cuda_oom", **POD_A)

            # The stream drops, and the container dies of OOM before it is back: its traceback is only in the
            # previous container's log, read (from the position, in whole seconds) before the new container's,
            # whose lines may come before the pod's status names it.
            await api.drop_log_streams()
            await api.log("llm", "vllm-a", "vllm", TRACEBACK)
            await api.log("llm", "vllm-a", "vllm", OOM)
            await api.end_container("llm", "vllm-a", "vllm")
            await api.log("llm", "vllm-a", "vllm", STARTED, container_id=second_id)
            await wait_for(lambda: _equals(ooms, 1.0), "the OOM, from the previous container")
            previous = [r for r in api.log_requests if r.get("previous") == "true"]
            assert previous and previous[-1]["sinceTime"].endswith("Z") and "." not in previous[-1]["sinceTime"]
            await k8s.api.put(
                "pods",
                objects.pod(
                    "vllm-a", "127.0.0.2", port, node="gpu-a", uid=UID, container_id=f"containerd://{second_id}",
                    restart_count=1,
                ),
            )  # fmt: skip

            # The stream drops while the new container runs; what it logs meanwhile comes with the next stream.
            await api.drop_log_streams()
            await api.log("llm", "vllm-a", "vllm", TRACEBACK)
            await api.log("llm", "vllm-a", "vllm", OOM)
            await wait_for(lambda: _equals(ooms, 2.0), "the OOM logged while the stream was down")
            # Dropped again: the next stream repeats the last second, and nothing is counted twice.
            streams = len(api.log_requests)
            await api.drop_log_streams()
            await wait_for(lambda: len(api.log_requests) >= streams + 2, "the previous read and the stream again")
            await asyncio.sleep(0.5)  # the runner's polls
            assert await ooms() == 2.0
        # The exporter restarts on the same state: it goes on from its saved position, counting nothing again.
        async with Cluster(tmp_path, api=api, **config) as k8s:
            await wait_for(lambda: k8s.targets() == [A], "the pod's target again")
            await wait_for(lambda: _equals(lambda: ooms_of(k8s), 2.0), "the counts restored")
            await api.end_container("llm", "vllm-a", "vllm")
            await api.log("llm", "vllm-a", "vllm", STARTED, container_id=third_id)
            await api.log("llm", "vllm-a", "vllm", TRACEBACK)
            await api.log("llm", "vllm-a", "vllm", OOM)
            await wait_for(lambda: _equals(lambda: ooms_of(k8s), 3.0), "only the new OOM counted")
            await asyncio.sleep(0.5)
            assert await ooms_of(k8s) == 3.0
            resumed = next(r for r in api.log_requests[streams + 2 :] if r.get("follow") == "true")
            assert "sinceTime" in resumed  # from the saved position, not the start nor now


async def _diagnose_each_pod_on_its_own_nodes_gpu(k8s: Cluster) -> None:
    """`oomguard diagnose --exporter` on the cluster-mode exporter: one diagnosis a pod, each judged on its own
    node's GPU 0, never the other node's."""
    assert k8s.runtime.collection is not None
    text = render(await k8s.runtime.collection.snapshot())

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = Server(app, "127.0.0.1", free_port())
    await server.start()
    try:
        data = await asyncio.to_thread(fetch_exporter, f"http://127.0.0.1:{server.port}")
    finally:
        await server.stop()
    found = {d.target: d for d in diagnose_data(data)}
    assert sorted(found) == [A, B]
    assert found[A].gpus == ["0@gpu-a"] and found[B].gpus == ["0@gpu-b"]
    facts_a, facts_b = found[A].facts, found[B].facts
    assert facts_a is not None and facts_b is not None
    assert facts_a.per_gpu["0@gpu-a"][-1][1] == 0.925  # 74 of 80 GiB
    assert facts_b.per_gpu["0@gpu-b"][-1][1] == 0.5


async def test_a_replaced_pods_log_is_read_whole_and_its_predecessors_ooms_not_again(tmp_path: Path) -> None:
    async with engine_up() as engine, Cluster(tmp_path, scope="cluster", top={"nvml": {"enabled": False}}) as k8s:
        port = engine.server.port
        api = k8s.api
        await k8s.api.put("pods", objects.pod("vllm-a", "127.0.0.2", port, node="gpu-a", uid=UID))
        await wait_for(lambda: [r for r in api.log_requests if r.get("follow")], "the log followed")
        await api.log("llm", "vllm-a", "vllm", STARTED, container_id="a" * 64)
        await api.log("llm", "vllm-a", "vllm", TRACEBACK)
        await api.log("llm", "vllm-a", "vllm", OOM)
        await wait_for(lambda: _equals(lambda: ooms_of(k8s), 1.0), "the first pod's OOM")
        # Replaced under its name (a StatefulSet's): deleted, then a new pod with a new UID and a log of its own,
        # which came while the exporter watched: read from its start.
        await k8s.api.delete("pods", "llm", "vllm-a")
        await wait_for(lambda: k8s.targets() == [], "the target gone with its pod")
        api.new_pod("llm", "vllm-a")
        await api.log("llm", "vllm-a", "vllm", STARTED, container_id="b" * 64)
        await api.log("llm", "vllm-a", "vllm", TRACEBACK)
        await api.log("llm", "vllm-a", "vllm", OOM)
        uid = "22222222-2222-4222-8222-222222222222"
        await k8s.api.put("pods", objects.pod("vllm-a", "127.0.0.2", port, node="gpu-a", uid=uid))
        await wait_for(lambda: k8s.targets() == [A], "the new pod's target")
        # The target's counts go on under its name: the new pod's OOM, read from its log's start, is the
        # second; the old pod's is not read again.
        await wait_for(lambda: _equals(lambda: ooms_of(k8s), 2.0), "the new pod's OOM")
        await asyncio.sleep(0.5)
        assert await ooms_of(k8s) == 2.0
        new = [r for r in api.log_requests if r.get("follow")][-1]
        assert "sinceTime" not in new  # from its start


def ooms_of(k8s: Cluster) -> Any:
    return k8s.value("oomguard_target_events_total", kind="cuda_oom", **POD_A)


async def _equals(value: Any, wanted: float) -> bool:
    """Whether the awaitable `value()` gives `wanted` (for wait_for)."""
    return (await value()) == wanted


def test_pods_dcgm_exporter_does_not_map_are_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """Their memory figures would be absent without a word: a node whose dcgm-exporter maps no pod (its Kubernetes
    mapping off) is said once, a pod its node's dcgm-exporter does not name is said once, and said again only
    after it was mapped in between."""
    from oomguard.exporter.model import GpuReading, GpuReadings
    from oomguard.exporter.sources.kubernetes.discovery import UnmappedPods
    from oomguard.exporter.sources.kubernetes.pods import pod_target

    def gpu(node: str, *pods: str) -> GpuReading:
        return GpuReading(0, True, total_bytes=1.0, used_bytes=0.5, node=node, pods=tuple(("llm", p) for p in pods))

    pods = [pod_target(objects.pod(name, "10.0.0.9", 8000, node=node), "http") for name, node in
            (("vllm-a", "gpu-a"), ("vllm-b", "gpu-a"), ("vllm-c", "gpu-c"), ("vllm-d", "gpu-d"))]  # fmt: skip
    reading = GpuReadings(True, gpus=(gpu("gpu-a", "vllm-a"), gpu("gpu-c")))  # gpu-d: no dcgm-exporter read
    unmapped = UnmappedPods()
    for _ in range(3):
        unmapped.say(reading, [p for p in pods if p is not None])
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert "names no GPU of pod llm/vllm-b" in said[0]
    assert "dcgm-exporter on node gpu-c names no pod on its GPUs: its Kubernetes mapping is off" in said[1]
    # vllm-b mapped, then not again: said again.
    unmapped.say(GpuReadings(True, gpus=(gpu("gpu-a", "vllm-a", "vllm-b"),)), [p for p in pods if p is not None])
    unmapped.say(reading, [p for p in pods if p is not None])
    assert len(caplog.records) == 3


@pytest.mark.parametrize("fake_first", [True, False], ids=["the pose listed first", "the pose listed last"])
async def test_a_pod_posing_as_dcgm_exporter_changes_no_figure_and_is_told(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, fake_first: bool
) -> None:
    """A pod labelled app=nvidia-dcgm-exporter on gpu-a, in the GPU Operator's namespace but under a ReplicaSet (who
    may create pods there, not the DaemonSet), serves GPU 0 at 2 % used where the real one is at 92 %: refused
    whatever the listing order, the real figure stays, the refusal is counted and said once. Then a second pod of
    the GPU Operator's DaemonSet claims gpu-a: a conflict, the node read from neither, and said by a gauge while it
    lasts (its memory alerts cannot fire). A tenant's own namespace is not even watched:
    tests/hostile/test_hostile_cluster.py."""
    port, dcgm_port = free_port("127.0.0.2"), free_port("127.0.0.4")
    real = Dcgm("127.0.0.4", dcgm_port, dcgm_body("gpu-a", [(0, 74 * 1024, 6 * 1024, "vllm-a")]))
    fake = Dcgm("127.0.0.6", dcgm_port, dcgm_body("gpu-a", [(0, 2 * 1024, 78 * 1024, "vllm-a")]))
    engine = Engine("127.0.0.2", port)
    for server in (engine.server, real.server, fake.server):
        await server.start()
    pose = dcgm_pod("fake-dcgm", "127.0.0.6", "gpu-a", owner=("ReplicaSet", "fake-dcgm"))
    pods = [pose, dcgm_pod("dcgm-a", "127.0.0.4", "gpu-a")]
    try:
        async with Cluster(tmp_path, **cluster_config(dcgm_port)) as k8s:
            await k8s.api.put("pods", objects.pod("vllm-a", "127.0.0.2", port, node="gpu-a"))
            for pod in pods if fake_first else pods[::-1]:
                await k8s.api.put("pods", pod)
            refused = {"node": "gpu-a", "namespace": "gpu-operator", "pod": "fake-dcgm", "reason": "owner"}
            await wait_for(lambda: k8s.value("oomguard_dcgm_pods_refused_total", **refused), "the pose refused")
            await wait_for(lambda: k8s.value("oomguard_gpu_memory_used_bytes", node="gpu-a", gpu="0"), "gpu-a read")
            for _ in range(3):  # several collections: the pose is never taken, in between either
                assert await k8s.value("oomguard_gpu_memory_used_bytes", node="gpu-a", gpu="0") == 74 * 1024 * MIB
            assert await k8s.value("oomguard_dcgm_pods_refused_total", **refused) == 1.0
            assert await k8s.value("oomguard_dcgm_node_pods", node="gpu-a") == 1.0
            said = [r for r in caplog.records if "fake-dcgm refused as the dcgm-exporter of node gpu-a" in r.message]
            assert len(said) == 1 and "not by a DaemonSet named nvidia-dcgm-exporter" in said[0].message

            # A second pod of the DaemonSet on the same node: which one is real cannot be told. Neither is read.
            await k8s.api.put("pods", dcgm_pod("dcgm-a2", "127.0.0.6", "gpu-a"))
            conflict = {"node": "gpu-a", "namespace": "gpu-operator", "reason": "conflict"}
            await wait_for(lambda: k8s.value("oomguard_dcgm_pods_refused_total", pod="dcgm-a2", **conflict), "told")
            assert await k8s.value("oomguard_dcgm_pods_refused_total", pod="dcgm-a", **conflict) == 1.0
            assert await k8s.value("oomguard_gpu_memory_used_bytes", node="gpu-a", gpu="0") is None
            # What a page reads: the node has no GPU figure because two pods claim it, for as long as they do.
            for _ in range(2):
                assert await k8s.value("oomguard_dcgm_node_pods", node="gpu-a") == 2.0
            # One goes: the node is read again, from the one left.
            await k8s.api.delete("pods", "gpu-operator", "dcgm-a2")
            await wait_for(lambda: k8s.value("oomguard_gpu_memory_used_bytes", node="gpu-a", gpu="0"), "gpu-a again")
            assert await k8s.value("oomguard_gpu_memory_used_bytes", node="gpu-a", gpu="0") == 74 * 1024 * MIB
            assert await k8s.value("oomguard_dcgm_node_pods", node="gpu-a") == 1.0
    finally:
        for server in (engine.server, real.server, fake.server):
            await server.stop()


async def test_two_shards_read_disjoint_nodes_and_together_every_one(tmp_path: Path) -> None:
    """Two exporters of a sharded cluster mode (shards 2, shard 0 and 1) against one API: each node's engine pod,
    its dcgm-exporter and its kubelet's Events are read by the one shard its name hashes to, never by both; together
    they read every node. The nodes are chosen so that each shard has two (shards.py's hash decides which)."""
    from oomguard.exporter.sources.kubernetes.shards import shard_of

    names = [f"gpu-{i:03d}" for i in range(40)]
    nodes = [n for n in names if shard_of(n, 2) == 0][:2] + [n for n in names if shard_of(n, 2) == 1][:2]
    port, dcgm_port = free_port("127.0.0.2"), free_port("127.0.0.6")
    engines = [Engine(f"127.0.0.{2 + i}", port) for i in range(4)]
    used = {node: (10 + 10 * i) * 1024 for i, node in enumerate(nodes)}  # each node's own figure, in MiB
    exporters = [
        Dcgm(f"127.0.0.{6 + i}", dcgm_port, dcgm_body(node, [(0, used[node], 80 * 1024 - used[node], f"vllm-{i}")]))
        for i, node in enumerate(nodes)
    ]
    servers = [*(e.server for e in engines), *(d.server for d in exporters)]
    async with two_shards(tmp_path, servers, **cluster_config(dcgm_port)) as (shard0, shard1):
        pods = [objects.pod(f"vllm-{i}", f"127.0.0.{2 + i}", port, node=node) for i, node in enumerate(nodes)]
        for i, (node, pod) in enumerate(zip(nodes, pods, strict=True)):
            await shard0.api.put("pods", pod)
            await shard0.api.put("pods", dcgm_pod(f"dcgm-{i}", f"127.0.0.{6 + i}", node))
        mine = {0: ["llm/vllm-0", "llm/vllm-1"], 1: ["llm/vllm-2", "llm/vllm-3"]}
        for index, k8s in enumerate((shard0, shard1)):
            await wait_for(lambda k8s=k8s, index=index: k8s.targets() == mine[index], f"shard {index}'s pods")
        for node, pod in zip(nodes, pods, strict=True):  # an Event counts for a pod known (discovered) first
            kill = objects.event(pod, "Killing", "Container vllm failed liveness probe, will be restarted")
            kill["source"]["host"] = kill["reportingInstance"] = node
            await shard0.api.put("events", kill)
        for index, k8s in enumerate((shard0, shard1)):
            for i, node in enumerate(nodes):
                owned = shard_of(node, 2) == index
                gpu = {"node": node, "gpu": "0"}
                if owned:
                    await wait_for(lambda k8s=k8s, gpu=gpu: k8s.value("oomguard_gpu_memory_used_bytes", **gpu),
                                   f"{node}'s GPU in shard {index}")  # fmt: skip
                    assert await k8s.value("oomguard_gpu_memory_used_bytes", **gpu) == used[node] * MIB
                    pod = {"namespace": "llm", "pod": f"vllm-{i}", "container": "vllm", "target": f"llm/vllm-{i}"}
                    kills = {"kind": "probe_kill", **pod}
                    await wait_for(lambda k8s=k8s, kills=kills: k8s.value("oomguard_target_events_total", **kills),
                                   f"{node}'s probe kill in shard {index}")  # fmt: skip
                else:
                    assert await k8s.value("oomguard_gpu_memory_used_bytes", **gpu) is None
            # No refusal: another shard's dcgm-exporter is not a pose, only not this shard's to read.
            assert not [k for k in await k8s.metrics() if k[0] == "oomguard_dcgm_pods_refused_total"]


async def test_a_node_clock_stepping_back_an_hour_loses_no_oom(tmp_path: Path) -> None:
    """The node's clock steps back an hour: the container runtime stamps the lines written after the step an hour
    earlier than those before it, and the kubelet skips every line stamped before a request's `sinceTime`, in an
    open stream too (pkg/kubelet/kuberuntime/logs/logs.go, as the stand-in does). Three lives, each ending in an OOM:
    the first before the step; the second after it, in the stream open since before it; the third in a new
    container, written while no stream was open. Each counted once."""
    async with engine_up() as engine, Cluster(tmp_path, scope="cluster", top={"nvml": {"enabled": False}}) as k8s:
        api = k8s.api
        await api.put("pods", objects.pod("vllm-a", "127.0.0.2", engine.server.port, node="gpu-a", uid=UID))
        await wait_for(lambda: [r for r in api.log_requests if r.get("follow")], "the log followed")
        await api.log("llm", "vllm-a", "vllm", STARTED, container_id="a" * 64)
        await api.log("llm", "vllm-a", "vllm", TRACEBACK)
        await api.log("llm", "vllm-a", "vllm", OOM)
        await wait_for(lambda: _equals(lambda: ooms_of(k8s), 1.0), "the OOM before the step")
        # The engine starts again in a new container; the stream drops and is asked again, from the position.
        await api.end_container("llm", "vllm-a", "vllm")
        await api.log("llm", "vllm-a", "vllm", STARTED, container_id="b" * 64)
        streams = len(api.log_requests)
        await api.drop_log_streams()
        await wait_for(lambda: [r for r in api.log_requests[streams:] if r.get("follow")], "the stream asked again")
        await asyncio.sleep(0.3)  # it is open, and has sent what there was
        api.node_offset -= 3600.0  # the node's clock steps back an hour
        await api.log("llm", "vllm-a", "vllm", TRACEBACK)
        await api.log("llm", "vllm-a", "vllm", OOM)
        await wait_for(lambda: _equals(lambda: ooms_of(k8s), 2.0), "the OOM after the step, in the open stream")
        # The stream drops; the engine dies and starts again meanwhile, and its new container logs an OOM.
        await api.drop_log_streams()
        await api.end_container("llm", "vllm-a", "vllm")
        await api.log("llm", "vllm-a", "vllm", STARTED, container_id="c" * 64)
        await api.log("llm", "vllm-a", "vllm", TRACEBACK)
        await api.log("llm", "vllm-a", "vllm", OOM)
        await wait_for(lambda: _equals(lambda: ooms_of(k8s), 3.0), "the OOM written while no stream was open")
        await asyncio.sleep(0.5)  # the runner's polls: nothing counted twice
        assert await ooms_of(k8s) == 3.0
        assert api.log_requests[-1]["sinceTime"] < api.log_requests[streams]["sinceTime"]  # back with the clock
