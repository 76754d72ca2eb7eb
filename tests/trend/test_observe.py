"""One tick of the sampler (trend/observe.py): what it observes, and vLLM's sleep mode.

A sleeping engine has released its memory: its own series are not sampled while it sleeps,
and when it wakes its series and its GPUs' start afresh, so the jump back is not a spike.
"""

from __future__ import annotations

from dataclasses import replace

from oomguard.exporter.model import Observation, TargetView, TrendKey
from oomguard.exporter.sources.nvml import NvmlSource
from oomguard.exporter.sources.nvml_reader import NvmlReader
from oomguard.exporter.sources.process_lookup import ProcessLookup
from oomguard.exporter.sources.processes import ProcessFinder
from oomguard.exporter.sources.source_runs import SourceRuns
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
