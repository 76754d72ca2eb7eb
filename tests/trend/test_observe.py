"""One tick of the sampler (trend/observe.py): what it observes, and vLLM's sleep mode.

A sleeping engine has released its memory: its own series are not sampled while it sleeps,
and when it wakes its series and its GPUs' start afresh, so the jump back is not a spike.
"""

from __future__ import annotations

from dataclasses import replace

from oomguard.exporter import join as join_module
from oomguard.exporter.model import Observation, TargetView, TrendKey
from oomguard.exporter.sources.nvml import NvmlSource
from oomguard.exporter.sources.nvml_reader import NvmlReader
from oomguard.exporter.sources.process_lookup import ProcessLookup
from oomguard.exporter.sources.processes import ProcessFinder
from oomguard.exporter.sources.source_runs import SourceRuns
from oomguard.exporter.trend import observe as observe_module
from oomguard.exporter.trend.analysis import TrendSettings
from oomguard.exporter.trend.observe import TrendObserver
from oomguard.exporter.trend.sampler import TrendTracker
from oomguard.simulate.fake_nvml import GIB, FakeGpu, FakeNvml

GPU0 = TrendKey("gpu", "0", "gpu")
GPU1 = TrendKey("gpu", "1", "gpu")
TARGET = TrendKey("target", "llama", "gpu")


async def test_sleep_skips_the_engines_series_and_waking_starts_them_afresh() -> None:
    nvml = NvmlReader(NvmlSource(FakeNvml([FakeGpu(0, used_bytes=72 * GIB), FakeGpu(1, used_bytes=GIB)])), 3.0)
    # A sleeping engine is up: it answers, with its memory released.
    target = TargetView(name="llama", gpus=(0,), port=None, state="up", asleep=False)
    tracker = TrendTracker(TrendSettings())
    observer = TrendObserver(nvml, ProcessLookup(ProcessFinder(), [], SourceRuns()), lambda: [target], tracker)
    try:
        awake = await observer.observe()
        assert set(awake) == {GPU0, GPU1, TARGET}
        for t in range(0, 400, 2):
            tracker.record(float(t), awake)
        assert {GPU0, GPU1, TARGET} <= set(tracker.latest)

        target = replace(target, asleep=True)  # as its last /metrics said: vllm:engine_sleep_state weights_offloaded
        asleep = await observer.observe()
        assert set(asleep) == {GPU0, GPU1}  # the GPUs go on (others may use them meanwhile), the engine not
        assert TARGET in tracker.latest  # nothing forgotten on falling asleep

        target = replace(target, asleep=False)
        woke = await observer.observe()
        assert set(woke) == {GPU0, GPU1, TARGET}
        # Its series and its GPU's start afresh; the other GPU's history is kept.
        assert GPU0 not in tracker.latest and TARGET not in tracker.latest
        assert GPU1 in tracker.latest
        assert woke[GPU0] == Observation(72 * GIB, 80 * GIB)
    finally:
        nvml.close()


async def test_a_loading_engine_and_its_gpu_are_not_sampled_and_start_afresh_once_up() -> None:
    """A model load fills the GPU by design (hours, for a large model): not a climb of the engine, nor of its GPU
    while no engine that is up shares it. Once up, the series start from the memory it serves with."""
    gpus = [FakeGpu(0, used_bytes=10 * GIB), FakeGpu(1, used_bytes=GIB)]
    nvml = NvmlReader(NvmlSource(FakeNvml(gpus)), 3.0)
    target = TargetView(name="llama", gpus=(0,), port=None, state="loading", asleep=False)  # not answered yet
    tracker = TrendTracker(TrendSettings())
    observer = TrendObserver(nvml, ProcessLookup(ProcessFinder(), [], SourceRuns()), lambda: [target], tracker)
    try:
        for t in range(0, 400, 2):
            gpus[0].used_bytes = (10 + t // 10) * GIB  # the weights and the KV cache pool coming in
            seen = await observer.observe()
            assert set(seen) == {GPU1}  # GPU 0 only has the loading engine; GPU 1 goes on
            tracker.record(float(t), seen)
        assert GPU0 not in tracker.latest and TARGET not in tracker.latest

        target = replace(target, state="up")
        up = await observer.observe()
        assert set(up) == {GPU0, GPU1, TARGET}
        assert up[GPU0] == Observation(49 * GIB, 80 * GIB)  # from the memory it serves with
    finally:
        nvml.close()


async def test_a_tick_whose_gpus_read_as_the_last_did_joins_no_target_again(monkeypatch) -> None:
    """A target's join (its GPUs, its worst, the use beyond its reservation) is a function of its claim and its
    node's GPUs: where they read as the last tick's did (dcgm-exporter's values change every 30 s), the last tick's
    join stands; a GPU that reads otherwise has its node's targets joined again (issue 50, item 5)."""
    found: list[object] = []
    real = join_module.target_gpus

    def counted(*args: object) -> list:
        found.append(args)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(join_module, "target_gpus", counted)
    monkeypatch.setattr(observe_module, "target_gpus", counted)
    gpus = [FakeGpu(i, used_bytes=(60 + i) * GIB) for i in range(4)]
    nvml = NvmlReader(NvmlSource(FakeNvml(gpus)), 3.0)
    # Each engine reserves its GPU (its gpu_memory_utilization): its GPU is judged on what its reservation leaves.
    targets = [TargetView(f"e{i}", (i,), None, "up", False, reservation=0.8) for i in range(4)]
    observer = TrendObserver(nvml, ProcessLookup(ProcessFinder(), [], SourceRuns()), lambda: targets,
                             TrendTracker(TrendSettings()))  # fmt: skip
    try:
        first = await observer.observe()
        assert len(found) >= 4  # every target joined on the first tick
        found.clear()
        again = await observer.observe()
        assert again == first
        assert found == []  # nothing read otherwise: no target's GPUs found again
        gpus[2].used_bytes = 70 * GIB
        changed = await observer.observe()
        assert sorted(args[0].configured for args in found) == [(0,), (1,), (2,), (3,)]  # its node's targets, once
        assert changed[TrendKey("gpu", "2", "gpu")] != first[TrendKey("gpu", "2", "gpu")]
        assert changed[TrendKey("target", "e2", "gpu")] == changed[TrendKey("gpu", "2", "gpu")]
        assert {k: v for k, v in changed.items() if "2" not in k.name} == {
            k: v for k, v in first.items() if "2" not in k.name
        }
    finally:
        nvml.close()
