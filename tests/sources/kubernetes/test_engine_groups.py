"""Engines spanning nodes (sources/kubernetes/groups.py): a LeaderWorkerSet's and a KubeRay cluster's pods, as their
controllers label them (tests/fixtures/kubernetes/), joined to their leader's target in the cluster mode, in a
sharded cluster mode and in the node mode: the workers' GPUs judged against the engine's reservation, their logs and
restarts counted for the leader, the engine's own figures exported once."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from oomguard.exporter.join import GpuClaim, target_gpus
from oomguard.exporter.model import GpuReading
from oomguard.exporter.sources.kubernetes.groups import group_of
from oomguard.exporter.sources.kubernetes.pods import pod_target
from oomguard.simulate.fake_nvml import GIB, FakeGpu, FakeNvml, FakeProcess
from tests.sources.kubernetes.k8s_harness import (
    OOM,
    TRACEBACK,
    Cluster,
    Dcgm,
    Engine,
    dcgm_body,
    dcgm_pod,
    engine_up,
    equals,
    free_port,
    two_shards,
    wait_for,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "kubernetes"
MIB = 1048576
TOTAL_MIB = 80 * 1024
LEADER = {"namespace": "inference", "pod": "vllm-0", "container": "vllm-leader", "target": "inference/vllm-0"}


def pod_set(name: str) -> list[dict[str, Any]]:
    return json.loads((FIXTURES / name).read_text())["items"]


def lws_pods(ip: str, port: int, *, leader_node: str = "gpu-a", worker_node: str = "gpu-b",
             worker_restarts: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """The LeaderWorkerSet's two pods, the leader at `ip`:`port` (an Engine stand-in), on the nodes given."""
    leader, worker = copy.deepcopy(pod_set("lws-vllm-two-nodes.json"))
    leader["status"]["podIP"], leader["status"]["podIPs"] = ip, [{"ip": ip}]
    leader["spec"]["containers"][0]["ports"][0]["containerPort"] = port
    leader["spec"]["nodeName"], worker["spec"]["nodeName"] = leader_node, worker_node
    worker["status"]["containerStatuses"][0]["restartCount"] = worker_restarts
    return [leader, worker]


def gpu0_body(node: str, used_mib: int, pod: str, container: str) -> str:
    """dcgm-exporter 4.x's memory families for one GPU 0 that `pod` (namespace inference) holds."""
    return dcgm_body(node, [(0, used_mib, TOTAL_MIB - used_mib, pod)], namespace="inference", container=container)


# ---- the layouts' labels -------------------------------------------------------------------------------------


def test_a_leaderworkersets_pods_are_one_group_led_by_worker_index_0() -> None:
    leader, worker = pod_set("lws-vllm-two-nodes.json")
    lead, work = group_of(leader), group_of(worker)
    assert lead is not None and work is not None
    assert lead.key == work.key == "lws/inference/vllm/0"
    assert lead.leader and not work.leader and work.leader_name == "vllm-0"
    assert work.leader_query() == ("/api/v1/namespaces/inference/pods", {"fieldSelector": "metadata.name=vllm-0"})
    # The worker serves nothing: no address asked, its container the one that holds the GPUs.
    target = pod_target(worker, "http", "vllm")
    assert target is not None and target.worker and target.container == "vllm-worker" and target.node == "gpu-b"
    served = pod_target(leader, "http", "vllm")
    assert served is not None and not served.worker and served.url == "http://10.42.1.17:8080"
    # The reservation it was told, from the leader's shell script, while the engine reports none.
    assert served.settings["gpu_memory_utilization"].value == 0.92


def test_a_kuberay_clusters_head_leads_its_workers() -> None:
    head, worker = pod_set("kuberay-vllm-two-nodes.json")
    lead, work = group_of(head), group_of(worker)
    assert lead is not None and work is not None and lead.key == work.key == "ray/inference/vllm-405b"
    assert lead.leader and not work.leader
    _path, params = work.leader_query()
    assert params == {"labelSelector": "ray.io/cluster=vllm-405b,ray.io/node-type=head"}
    served = pod_target(head, "serve", "vllm")
    assert served is not None and served.url == "http://10.42.1.31:8000"
    target = pod_target(worker, "serve", "vllm")
    assert target is not None and target.worker and target.container == "ray-worker"


def test_a_pod_of_neither_layout_is_an_engine_of_its_own() -> None:
    from oomguard.simulate import kubernetes_objects as objects

    assert group_of(objects.pod("vllm-0", "127.0.0.2", 8000)) is None
    # A leader without its group index label (an older controller) is read by its name: <lws>-<group index>.
    leader = pod_set("lws-vllm-two-nodes.json")[0]
    del leader["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"]
    assert (group := group_of(leader)) is not None and group.key == "lws/inference/vllm/0"


def test_a_claim_takes_its_workers_gpus_on_their_nodes_and_nothing_else() -> None:
    def gpu(node: str, index: int, pod: tuple[str, str] | None) -> GpuReading:
        return GpuReading(index=index, uuid=f"GPU-{node}-{index}", name="H100", up=True, used_bytes=1.0,
                          total_bytes=2.0, node=node, pods=(pod,) if pod else ())  # fmt: skip

    leader, worker = ("inference", "vllm-0"), ("inference", "vllm-0-1")
    gpus = {g.key: g for g in (gpu("gpu-a", 0, leader), gpu("gpu-b", 0, worker), gpu("gpu-b", 1, None),
                               gpu("gpu-c", 0, worker))}  # fmt: skip
    claim = GpuClaim(node="gpu-a", pod=leader, members=(("gpu-b", worker),))
    # gpu-c's GPU names the worker too, but the worker runs on gpu-b: a body's labels never map another node's pod.
    assert target_gpus(claim, gpus) == [("gpu-a", "0"), ("gpu-b", "0")]


# ---- the cluster mode -----------------------------------------------------------------------------------------


def cluster_config(dcgm_port: int, **more: Any) -> dict[str, Any]:
    top = {"dcgm": {"discover": True, "port": dcgm_port, "timeout_seconds": 1.0, "namespaces": ["gpu-operator"]}}
    return {"scope": "cluster", "namespaces": ["inference"], "top": top, **more}


async def test_cluster_mode_joins_a_leaderworkersets_worker_to_its_leader(tmp_path: Path) -> None:
    """The worker's GPU holds 92 % of its memory (the engine's gpu_memory_utilization 0.92, healthy): judged
    against the reservation it reads ~0 % of the headroom, where used / total alone is past the 90 % ticket. Its
    OOM and its restarts count for the leader's target; the worker is no target of its own."""
    port, dcgm_port = free_port("127.0.0.2"), free_port("127.0.0.4")
    engine = Engine("127.0.0.2", port)  # its /metrics says gpu_memory_utilization 0.92
    worker_used = round(0.92 * TOTAL_MIB)
    exporters = [Dcgm("127.0.0.4", dcgm_port, gpu0_body("gpu-a", 70 * 1024, "vllm-0", "vllm-leader")),
                 Dcgm("127.0.0.5", dcgm_port, gpu0_body("gpu-b", worker_used, "vllm-0-1", "vllm-worker"))]  # fmt: skip
    servers = [engine.server, *(d.server for d in exporters)]
    for server in servers:
        await server.start()
    try:
        async with Cluster(tmp_path, **cluster_config(dcgm_port, label_selector="app.kubernetes.io/name=vllm")) as k8s:
            for obj in lws_pods("127.0.0.2", port, worker_restarts=2):
                await k8s.api.put("pods", obj)
            await k8s.api.put("pods", dcgm_pod("dcgm-a", "127.0.0.4", "gpu-a"))
            await k8s.api.put("pods", dcgm_pod("dcgm-b", "127.0.0.5", "gpu-b"))
            await wait_for(lambda: k8s.targets() == [LEADER["target"]], "the leader as the one target")
            worker_gpu = {"node": "gpu-b", "gpu": "0"}
            await wait_for(lambda: k8s.value("oomguard_target_gpu_info", **worker_gpu, **LEADER), "the worker's GPU")
            metrics = await k8s.metrics()

            def value(name: str, **labels: str) -> float | None:
                return metrics.get((name, tuple(sorted(labels.items()))))

            assert value("oomguard_target_gpu_info", node="gpu-a", gpu="0", **LEADER) == 1.0
            assert value("oomguard_gpu_memory_used_bytes", **worker_gpu) == worker_used * MIB
            assert value("oomguard_gpu_memory_engine_reserved_bytes", **worker_gpu) == pytest.approx(0.92 * 80 * GIB)
            headroom = value("oomguard_gpu_memory_headroom_used_ratio", **worker_gpu)
            assert headroom is not None and headroom < 0.01, "a healthy worker at its reservation pages nothing"
            # The target's worst GPU is the worker's (92 % against the leader's 87.5 %).
            assert value("oomguard_target_gpu_memory_used_bytes", **LEADER) == worker_used * MIB
            assert value("oomguard_target_restarts_total", **LEADER) == 2.0  # the worker's two
            kv = [k for k in metrics if k[0] == "oomguard_engine_kv_cache_usage_ratio"]
            assert kv and all(dict(k[1])["target"] == LEADER["target"] for k in kv), "the engine's figures, once"
            # The worker's own log: its OOM counts for the leader.
            for line in (TRACEBACK, OOM):
                await k8s.api.log("inference", "vllm-0-1", "vllm-worker", line)
            ooms = {"kind": "cuda_oom", **LEADER}
            await wait_for(lambda: equals(k8s.value("oomguard_target_events_total", **ooms), 1.0), "the worker's OOM")
            # The worker goes (its group recreated without it): its GPU is no longer the target's.
            await k8s.api.delete("pods", "inference", "vllm-0-1")
            await wait_for(lambda: _none(k8s.value("oomguard_target_gpu_info", **worker_gpu, **LEADER)), "detached")
            assert k8s.targets() == [LEADER["target"]]
    finally:
        for server in servers:
            await server.stop()


async def test_cluster_mode_joins_a_kuberay_worker_to_its_head(tmp_path: Path) -> None:
    """The KubeRay pod set: the head serves (port `serve`), the worker of group gpu-group holds GPU 0 of gpu-b at the
    engine's reservation. One target, the head's, with the worker's GPU joined under the reservation (no page), the
    worker's restart and its log's OOM counted for it."""
    head_target = {"namespace": "inference", "pod": "vllm-405b-head-x7k2p", "container": "ray-head",
                   "target": "inference/vllm-405b-head-x7k2p"}  # fmt: skip
    worker_name = "vllm-405b-gpu-group-worker-m4q9s"
    port, dcgm_port = free_port("127.0.0.2"), free_port("127.0.0.4")
    engine = Engine("127.0.0.2", port)
    worker_used = round(0.92 * TOTAL_MIB)
    exporters = [Dcgm("127.0.0.4", dcgm_port, gpu0_body("gpu-a", 60 * 1024, head_target["pod"], "ray-head")),
                 Dcgm("127.0.0.5", dcgm_port, gpu0_body("gpu-b", worker_used, worker_name, "ray-worker"))]  # fmt: skip
    head, worker = copy.deepcopy(pod_set("kuberay-vllm-two-nodes.json"))
    head["status"]["podIP"], head["status"]["podIPs"] = "127.0.0.2", [{"ip": "127.0.0.2"}]
    next(p for p in head["spec"]["containers"][0]["ports"] if p["name"] == "serve")["containerPort"] = port
    worker["status"]["containerStatuses"][0]["restartCount"] = 1
    servers = [engine.server, *(d.server for d in exporters)]
    for server in servers:
        await server.start()
    try:
        config = cluster_config(dcgm_port, label_selector="app.kubernetes.io/name=vllm", port="serve")
        async with Cluster(tmp_path, **config) as k8s:
            for obj in (head, worker):
                await k8s.api.put("pods", obj)
            await k8s.api.put("pods", dcgm_pod("dcgm-a", "127.0.0.4", "gpu-a"))
            await k8s.api.put("pods", dcgm_pod("dcgm-b", "127.0.0.5", "gpu-b"))
            worker_gpu = {"node": "gpu-b", "gpu": "0"}
            await wait_for(lambda: k8s.value("oomguard_gpu_memory_engine_reserved_bytes", **worker_gpu), "the join")
            metrics = await k8s.metrics()

            def value(name: str, **labels: str) -> float | None:
                return metrics.get((name, tuple(sorted(labels.items()))))

            assert k8s.targets() == [head_target["target"]]
            assert value("oomguard_target_gpu_info", **worker_gpu, **head_target) == 1.0
            assert value("oomguard_target_gpu_info", node="gpu-a", gpu="0", **head_target) == 1.0
            headroom = value("oomguard_gpu_memory_headroom_used_ratio", **worker_gpu)
            assert headroom is not None and headroom < 0.01
            assert value("oomguard_target_restarts_total", **head_target) == 1.0
            for line in (TRACEBACK, OOM):
                await k8s.api.log("inference", worker_name, "ray-worker", line)
            ooms = {"kind": "cuda_oom", **head_target}
            await wait_for(lambda: equals(k8s.value("oomguard_target_events_total", **ooms), 1.0), "the worker's OOM")
    finally:
        for server in servers:
            await server.stop()


async def test_a_sharded_cluster_mode_reads_each_half_of_the_engine_once(tmp_path: Path) -> None:
    """Shards by node: the leader's shard has the engine's figures and the leader's GPU; the worker's shard judges
    the worker's GPU against the same reservation (read from the leader), and leaves the engine's figures out."""
    from oomguard.exporter.sources.kubernetes.shards import shard_of

    names = [f"gpu-{i:03d}" for i in range(40)]
    leader_node = next(n for n in names if shard_of(n, 2) == 0)
    worker_node = next(n for n in names if shard_of(n, 2) == 1)
    port, dcgm_port = free_port("127.0.0.2"), free_port("127.0.0.4")
    engine = Engine("127.0.0.2", port)
    worker_used = round(0.92 * TOTAL_MIB)
    exporters = [
        Dcgm("127.0.0.4", dcgm_port, gpu0_body(leader_node, 70 * 1024, "vllm-0", "vllm-leader")),
        Dcgm("127.0.0.5", dcgm_port, gpu0_body(worker_node, worker_used, "vllm-0-1", "vllm-worker")),
    ]
    servers = [engine.server, *(d.server for d in exporters)]
    async with two_shards(tmp_path, servers, **cluster_config(dcgm_port)) as (shard0, shard1):
        for obj in lws_pods("127.0.0.2", port, leader_node=leader_node, worker_node=worker_node):
            obj["metadata"]["labels"]["app.kubernetes.io/name"] = "vllm"
            await shard0.api.put("pods", obj)
        await shard0.api.put("pods", dcgm_pod("dcgm-a", "127.0.0.4", leader_node))
        await shard0.api.put("pods", dcgm_pod("dcgm-b", "127.0.0.5", worker_node))
        leader_gpu, worker_gpu = {"node": leader_node, "gpu": "0"}, {"node": worker_node, "gpu": "0"}
        await wait_for(lambda: shard0.value("oomguard_target_gpu_info", **leader_gpu, **LEADER), "shard 0")
        await wait_for(lambda: shard1.value("oomguard_target_gpu_info", **worker_gpu, **LEADER), "shard 1")
        await wait_for(lambda: shard1.value("oomguard_gpu_memory_engine_reserved_bytes", **worker_gpu), "joined")
        first, second = await shard0.metrics(), await shard1.metrics()
        engine_series = [k for k in first if k[0].startswith("oomguard_engine_")]
        assert engine_series, "the leader's shard exports the engine's figures"
        assert not [k for k in second if k[0].startswith("oomguard_engine_kv")], "once in Prometheus, not twice"
        headroom = second[("oomguard_gpu_memory_headroom_used_ratio", tuple(sorted(worker_gpu.items())))]
        assert headroom < 0.01
        assert not [k for k in first if dict(k[1]).get("node") == worker_node]
        assert not [k for k in second if dict(k[1]).get("node") == leader_node]


# ---- the node mode ---------------------------------------------------------------------------------------------


async def test_node_mode_on_a_workers_node_finds_its_leader_and_judges_the_worker_against_it(tmp_path: Path) -> None:
    """The node mode watches its node's pods only: on the worker's node the leader is asked of the API. The worker's
    process (its pod's cgroup) on GPU 0 at 92 % of the GPU is judged against the engine's reservation."""
    used = round(0.92 * 80 * GIB)
    nvml = FakeNvml([FakeGpu(0, used_bytes=used, processes=[FakeProcess(5151, used)]), FakeGpu(1)])
    async with engine_up() as engine:
        leader, worker = lws_pods(
            "127.0.0.2", engine.server.port, leader_node="gpu-a", worker_node="gpu-node-1", worker_restarts=1
        )
        uid = worker["metadata"]["uid"]
        (tmp_path / "proc" / "5151").mkdir(parents=True)
        (tmp_path / "proc" / "5151" / "cgroup").write_text(f"0::/kubepods/pod{uid}/{'e' * 64}\n")
        async with Cluster(tmp_path, nvml=nvml) as k8s:
            await k8s.api.put("pods", leader)
            await k8s.api.put("pods", worker)
            gpu = {"node": "gpu-node-1", "gpu": "0"}
            await wait_for(lambda: k8s.value("oomguard_gpu_memory_engine_reserved_bytes", **gpu), "the join")
            metrics = await k8s.metrics()
            assert k8s.targets() == [LEADER["target"]]
            assert metrics[("oomguard_target_gpu_info", tuple(sorted({**gpu, **LEADER}.items())))] == 1.0
            assert metrics[("oomguard_gpu_memory_headroom_used_ratio", tuple(sorted(gpu.items())))] < 0.01
            assert metrics[("oomguard_target_restarts_total", tuple(sorted(LEADER.items())))] == 1.0
            assert not [k for k in metrics if k[0].startswith("oomguard_engine_kv")], "the leader's node's exporter's"


async def _none(value: Any) -> bool:
    return (await value) is None
