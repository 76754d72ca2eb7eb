"""What lives as long as a discovered target is kept out of the garbage collector's full passes (runtime.py,
TargetFreezer; issue 50, item 1): frozen once the target set has settled after a change, and a removed target's
reference cycles freed by a later full refreeze, not kept for ever by the freeze. Observed through the collector
itself (gc.get_freeze_count, a weak reference), on a test's clock: not timed."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from oomguard.exporter.config import TargetConfig
from oomguard.exporter.runtime import FREEZE_SETTLE_SECONDS, REFREEZE_SECONDS, TargetFreezer
from oomguard.exporter.sources.processes import ProcessFinder
from oomguard.exporter.sources.target_set import TargetSet
from oomguard.exporter.sources.targets import TargetScraper


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    """The test process's own objects are not left frozen by a test."""
    gc.collect()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.collect()


class Held:
    """What a target holds, in a reference cycle (as a scraper's callbacks and tasks are)."""

    def __init__(self) -> None:
        self.me = self


def make_scraper(config: TargetConfig) -> TargetScraper:
    scraper = TargetScraper(config, timeout=1.0, max_body_bytes=1 << 20, finder=ProcessFinder())
    scraper.held = Held()  # type: ignore[attr-defined]
    return scraper


def target(name: str) -> TargetConfig:
    return TargetConfig(name=name, url="http://127.0.0.1:9", local_process="no")  # type: ignore[arg-type]


def test_the_targets_discovered_are_frozen_once_the_set_has_settled() -> None:
    clock = Clock()
    freezer = TargetFreezer(clock=clock)
    targets = TargetSet(make_scraper, on_change=freezer.changed)
    for i in range(50):
        targets.add(target(f"llm/vllm-{i}"))
        clock.now += 0.1
        freezer.step()  # still changing: nothing frozen yet
    assert gc.get_freeze_count() == 0
    clock.now += FREEZE_SETTLE_SECONDS
    freezer.step()
    frozen = gc.get_freeze_count()
    assert frozen > 0 and freezer.freezes == 1
    targets.add(target("llm/vllm-new"))  # a change settled again: what is new is frozen too
    clock.now += FREEZE_SETTLE_SECONDS
    freezer.step()
    assert gc.get_freeze_count() > frozen and freezer.freezes == 2


def test_a_removed_targets_cycles_are_freed_by_the_next_refreeze_not_kept_by_the_freeze() -> None:
    clock = Clock()
    freezer = TargetFreezer(clock=clock)
    targets = TargetSet(make_scraper, on_change=freezer.changed)
    targets.add(target("llm/vllm-0"))
    targets.add(target("llm/vllm-1"))
    clock.now += FREEZE_SETTLE_SECONDS
    freezer.step()
    gone = weakref.ref(targets.scrapers()[0].held)  # type: ignore[attr-defined]
    targets.remove("llm/vllm-0")
    clock.now += FREEZE_SETTLE_SECONDS
    freezer.step()  # settled: what is new is frozen, nothing thawed yet
    gc.collect()
    assert gone() is not None  # frozen, its cycle is not collected: the leak the refreeze ends
    clock.now += REFREEZE_SECONDS
    freezer.step()
    assert gone() is None and freezer.refreezes == 1
    assert gc.get_freeze_count() > 0  # the rest frozen again


def test_a_short_lived_cycle_a_freeze_caught_is_freed_by_the_refreeze_though_no_target_went_away() -> None:
    """A freeze while a scrape is in flight catches its cycles (tasks, futures): freed by the next full refreeze,
    which follows any change of the set, not only a removal."""
    clock = Clock()
    freezer = TargetFreezer(clock=clock)
    targets = TargetSet(make_scraper, on_change=freezer.changed)
    in_flight = Held()  # a scrape's cycle, alive at the freeze
    caught = weakref.ref(in_flight)
    targets.add(target("llm/vllm-0"))
    clock.now += FREEZE_SETTLE_SECONDS
    freezer.step()
    del in_flight  # the scrape ends: its cycle is garbage, frozen
    gc.collect()
    assert caught() is not None
    clock.now += REFREEZE_SECONDS
    freezer.step()
    assert caught() is None and freezer.refreezes == 1
    clock.now += REFREEZE_SECONDS
    freezer.step()  # nothing changed since: no full pass again
    assert freezer.refreezes == 1


def test_the_target_set_tells_each_add_retarget_and_remove() -> None:
    """What the runtime's freezer is told (runtime.py builds the one TargetSet with on_change=freezer.changed)."""
    seen: list[bool] = []
    targets = TargetSet(make_scraper, on_change=lambda *, gone: seen.append(gone))
    targets.add(target("a"))
    targets.retarget("a", target("a"))
    targets.remove("a")
    targets.remove("a")  # not there: no change
    assert seen == [False, True, True]
