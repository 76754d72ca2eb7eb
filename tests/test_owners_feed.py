"""Whose processes and pods a kernel OOM kill may be (events/kill_owners.py) is told to the event runner when the
target set or the process lookup changed, or every OWNERS_REFRESH_SECONDS, not at every poll of the events
(runtime.py, OwnersFeed; issue 50, item 5: at 1,000 pods the updates cost more than the polls). On a test's clock."""

from __future__ import annotations

from oomguard.exporter.config import TargetConfig
from oomguard.exporter.events.kill_owners import REMEMBER_SECONDS, KillOwners
from oomguard.exporter.model import PodRef
from oomguard.exporter.runtime import OWNERS_REFRESH_SECONDS, OwnersFeed
from oomguard.exporter.sources.process_lookup import ProcessLookup
from oomguard.exporter.sources.processes import ProcessFinder
from oomguard.exporter.sources.source_runs import SourceRuns
from oomguard.exporter.sources.target_set import TargetSet
from oomguard.exporter.sources.targets import TargetScraper

POD_UID = "0d7f1c2e-5b9a-4c3d-8e6f-1a2b3c4d5e6f"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scraper(config: TargetConfig) -> TargetScraper:
    return TargetScraper(config, timeout=1.0, max_body_bytes=1 << 20, finder=None)


def target(name: str) -> TargetConfig:
    return TargetConfig(name=name, url="http://10.0.0.1:8000", local_process="no")  # type: ignore[arg-type]


def test_the_owners_are_told_when_something_changed_or_seldom_not_at_every_poll() -> None:
    clock = Clock()
    feed = OwnersFeed(clock=clock)
    targets = TargetSet(scraper)
    processes = ProcessLookup(ProcessFinder(), [], SourceRuns())
    owners = KillOwners(clock=clock)
    targets.add(target("llm/vllm-0"))
    targets.set_pod("llm/vllm-0", POD_UID, PodRef(namespace="llm", name="vllm-0", node="gpu-000", container="vllm"))
    told = [feed.feed(targets, processes, owners)]
    cgroup = f"/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-{'a' * 64}.scope"
    assert owners.owner_of(None, cgroup) == "llm/vllm-0"
    for _ in range(20):  # polls every 0.5 s, nothing changed
        clock.now += 0.5
        told.append(feed.feed(targets, processes, owners))
    assert told == [True] + [False] * 20
    targets.add(target("llm/vllm-1"))  # a change: told at the next poll
    assert feed.feed(targets, processes, owners)
    targets.remove("llm/vllm-0")
    assert feed.feed(targets, processes, owners)
    assert owners.owner_of(None, cgroup) is None  # a target gone is forgotten at once
    clock.now += OWNERS_REFRESH_SECONDS  # and again now and then, well within what a process seen is remembered
    assert feed.feed(targets, processes, owners)
    assert OWNERS_REFRESH_SECONDS < REMEMBER_SECONDS
