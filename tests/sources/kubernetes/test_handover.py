"""The sharded cluster mode's hand-over records (sources/kubernetes/handover.py) against the API stand-in's
ConfigMap: who may take a node and from where, a record that is not one, a holder gone without letting go, and a
ConfigMap that is missing."""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from oomguard.exporter.sources.kubernetes import handover as handover_module
from oomguard.exporter.sources.kubernetes.api import ApiClient, Connection
from oomguard.exporter.sources.kubernetes.handover import Entry, Handover, Record, decode, encode, record_key
from oomguard.exporter.sources.kubernetes.shards import Shard, shard_of
from oomguard.simulate import kubernetes_objects as objects
from oomguard.simulate.kubernetes_api import StandIn
from tests.sources.kubernetes.k8s_harness import OOM, TRACEBACK, Cluster, engine_up, wait_for
from tests.sources.kubernetes.test_reshard import HANDOVER, STARTED

PATH = "/api/v1/namespaces/default/configmaps/oomguard-shards"
STATES = {"k8s-log:llm/vllm-0/vllm": {"positions": {"last": "2026-12-05T12:00:01.000000000Z", "same": 1}}}


@pytest.fixture
async def api(aiohttp_server) -> AsyncIterator[tuple[StandIn, ApiClient]]:
    stand_in = StandIn()
    await stand_in.put("configmaps", HANDOVER)
    served = await aiohttp_server(stand_in.app(), shutdown_timeout=0.1)
    client = ApiClient(Connection(f"http://127.0.0.1:{served.port}"))
    yield stand_in, client
    await client.close()


def handover(client: ApiClient, shard: int, shards: int) -> Handover:
    return Handover(
        client, namespace="default", name="oomguard-shards", key=f"shard-{shard}", shard=Shard(shard, shards)
    )


async def put_record(stand_in: StandIn, key: str, record: Record) -> None:
    obj = stand_in.objects["configmaps"][("default", "oomguard-shards")]
    await stand_in.put("configmaps", {**obj, "binaryData": {**obj.get("binaryData", {}), key: encode(record)}})


def test_the_record_key_and_its_statefulset() -> None:
    assert record_key("oomguard-2", 2) == "oomguard-2"
    assert record_key("oomguard-a-2", 2) == "oomguard-a-2"
    assert record_key("", 1) == "shard-1"
    assert record_key("oomguard-5d8f9c7b6-x2k4p", 0) == "shard-0"  # a Deployment's pod: no ordinal


def test_a_record_that_is_not_one_is_refused_naming_what_is_wrong() -> None:
    record = Record(3, 1, {"gpu-a": Entry(2, False, {"uid-1": STATES}), "gpu-b": Entry(0, True)})
    assert decode(encode(record)) == record
    bomb = base64.b64encode(zlib.compress(b"[" * (64 << 20))).decode()  # 64 MiB of brackets, 64 KiB compressed
    for bad, why in (
        (5, "not a string"),
        ("%%%", "not a record"),
        (base64.b64encode(b"not zlib").decode(), "not a record"),
        (bomb, "more than 16777216 bytes inflated"),
        (base64.b64encode(zlib.compress(b'{"shards": 0, "shard": 0, "nodes": {}}')).decode(), "no shards"),
        (base64.b64encode(zlib.compress(json.dumps({"shards": 2, "shard": 0, "nodes": {"n": {"seq": -1}}}).encode()))
         .decode(), "node 'n': no seq"),
        (base64.b64encode(zlib.compress(json.dumps(
            {"shards": 2, "shard": 0, "nodes": {"n": {"seq": 1, "held": False, "pods": {"u": [1]}}}}).encode()))
         .decode(), "pods of a wrong shape"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=why):
            decode(bad)


async def test_who_takes_a_node_and_from_where(
    api: tuple[StandIn, ApiClient], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    stand_in, client = api
    nodes = {n: (shard_of(n, 2), shard_of(n, 3)) for n in (f"gpu-{i:03d}" for i in range(40))}
    moved = next(n for n, (two, three) in nodes.items() if (two, three) == (0, 2))
    mine = handover(client, 2, 3)  # the new shard 2 of 3, while shard 0 of 2 still reads `moved`
    await put_record(stand_in, "shard-0", Record(2, 0, {moved: Entry(4, True)}))
    await put_record(stand_in, "other-0", Record(2, 0, {moved: Entry(9, False, {"uid-x": STATES})}))  # another set
    await put_record(stand_in, "shard-1", Record(2, 1, {}))
    obj = stand_in.objects["configmaps"][("default", "oomguard-shards")]
    await stand_in.put("configmaps", {**obj, "binaryData": {**obj["binaryData"], "shard-5": "%%%"}})
    await mine.load()
    assert sorted(mine.records) == ["shard-0", "shard-1"]  # other-0 is another StatefulSet's; shard-5 refused
    assert [r.getMessage() for r in caplog.records if "shard-5" in r.getMessage()]
    assert mine.decide(moved).kind == "wait" and mine.decide(moved).holder == "shard-0"
    assert mine.decide("gpu-new").kind == "new"
    # Shard 0 stops: it lets the node go after the last line it read (seq 5). Shard 2 takes it, from there.
    await put_record(stand_in, "shard-0", Record(2, 0, {moved: Entry(5, False, {"uid-1": STATES})}))
    await mine.load()
    taken = mine.decide(moved)
    assert (taken.kind, taken.seq, taken.pods, taken.holder) == ("take", 5, {"uid-1": STATES}, "shard-0")
    mine.hold(moved, taken.seq)
    await mine.write()
    assert decode(stand_in.patches[-1][1]["binaryData"]["shard-2"]) == Record(3, 2, {moved: Entry(5, True)})
    # Shard 0 restarted under 3 shards: its release is taken (a hold at the same seq is newer): dropped.
    zero = handover(client, 0, 3)
    await zero.load()
    assert zero.mine.nodes == {moved: Entry(5, False, {"uid-1": STATES})}  # where its last run left it
    zero.drop_superseded()
    assert zero.mine.nodes == {}
    # Back to 2 shards: shard 2 stopped (seq 6); shard 0 had read the node long ago: the newest word wins.
    await put_record(stand_in, "shard-2", Record(3, 2, {moved: Entry(6, False, {"uid-1": {"k8s-api:llm/v": {}}})}))
    back = handover(client, 0, 2)
    await back.load()
    back.mine.nodes[moved] = Entry(4, True)  # as if its record still said so
    assert back.decide(moved).kind == "take" and back.decide(moved).seq == 6
    # A holder scaled away (shard 2 of 3, past 2 shards) that was killed: waited for, then read as lost.
    await put_record(stand_in, "shard-2", Record(3, 2, {moved: Entry(7, True)}))
    clock = [1000.0]
    monkeypatch.setattr(handover_module.time, "monotonic", lambda: clock[0])
    await back.load()
    assert back.decide(moved).kind == "wait"
    clock[0] += handover_module.GRACE_SECONDS + 1
    lost = back.decide(moved)
    assert (lost.kind, lost.seq, lost.holder) == ("lost", 8, "shard-2")
    # Shard 1 of 2, not scaled away, is waited for longer: it lets the node go when it restarts under 2 shards,
    # unless its roll stalls (or its record cannot be written) past WAIT_MAX_SECONDS.
    await put_record(stand_in, "shard-1", Record(3, 1, {moved: Entry(8, True)}))
    await back.load()
    clock[0] += handover_module.GRACE_SECONDS + 1
    assert back.decide(moved).kind == "wait"
    clock[0] += handover_module.WAIT_MAX_SECONDS + 1
    assert back.decide(moved).kind == "lost"


async def test_without_the_configmap_the_shards_read_as_before_and_say_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """deploy/kubernetes-sharded ships the ConfigMap; without it (or without the RBAC to it), each node is read by
    its shard as before this hand-over existed, and the source says it fails."""
    async with engine_up() as engine:
        config = {"scope": "cluster", "top": {"nvml": {"enabled": False}}, "shards": 2}
        node = next(n for n in (f"gpu-{i:03d}" for i in range(40)) if shard_of(n, 2) == 0)
        async with Cluster(tmp_path, shard=0, **config) as k8s:
            await k8s.api.put("pods", objects.pod("vllm-0", "127.0.0.2", engine.server.port, node=node))
            await wait_for(lambda: k8s.targets() == ["llm/vllm-0"], "the pod read")
            assert await k8s.value("oomguard_source_success", source="shard_handover") == 0.0
            await k8s.api.log("llm", "vllm-0", "vllm", STARTED, container_id="a" * 64)
            for line in (TRACEBACK, OOM, STARTED):
                await k8s.api.log("llm", "vllm-0", "vllm", line)
            await wait_for(
                lambda: k8s.value("oomguard_target_events_total", kind="cuda_oom", target="llm/vllm-0",
                                  namespace="llm", pod="vllm-0", container="vllm"), "its OOM counted"
            )  # fmt: skip
    said = [r.getMessage() for r in caplog.records if "ConfigMap default/oomguard-shards" in r.getMessage()]
    assert said and "HTTP 404" in said[0] and "give the service account get and patch on it" in said[0]


def test_a_handed_state_that_is_not_one_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    """What a release holds is checked as a state file is before a source resumes from it."""
    from oomguard.exporter.events.kubernetes import checked_states

    good = STATES["k8s-log:llm/vllm-0/vllm"]
    states = {
        "k8s-log:llm/vllm-0/vllm": good,
        "k8s-api:llm/vllm-0": {"positions": {"last_termination": 5}},  # not a termination's key
        "k8s-log:llm/vllm-0/other": {"incidents": {"open": "yes"}, "counts": {"x": 1}},
    }
    assert checked_states(states, "llm/vllm-0") == {"k8s-log:llm/vllm-0/vllm": good}
    refused = [r.getMessage() for r in caplog.records if "is refused" in r.getMessage()]
    assert len(refused) == 2 and "k8s-api:llm/vllm-0" in refused[0]
