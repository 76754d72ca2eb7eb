"""An engine's load inferred where the history does not say its state (backtest/loading.py, docs/backtest.md, "A load
inferred"): a ramp of its GPU's memory from near empty is its load, until it serves or its memory settles."""

from __future__ import annotations

from collections.abc import Callable

from oomguard.backtest.history import EngineRow, GpuRow, Step
from oomguard.backtest.loading import LoadInference

T = 1_714_608_000.0
STEP = 15.0
LOOKBACK = 1.5 * STEP  # the replay's (run.LOOKBACK_STEPS steps)
TOTAL = 80e9


def step(t: float, shares: dict[str, float | None], **engines: EngineRow) -> Step:
    """One reading: each engine's GPU (its own, GPU i for the i-th) at its used share (None: no row); its engine row
    as given, else one with no figures and no state."""
    out = Step(t)
    for i, (target, share) in enumerate(shares.items()):
        if share is not None:
            out.gpus.append(GpuRow("n", str(i), used=share * TOTAL, total=TOTAL, targets=[target]))
        out.engines[target] = engines.get(target, EngineRow(target))
    return out


def ramp(minutes: float, start: float, end: float, over_minutes: float, at_minute: float) -> float:
    """A share: `start` until `at_minute`, then a straight climb to `end` over `over_minutes`, then `end`."""
    if minutes <= at_minute:
        return start
    return start + (end - start) * min(1.0, (minutes - at_minute) / over_minutes)


def loading_minutes(inference: LoadInference, steps: list[Step], target: str = "vllm") -> list[float]:
    """The minutes (from T) at which `target` was inferred loading; each step's result checked against its input."""
    out = []
    for s in steps:
        given = dict(s.engines)
        found = inference.infer(s, s.engines)
        assert s.engines == given  # the input is left as it was
        assert (found[target].state == "loading") == (target in inference.inferred)
        if target in inference.inferred:
            out.append((s.t - T) / 60)
    return out


def history(
    share: Callable[[float], float | None], minutes: float = 20.0, figures: Callable[[float], EngineRow] | None = None
) -> list[Step]:
    """Every STEP for `minutes`: `share(minute)` of engine vllm's GPU; `figures(minute)`: its engine row."""
    steps = []
    for i in range(int(minutes * 60 / STEP)):
        minute = i * STEP / 60
        row = figures(minute) if figures is not None else None
        steps.append(step(T + i * STEP, {"vllm": share(minute)}, **({"vllm": row} if row is not None else {})))
    return steps


def test_a_ramp_from_an_empty_gpu_is_a_load_until_its_memory_has_not_risen_for_3_minutes() -> None:
    """At 0.5 % until minute 5, then up to 90 % over 3 minutes: loading from the first reading above 5 % (5:15)
    until 3 minutes after the last rise (8:00, at 90 %): 5:15 to 10:45."""
    inference = LoadInference(LOOKBACK)
    found = loading_minutes(inference, history(lambda m: ramp(m, 0.005, 0.90, 3, 5)))
    assert found == [5 + 0.25 * i for i in range(1, 24)], found
    assert (inference.spells, inference.engines) == (1, {"vllm"})


def test_a_creep_of_less_than_1_percent_in_3_minutes_ends_the_load() -> None:
    """After the ramp the memory creeps up 0.2 % a minute: it has not risen by 1 % of the total for 3 minutes at
    11:00, and the load ended at 10:45 as without the creep."""
    inference = LoadInference(LOOKBACK)
    found = loading_minutes(inference, history(lambda m: ramp(m, 0.005, 0.80, 3, 5) + max(0.0, m - 8) * 0.002))
    assert found == [5 + 0.25 * i for i in range(1, 24)], found


def test_live_figures_end_the_load_first() -> None:
    """The engine's KV cache use (or its queue) from minute 8:30: it serves, its load is over then."""

    def figures(minute: float) -> EngineRow:
        # No reservation told (an engine that does not reserve, or a history without it): its figures end the load.
        return EngineRow("vllm", kv_cache_usage=0.1) if minute >= 8.5 else EngineRow("vllm")

    found = loading_minutes(LoadInference(LOOKBACK), history(lambda m: ramp(m, 0.005, 0.90, 3, 5), figures=figures))
    assert found == [5 + 0.25 * i for i in range(1, 14)], found  # 5:15 to 8:15

    def queue(minute: float) -> EngineRow:
        return EngineRow("vllm", waiting=0.0) if minute >= 7 else EngineRow("vllm")

    found = loading_minutes(LoadInference(LOOKBACK), history(lambda m: ramp(m, 0.005, 0.90, 3, 5), figures=queue))
    assert found[-1] == 6.75


def test_an_engine_serving_as_its_memory_comes_back_is_not_loading() -> None:
    inference = LoadInference(LOOKBACK)
    serving = history(lambda m: ramp(m, 0.005, 0.90, 3, 5), figures=lambda m: EngineRow("vllm", running=2.0))
    assert loading_minutes(inference, serving) == [] and inference.spells == 0


def test_an_engine_whose_history_starts_full_is_never_loading() -> None:
    inference = LoadInference(LOOKBACK)
    assert loading_minutes(inference, history(lambda m: 0.90 + 0.001 * m, minutes=30)) == []
    assert (inference.spells, inference.engines) == (0, set())


def test_a_gap_longer_than_the_lookback_then_a_ramp_is_a_load() -> None:
    """At 90 %, no reading from minute 5 to 10 (a new process, unseen), then at 20 % climbing to 90 % over 2
    minutes: a load, until 3 minutes after its last rise."""

    def share(minute: float) -> float | None:
        if minute < 5:
            return 0.90
        if minute < 10:
            return None
        return ramp(minute, 0.20, 0.90, 2, 10)

    inference = LoadInference(LOOKBACK)
    found = loading_minutes(inference, history(share))
    assert found == [10 + 0.25 * i for i in range(0, 20)], found  # 10:00 to 14:45
    assert inference.spells == 1


def test_readings_apart_by_less_than_the_lookback_are_no_gap() -> None:
    """A reading 20 s after the one before (the lookback is 22.5 s): the same process, no load."""
    steps = history(lambda m: 0.90)
    for s in steps[20:]:
        s.t += 5.0
    assert loading_minutes(LoadInference(LOOKBACK), steps) == []


def test_an_engine_whose_state_is_told_is_never_inferred() -> None:
    """A `state` column: up while its memory ramps is up (the history says so); an empty cell leaves it unsaid."""
    told = LoadInference(LOOKBACK)
    steps = history(lambda m: ramp(m, 0.005, 0.90, 3, 5), figures=lambda m: EngineRow("vllm", state="up"))
    assert loading_minutes(told, steps) == [] and told.spells == 0
    loading = history(lambda m: ramp(m, 0.005, 0.90, 3, 5), figures=lambda m: EngineRow("vllm", state="loading"))
    assert all(LoadInference(LOOKBACK).infer(s, s.engines)["vllm"].state == "loading" for s in loading)
    unsaid = LoadInference(LOOKBACK)
    assert loading_minutes(unsaid, history(lambda m: ramp(m, 0.005, 0.90, 3, 5), figures=lambda m: EngineRow("vllm")))
    assert unsaid.spells == 1


def test_spells_and_engines_count_each_load() -> None:
    """Engine a loads, dies (its GPU empty: an OOM) and loads again; b loads once; c never: 3 loads, 2 engines."""
    inference = LoadInference(LOOKBACK)

    def a(minute: float) -> float:
        if minute < 15:
            return ramp(minute, 0.005, 0.90, 3, 2)
        return ramp(minute, 0.005, 0.90, 3, 17)

    for i in range(int(30 * 60 / STEP)):
        minute = i * STEP / 60
        s = step(T + i * STEP, {"a": a(minute), "b": ramp(minute, 0.01, 0.5, 1, 20), "c": 0.9})
        inference.infer(s, s.engines)
        expected = {18: {"a"}, 21: {"a", "b"}, 23: {"b"}, 25: set()}.get(minute)
        assert expected is None or inference.inferred == expected, (minute, inference.inferred)
    assert (inference.spells, inference.engines) == (3, {"a", "b"})


def test_a_shared_gpu_is_loading_for_each_of_its_engines_whose_state_is_unsaid() -> None:
    """Two engines on one GPU (a row each): the GPU's share is each one's; the one that serves is not loading."""
    inference = LoadInference(LOOKBACK)
    for i in range(int(10 * 60 / STEP)):
        minute = i * STEP / 60
        used = ramp(minute, 0.005, 0.90, 2, 3) * TOTAL
        s = Step(T + i * STEP, [GpuRow("n", "0", used=used, total=TOTAL, targets=["a", "b"])])
        s.engines = {"a": EngineRow("a"), "b": EngineRow("b", kv_cache_usage=0.2)}
        inference.infer(s, s.engines)
        if minute == 4:
            assert inference.inferred == {"a"}
    assert inference.engines == {"a"}


def test_a_reservation_held_ends_the_load_and_what_rises_after_is_no_load() -> None:
    """Its reservation told (0.80, its command line's): the KV pool allocated at 8:00 ends the load, though its
    memory then rises 0.5 % a minute (a leak right after the start: the trend must see it, not a longer load)."""

    def figures(minute: float) -> EngineRow:
        return EngineRow("vllm", gpu_memory_utilization=0.8)

    found = loading_minutes(
        LoadInference(LOOKBACK),
        history(lambda m: ramp(m, 0.005, 0.80, 3, 5) + max(0.0, m - 8) * 0.005, figures=figures),
    )
    assert found and found[0] == 5.25 and found[-1] < 8.0, found
