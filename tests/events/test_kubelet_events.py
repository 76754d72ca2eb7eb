"""The kubelet's Events of a discovered pod: matched to it by namespace, name and UID, in its own namespace; a count
is the Event writer's word, bounded (events/kubernetes.py)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

from oomguard.exporter.config import EventsConfig
from oomguard.exporter.events.kubernetes import MAX_GROWTH, PodEvents
from oomguard.exporter.events.registry import SavedState
from oomguard.simulate import kubernetes_objects as objects

TARGET = "llm/vllm-0"
KILL = "Container vllm failed liveness probe, will be restarted"


def pod_events() -> tuple[PodEvents, dict]:
    pod = objects.pod("vllm-0", "127.0.0.2", 8000)
    meta = pod["metadata"]
    events = PodEvents(SimpleNamespace(saved=SavedState()), EventsConfig())  # type: ignore[arg-type]
    events.add(TARGET, namespace=meta["namespace"], name=meta["name"], uid=meta["uid"], container="vllm",
               ended=None, watched=True)  # fmt: skip
    events.events_listed([], None)  # the baseline: no Events yet
    return events, pod


def counted(events: PodEvents) -> list[tuple[str, int]]:
    return [(e.kind, e.count) for e in events._pods[TARGET].api.poll(0.0)]


def test_the_pods_own_event_counts() -> None:
    events, pod = pod_events()
    events.event("ADDED", objects.event(pod, "Killing", KILL))
    assert counted(events) == [("probe_kill", 1)]


def test_an_event_written_in_another_namespace_naming_the_pods_uid_counts_nothing() -> None:
    """A tenant who may create Events in their own namespace writes one about the victim's pod (its UID, name and
    namespace in involvedObject), with a count of 10^15: it is not the kubelet's Event of that pod."""
    events, pod = pod_events()
    forged = objects.event(pod, "Killing", KILL, count=10**15)
    forged["metadata"]["namespace"] = "tenant"
    events.event("ADDED", forged)
    assert counted(events) == []


def test_an_event_of_another_pod_with_the_same_uid_counts_nothing() -> None:
    events, pod = pod_events()
    for field, value in (("name", "vllm-1"), ("namespace", "other")):
        other = objects.event(pod, "Killing", KILL)
        other["involvedObject"][field] = value
        other["metadata"]["namespace"] = other["involvedObject"]["namespace"]
        events.event("ADDED", other)
    assert counted(events) == []


def test_a_count_is_bounded_per_change() -> None:
    events, pod = pod_events()
    unhealthy = objects.event(pod, "Unhealthy", "Liveness probe failed: HTTP probe failed", count=2)
    events.event("ADDED", unhealthy)
    grown = copy.deepcopy(unhealthy)
    grown["count"] = 10**15  # beyond an int32: the writer's word, not the kubelet's
    events.event("MODIFIED", grown)
    grown = copy.deepcopy(unhealthy)
    grown["count"] = 2**31 - 1
    events.event("MODIFIED", grown)
    grown["count"] = "7"  # not a number
    events.event("MODIFIED", grown)
    assert counted(events) == [("probe_failure", 2), ("probe_failure", MAX_GROWTH)]
