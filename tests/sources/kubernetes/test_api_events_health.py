"""The API's Events watch is one reader for the whole exporter: its health is said once, not once a pod (issue 50,
item 3), and its counts never go back when a pod goes."""

from __future__ import annotations

from pathlib import Path

from support import samples

from oomguard.exporter.exposition import render
from oomguard.simulate import kubernetes_objects as objects
from tests.sources.kubernetes.k8s_harness import Cluster, engine_up, wait_for

HEALTH = (
    "oomguard_event_source_lines_read_total",
    "oomguard_event_source_read_bytes_total",
    "oomguard_event_source_read_errors_total",
    "oomguard_event_source_bytes_behind",
    "oomguard_event_source_lines_truncated_total",
    "oomguard_event_source_lines_malformed_total",
)
PODS = ("vllm-a", "vllm-b", "vllm-c")


async def _answer(k8s: Cluster) -> str:
    assert k8s.runtime.collection is not None
    return render(await k8s.runtime.collection.snapshot()).decode()


def _api_series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The series of the API events' source (`k8s-api`), whichever its target."""
    return {k: v for k, v in samples(text).items() if dict(k[1]).get("source", "").startswith("k8s-api")}


async def test_the_api_events_health_is_said_once_for_the_exporter_not_per_pod(tmp_path: Path) -> None:
    config = {"scope": "cluster", "top": {"nvml": {"enabled": False}}}
    async with engine_up() as engine, Cluster(tmp_path, **config) as k8s:
        port = engine.server.port
        uids = {}
        for name in PODS:
            uids[name] = (await k8s.api.put("pods", objects.pod(name, "127.0.0.2", port)))["metadata"]["uid"]
        await wait_for(lambda: k8s.targets() == [f"llm/{p}" for p in PODS], "the three pods as targets")
        # Each pod's log is followed (its own source, per pod), and its API events' kinds count from zero.
        logs = 'source="k8s-log:'
        await wait_for(lambda: _count(k8s, logs), "the pods' logs followed")
        text = await _answer(k8s)
        api = _api_series(text)
        assert sorted(name for name, _ in api) == sorted(HEALTH), api  # once each, not once a pod
        for _, labels in api:
            assert dict(labels)["source"] == "k8s-api" and dict(labels).get("target", "") == "", labels
        for name in PODS:
            target = {"target": f"llm/{name}", "namespace": "llm", "pod": name, "container": "vllm"}
            for kind in ("container_oom_killed", "probe_failure", "probe_kill"):
                key = ("oomguard_target_events_total", tuple(sorted({**target, "kind": kind}.items())))
                assert samples(text).get(key) == 0.0, key

        # vllm-a's engine container ends OOMKilled: one API object told of an event, whichever pod.
        ended = objects.terminated("OOMKilled", 137, "2026-12-03T12:05:00Z", container_id="1" * 64)
        await k8s.api.put(
            "pods", objects.pod("vllm-a", "127.0.0.2", port, uid=uids["vllm-a"], restart_count=1, last_terminated=ended)
        )
        read = ("oomguard_event_source_lines_read_total", (("source", "k8s-api"),))
        await wait_for(lambda: _value(k8s, read, 1.0), "the exporter's API events: 1 read")
        # vllm-a goes: the exporter's count stays (a counter never goes back), the others' sources go on.
        await k8s.api.delete("pods", "llm", "vllm-a")
        await wait_for(lambda: k8s.targets() == ["llm/vllm-b", "llm/vllm-c"], "vllm-a gone")
        assert _api_series(await _answer(k8s))[read] == 1.0


async def _count(k8s: Cluster, marker: str) -> bool:
    text = await _answer(k8s)
    files = [line for line in text.splitlines() if line.startswith("oomguard_event_source_files")]
    return sum(1 for line in files if marker in line) == len(PODS)


async def _value(k8s: Cluster, key: tuple[str, tuple[tuple[str, str], ...]], wanted: float) -> bool:
    return _api_series(await _answer(k8s)).get(key) == wanted
