"""Load: concurrent scrapes share one collection and one rendering; the trend history stays bounded.

Speed is measured by bench/bench_concurrent_scrapes.py, bench/bench_many_targets.py and bench/bench_soak.py
(docs/performance.md), not here: these tests assert properties that hold on any machine.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from targets_zoo import Zoo

import oomguard.exporter.web
from oomguard.exporter.collection import Collection
from oomguard.exporter.model import Observation, TrendKey
from oomguard.exporter.trend.analysis import TrendSettings
from oomguard.exporter.trend.sampler import TrendTracker
from tests.test_fault_matrix import gpus, runtime_app

CONCURRENCY = 200


class SlowEngines(Zoo):
    """/good answers after `gate` opens: the burst is all in before the collection can end."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()

    async def metrics(self, request):  # type: ignore[no-untyped-def]
        await self.gate.wait()
        return await super().metrics(request)


async def test_concurrent_scrapes_share_one_collection_and_one_rendering(
    aiohttp_client, aiohttp_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    engines = SlowEngines()
    server = await aiohttp_server(engines.app())
    client = await aiohttp_client(
        runtime_app({"good": f"http://127.0.0.1:{server.port}/good"}, gpus()),
        connector=aiohttp.TCPConnector(limit=0),
    )
    assert (await client.get("/metrics")).status == 200  # the warm-up collection is over
    started = [0]
    in_flight = [0]
    most = [0]
    real_collect = Collection._collect

    async def counted(self: Collection):  # type: ignore[no-untyped-def]
        started[0] += 1
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        try:
            return await real_collect(self)
        finally:
            in_flight[0] -= 1

    renders = [0]
    real_render = oomguard.exporter.web.render

    def render(snapshot):  # type: ignore[no-untyped-def]
        renders[0] += 1
        return real_render(snapshot)

    monkeypatch.setattr(Collection, "_collect", counted)
    monkeypatch.setattr(oomguard.exporter.web, "render", render)
    engines.gate.clear()
    scrapes = [asyncio.ensure_future(client.get("/metrics")) for _ in range(CONCURRENCY)]
    deadline = asyncio.get_running_loop().time() + 10
    while started[0] == 0:  # the first scrape has started the collection, which waits on the gate
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    await asyncio.sleep(0)  # let every pending scrape reach the handler: they join, they do not start
    engines.gate.set()
    responses = await asyncio.gather(*scrapes)
    bodies = {await r.read() for r in responses}
    assert all(r.status == 200 for r in responses)
    assert most[0] == 1, f"{most[0]} collections in flight at once"
    assert len(bodies) == started[0] == renders[0], (len(bodies), started[0], renders[0])
    assert started[0] < CONCURRENCY / 10  # a burst costs a few collections at most, not one per scrape


def test_trend_history_stays_bounded_on_a_virtual_clock() -> None:
    """6 h of 2 s ticks on a virtual clock (bench/bench_soak.py runs the day): no series holds more than
    its window's worth, and keys that go (a GPU lost, a target renamed every hour) leave nothing behind."""
    settings = TrendSettings()
    tracker = TrendTracker(settings)
    window = int(settings.long_window_seconds / settings.interval_seconds) + 1
    ticks = int(6 * 3600 / settings.interval_seconds)
    for tick in range(ticks):
        t = tick * settings.interval_seconds
        hour = tick // 1800
        observations = {
            TrendKey("gpu", str(g), "gpu"): Observation((50 + (tick + 7 * g) % 30) * 1e9, 80e9) for g in range(2)
        }
        observations[TrendKey("target", f"renamed-{hour}", "gpu")] = Observation(60e9, 80e9)
        if tick % 5000 < 2500:  # a GPU that comes and goes
            observations[TrendKey("gpu", "9", "gpu")] = Observation(((tick % 97) + 1) * 1e8, 80e9)
        tracker.record(t, observations)
        if tick % 997 == 0 or tick == ticks - 1:
            for series in tracker._series.values():
                assert len(series) <= window
                assert len(series._times) <= 2 * series.maxlen  # the lists are compacted
            # Series of renamed targets are dropped after a window without a sample, and all they kept with them.
            assert len(tracker._series) <= 2 + 1 + 1 + 1
            assert set(tracker._capacity) == set(tracker._series)
            assert set(tracker.latest) <= set(tracker._series)
