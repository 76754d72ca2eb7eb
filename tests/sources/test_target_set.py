"""The one set of targets (sources/target_set.py): discovery changes it through its methods, the collection,
the trend sampler and the event poller read it; a collection in flight scrapes the set as it stood."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from targets_zoo import Zoo

from oomguard.common.engine_client import EngineClient
from oomguard.exporter.collection import SETTINGS, Collection
from oomguard.exporter.config import TargetConfig
from oomguard.exporter.model import ProcessTree, TargetView
from oomguard.exporter.sources import target_set
from oomguard.exporter.sources.local import settings as local_settings
from oomguard.exporter.sources.local.settings import SettingsReader
from oomguard.exporter.sources.process_lookup import ProcessLookup
from oomguard.exporter.sources.processes import ProcessFinder
from oomguard.exporter.sources.source_runs import SourceRuns
from oomguard.exporter.sources.target_set import TargetSet
from oomguard.exporter.sources.targets import TargetScraper


def make_scraper(config: TargetConfig) -> TargetScraper:
    return TargetScraper(config, timeout=1.0, max_body_bytes=1 << 20, finder=ProcessFinder())


def config(name: str, url: str = "http://127.0.0.1:9", **extra: object) -> TargetConfig:
    # The zoo's URL paths name its behaviours: past the validation, which takes a base URL only.
    base = TargetConfig(name=name, url="http://127.0.0.1:9", local_process="no", **extra)  # type: ignore[arg-type]
    return base.model_copy(update={"url": url})


def test_targets_keep_the_order_they_came_in_and_a_name_is_watched_once() -> None:
    targets = TargetSet(make_scraper, [config("a"), config("b")])
    targets.add(config("c"))
    targets.remove("b")
    targets.add(config("b"))
    assert targets.names() == ["a", "c", "b"]
    assert [s.name for s in targets.scrapers()] == ["a", "c", "b"]
    assert "c" in targets.names() and "z" not in targets.names() and len(targets.scrapers()) == 3
    with pytest.raises(ValueError, match="'a' is already watched"):
        targets.add(config("a", url="http://127.0.0.2:9"))
    targets.remove("z")  # gone already: nothing to do


def test_views_say_what_the_sampler_needs_and_nothing_of_the_scraper() -> None:
    local = TargetConfig(name="here", url="http://127.0.0.1:8000", local_process="yes")
    targets = TargetSet(make_scraper, [local, config("there", url="http://10.0.0.7:8000", gpus=(1, 2))])
    assert targets.views() == (
        TargetView(name="here", gpus=(), port=8000, state="loading", asleep=False),
        TargetView(name="there", gpus=(1, 2), port=None, state="loading", asleep=False),
    )
    assert targets.local_ports() == [8000]


def test_owners_give_each_targets_processes_on_this_host_by_its_port() -> None:
    local = TargetConfig(name="here", url="http://127.0.0.1:8000", local_process="yes")
    targets = TargetSet(make_scraper, [local, config("there", url="http://127.0.0.1:8000")])
    tree = ProcessTree(root_pid=41, pids=frozenset({41, 42}), resident_bytes=0.0, start_time_seconds=1.0)
    # The remote one shares the port number, not the processes: only a local target is looked up by port.
    assert list(targets.owners({8000: tree})) == [("here", frozenset({41, 42}), None), ("there", frozenset(), None)]
    assert list(targets.owners({})) == [("here", frozenset(), None), ("there", frozenset(), None)]


async def test_a_retargeted_target_keeps_its_counts_and_loads_until_it_answers(zoo: Zoo) -> None:
    targets = TargetSet(make_scraper, [config("pod", url=f"{zoo.base}/good")])
    async with EngineClient() as session:
        first = await targets.scrapers()[0].scrape(session)
        assert first.state == "up" and targets.has_served("pod")
        targets.retarget("pod", config("pod", url=f"{zoo.base}/500"))
        assert targets.url("pod") == f"{zoo.base}/500" and not targets.has_served("pod")
        moved = await targets.scrapers()[0].scrape(session)
    assert moved.state == "loading"  # a new process at the new address: loading, not down
    assert moved.errors_total["http_status"] == 1


async def test_a_new_container_loads_until_it_answers_and_a_start_reaches_its_tracker(zoo: Zoo) -> None:
    targets = TargetSet(make_scraper, [config("pod", url=f"{zoo.base}/500")])
    scraper = targets.scrapers()[0]
    scraper.status.ever_up = True  # it served before: a 500 now is down
    async with EngineClient() as session:
        assert (await scraper.scrape(session)).state == "down"
        targets.new_life("pod")
        assert (await scraper.scrape(session)).state == "loading"
    assert not scraper.restarts.is_new_life(5_000.0, 99)  # no life known yet: nothing to differ from
    targets.log_start("pod", 1_000.0, 77)
    targets.log_start("gone", 1_000.0, 78)  # a target removed since its line was read: nothing
    assert scraper.restarts.is_new_life(5_000.0, 99)  # the tracker holds the life the log told


async def test_a_collection_in_flight_scrapes_the_set_as_it_stood(zoo: Zoo) -> None:
    targets = TargetSet(make_scraper, [config("slow", url=f"{zoo.base}/slow"), config("good", url=f"{zoo.base}/good")])
    source_runs = SourceRuns()
    async with EngineClient() as session:
        collection = Collection(
            source_runs=source_runs, client=session, gpu_source=None, targets=targets,
            processes=ProcessLookup(ProcessFinder(), [], source_runs),
        )  # fmt: skip
        in_flight = asyncio.ensure_future(collection.snapshot())
        await asyncio.sleep(0.05)  # its requests are out
        targets.remove("good")
        targets.add(config("late", url=f"{zoo.base}/good"))
        snapshot = await in_flight
        assert [t.name for t in snapshot.targets] == ["slow", "good"]
        assert [t.name for t in (await collection.snapshot()).targets] == ["slow", "late"]


async def test_the_settings_step_is_a_source_and_its_failure_keeps_the_readings(
    zoo: Zoo, monkeypatch: pytest.MonkeyPatch
) -> None:
    def denied(unseen: object) -> object:
        raise PermissionError(13, "Permission denied", "/proc/1/environ")

    # A loading target on this host sends the reader to /proc for the engine that will listen there.
    monkeypatch.setattr(local_settings, "find_loading", denied)
    targets = TargetSet(make_scraper, [config("loading", url=f"{zoo.base}/500")])
    source_runs = SourceRuns()
    async with EngineClient() as session:
        collection = Collection(
            source_runs=source_runs, client=session, gpu_source=None, targets=targets,
            processes=ProcessLookup(ProcessFinder(), [], source_runs), settings=SettingsReader(),
        )  # fmt: skip
        snapshot = await collection.snapshot()
    assert [t.name for t in snapshot.targets] == ["loading"]
    assert snapshot.sources[SETTINGS].success is False
    assert snapshot.sources["targets"].success is True


def test_only_the_set_and_the_composition_root_know_the_scraper() -> None:
    """Discovery, the collection and the trend sampler reach the targets through the set: a module that imports
    the scraper to change or read it directly has gone round the owner."""
    package = Path(target_set.__file__).parents[1]
    importers = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "oomguard.exporter.sources.targets" in path.read_text()
        or "from oomguard.exporter.sources import targets" in path.read_text()
    )
    assert importers == ["runtime.py", "sources/target_set.py"]
