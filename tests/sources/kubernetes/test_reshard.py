"""A sharded cluster mode resharded (kubernetes.shards 2 -> 3 -> 2) as a StatefulSet rolls it, against the API
stand-in (which skips log lines before `sinceTime` as the kubelet does): with OOMs logged in every pod all along,
each is counted exactly once, whichever shard held its node when it was written, while a node was read by the
shard of the old layout, by none (its old shard stopped, its new one not started yet), or was to be read by two."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from oomguard.exporter.events.runner import STATE_FILE
from oomguard.exporter.sources.kubernetes.shards import shard_of
from oomguard.simulate import kubernetes_objects as objects
from oomguard.simulate.kubernetes_api import StandIn
from tests.sources.kubernetes.k8s_harness import (
    OOM,
    TRACEBACK,
    Cluster,
    Dcgm,
    dcgm_body,
    dcgm_pod,
    engine_up,
    equals,
    free_port,
    wait_for,
)

STARTED = "INFO 12-05 12:00:00 [api_server.py:1885] vLLM API server version 0.11.0"
HANDOVER = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "oomguard-shards", "namespace": "default"}}


def nodes_of_every_move() -> list[str]:
    """A node for each way 2 shards and 3 can place it (its shard of 2, its shard of 3): stays on 0, 0 -> 1,
    0 -> 2, 1 -> 0, stays on 1, 1 -> 2."""
    wanted = {(a, b) for a in range(2) for b in range(3)}
    found: dict[tuple[int, int], str] = {}
    for i in range(1000):
        node = f"gpu-{i:03d}"
        found.setdefault((shard_of(node, 2), shard_of(node, 3)), node)
        if len(found) == len(wanted):
            break
    return [found[k] for k in sorted(wanted)]


class Shards:
    """The StatefulSet's exporters: shard i on its own state volume (folder i), started and stopped as a rolling
    update does, all against one API."""

    def __init__(self, tmp: Path, api: StandIn, top: dict[str, Any] | None = None) -> None:
        self.tmp, self.api = tmp, api
        self.top = top or {"nvml": {"enabled": False}}
        self.running: dict[int, Cluster] = {}

    async def start(self, shard: int, shards: int) -> None:
        folder = self.tmp / str(shard)
        folder.mkdir(exist_ok=True)
        config: dict[str, Any] = {"scope": "cluster", "top": self.top}
        cluster = Cluster(folder, api=self.api, shards=shards, shard=shard, **config)
        await cluster.__aenter__()
        self.running[shard] = cluster

    async def stop(self, shard: int) -> None:
        await self.running.pop(shard).__aexit__(None, None, None)

    async def counted(self) -> dict[str, int]:
        """Each target's OOMs, added up over every shard: those running (their counts now), the others (what
        their state volume holds)."""
        total: dict[str, int] = {}
        for folder in sorted(p for p in self.tmp.iterdir() if p.is_dir()):
            shard = int(folder.name)
            if shard in self.running:
                assert self.running[shard].runtime.collection is not None
                counts = {
                    t: c.total for t, c in (await self.running[shard].runtime.collection.snapshot()).events.items()
                }
            else:
                state = folder / "state" / STATE_FILE
                saved = json.loads(state.read_text()) if state.exists() else {}
                counts = {t: c.get("total", {}) for t, c in saved.get("counts", {}).items()}
            for target, kinds in counts.items():
                total[target] = total.get(target, 0) + kinds.get("cuda_oom", 0)
        return total


async def test_a_reshard_from_2_to_3_and_back_counts_each_oom_once(tmp_path: Path) -> None:
    api = StandIn()
    await api.put("configmaps", HANDOVER)  # as deploy/kubernetes-sharded ships it
    nodes = nodes_of_every_move()
    pods = [f"vllm-{i}" for i in range(len(nodes))]
    targets = [f"llm/{pod}" for pod in pods]
    logged = dict.fromkeys(targets, 0)

    async def oom_everywhere() -> None:
        """An OOM in every pod, and the engine up again after it: one incident each."""
        for pod, target in zip(pods, targets, strict=True):
            for line in (TRACEBACK, OOM, STARTED):
                await api.log("llm", pod, "vllm", line)
            logged[target] += 1

    shards = Shards(tmp_path, api)
    async with engine_up() as engine:
        for pod, node in zip(pods, nodes, strict=True):
            await api.log("llm", pod, "vllm", STARTED, container_id="a" * 64)
            await api.put("pods", objects.pod(pod, "127.0.0.2", engine.server.port, node=node))
        # Two shards, then the StatefulSet rolled to three (podManagementPolicy Parallel: the new ordinal starts at
        # once; then each ordinal is replaced, the highest first), then back to two (the ordinal past the shards
        # stopped first), then one replaced. An OOM in every pod between any two of these steps.
        steps: list[tuple[str, int, int]] = [
            ("start", 0, 2), ("start", 1, 2),
            ("start", 2, 3), ("stop", 1, 0), ("start", 1, 3), ("stop", 0, 0), ("start", 0, 3),
            ("stop", 2, 0), ("stop", 1, 0), ("start", 1, 2), ("stop", 0, 0), ("start", 0, 2),
            ("stop", 1, 0), ("start", 1, 2),  # and a shard replaced, its count unchanged
        ]  # fmt: skip
        try:
            for i, (what, shard, count) in enumerate(steps):
                if what == "start":
                    await shards.start(shard, count)
                else:
                    await shards.stop(shard)
                if i == 1:  # both shards of the first layout follow every pod's log from here on
                    await wait_for(lambda: followed(api) == set(pods), "every pod's log followed")
                if i >= 1:
                    await oom_everywhere()
                    await asyncio.sleep(0.3)
            await wait_for(lambda: equals(shards.counted(), logged), f"{logged} OOMs counted", timeout=20.0)
            await asyncio.sleep(1.0)  # the polls after: nothing counted twice
            assert await shards.counted() == logged
        finally:
            for shard in list(shards.running):
                await shards.stop(shard)
    assert await shards.counted() == logged  # what the state volumes keep


def followed(api: StandIn) -> set[str]:
    """The pods whose log a stream was asked for."""
    asked = [r.partition("?") for r in api.requests]
    return {path.split("/")[6] for path, _, query in asked if path.endswith("/log") and "follow=true" in query}


async def test_a_shard_scaled_away_that_was_killed_is_waited_for_then_its_nodes_read_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 shards to 2, and shard 2 killed before it let its nodes go: shard 1 of 2 waits for it (GRACE_SECONDS),
    neither reading the node's pods nor its GPUs meanwhile, then reads them as if no position was saved, and the
    pod's log source says so (a read error)."""
    monkeypatch.setattr("oomguard.exporter.sources.kubernetes.handover.GRACE_SECONDS", 3.0)
    api = StandIn()
    await api.put("configmaps", HANDOVER)
    node = next(n for n in (f"gpu-{i:03d}" for i in range(100)) if (shard_of(n, 3), shard_of(n, 2)) == (2, 1))
    dcgm_port = free_port("127.0.0.4")
    dcgm = Dcgm("127.0.0.4", dcgm_port, dcgm_body(node, [(0, 40 * 1024, 40 * 1024, "vllm-0")]))
    top = {"dcgm": {"discover": True, "port": dcgm_port, "timeout_seconds": 1.0, "namespaces": ["gpu-operator"]}}
    shards = Shards(tmp_path, api, top)
    gpu = {"node": node, "gpu": "0"}
    async with engine_up() as engine:
        await dcgm.server.start()
        await api.put("pods", dcgm_pod("dcgm-0", "127.0.0.4", node))
        await api.log("llm", "vllm-0", "vllm", STARTED, container_id="a" * 64)
        await api.put("pods", objects.pod("vllm-0", "127.0.0.2", engine.server.port, node=node))
        await shards.start(2, 3)
        await wait_for(lambda: shards.running[2].value("oomguard_gpu_memory_used_bytes", **gpu), "shard 2 reads it")
        await wait_for(lambda: followed(api) == {"vllm-0"}, "the pod's log followed by shard 2")
        killed = shards.running[2].runtime.discovery
        assert killed is not None and killed._client is not None
        client = killed._client
        monkeypatch.setattr(killed, "close", client.close)  # killed: nothing let go
        await shards.stop(2)
        await shards.start(1, 2)
        k8s = shards.running[1]
        assert await k8s.value("oomguard_gpu_memory_used_bytes", **gpu) is None  # the holder's still, for now
        assert k8s.targets() == []
        await wait_for(lambda: k8s.targets() == ["llm/vllm-0"], "the node read once its holder is deemed gone")
        await wait_for(lambda: k8s.value("oomguard_gpu_memory_used_bytes", **gpu), "and its GPUs")
        source = {"target": "llm/vllm-0", "source": "k8s-log:llm/vllm-0/vllm", "namespace": "llm", "pod": "vllm-0",
                  "container": "vllm"}  # fmt: skip
        await wait_for(lambda: k8s.value("oomguard_event_source_read_errors_total", **source), "the loss said")
        await shards.stop(1)
        await dcgm.server.stop()
