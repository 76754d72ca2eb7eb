"""The status view (status/view.py) from a collection's snapshot: the GPUs worst first, what holds now with the bundle's
thresholds, and `oomguard top --once`'s frame of it."""

from __future__ import annotations

import argparse
import dataclasses
import math

import pytest

from oomguard.bundle.thresholds import default_thresholds
from oomguard.common.time_scale import TimeScale
from oomguard.common.visible import visible
from oomguard.exporter.model import (
    Counts,
    EngineReading,
    GpuMemory,
    GpuReading,
    GpuReadings,
    ModelReading,
    Snapshot,
    SourceResult,
    TargetMemory,
    TargetReading,
    Trend,
    TrendKey,
    TrendReading,
)
from oomguard.exporter.status import top
from oomguard.exporter.status.top import frame
from oomguard.exporter.status.view import MAX_GPUS, build, duration
from tests.status.view_fixtures import GIB, NOW


def snapshot(*gpus: tuple[str, float, float | None, float | None], oom_ago: float | None = None) -> Snapshot:
    """GPUs as (label, used share, headroom used or None, seconds to full or None), on one target `llm`: a
    reservation of 90 % where a headroom is given, climbing where a time to full is."""
    llm = TargetReading(
        "llm",
        "vllm",
        "http://10.0.0.1:8000",
        (),
        True,
        "up",
        0.01,
        engine_reading=EngineReading(models=(ModelReading("m", kv_cache_usage_ratio=0.75, requests_waiting=12),)),
    )
    total, reserved = 80 * GIB, 0.9 * 80 * GIB
    gpu_memory, trends = {}, {}
    for label, used, headroom, to_full in gpus:
        if headroom is not None:
            unreserved = headroom * (total - reserved)
            gpu_memory[("", label)] = GpuMemory(
                ("", label), total, used * total, reserved, None, None, None, unreserved, headroom
            )
        if to_full is not None:
            climbing = Trend("climbing", used, 0.001, 0.001, 600.0, to_full)
            trends[TrendKey.of_gpu(("", label))] = TrendReading(climbing, total)
    readings = tuple(GpuReading(int(g[0]), True, total_bytes=total, used_bytes=g[1] * total) for g in gpus)
    return Snapshot(
        gpus=GpuReadings(True, gpus=readings),
        targets=(llm,),
        sources={"nvml": SourceResult(True, 0.01), "targets": SourceResult(False, 0.01)},
        collected_at=NOW,
        memory={"llm": TargetMemory(tuple(("", g[0]) for g in gpus), None, None, None, None, None)},
        gpu_memory=gpu_memory,
        trends=trends,
        trend_samples_total=1,
        events={"llm": Counts({"cuda_oom": 1}, {"cuda_oom": NOW - oom_ago})} if oom_ago is not None else {},
    )


def test_the_worst_gpu_first_and_a_page_where_the_rules_page() -> None:
    th = default_thresholds()
    view = build(
        snapshot(("0", 0.5, None, None), ("1", 0.93, th.headroom_critical + 0.01, None)),
        thresholds=default_thresholds(),
    )
    assert [g.gpu for g in view.gpus] == ["1", "0"]
    (held,) = view.holding
    assert (held.alert, held.severity, held.subject) == ("OomGuardGpuMemoryCritical", "critical", "GPU 1")
    assert view.targets[0].state == "up" and view.targets[0].kv_cache == 0.75 and view.targets[0].waiting == 12
    assert view.gpus[0].targets == ["llm"]
    assert view.sources == {"nvml": True, "targets": False}
    # At the threshold the rule (">") does not page yet; nor does the view.
    quiet = build(snapshot(("1", 0.93, th.headroom_critical, None)), thresholds=default_thresholds())
    assert quiet.holding == []


def test_without_a_reservation_used_over_total_is_judged() -> None:
    th = default_thresholds()
    view = build(snapshot(("0", th.used_critical + 0.005, None, None)), thresholds=default_thresholds())
    assert [h.alert for h in view.holding] == ["OomGuardGpuMemoryCritical"]
    assert "no reservation known" in view.holding[0].why


def test_time_to_full_and_a_recent_oom_hold_an_old_one_does_not() -> None:
    th = default_thresholds()
    view = build(
        snapshot(("0", 0.9, 0.2, th.exhausted_soon_seconds - 1), oom_ago=30.0),
        thresholds=default_thresholds(),
    )
    assert {h.alert for h in view.holding} == {"OomGuardGpuMemoryExhaustedSoon", "OomGuardOomEvent"}
    old = build(
        snapshot(("0", 0.9, 0.2, None), oom_ago=th.oom_window_seconds + 60),
        thresholds=default_thresholds(),
    )
    assert old.holding == [] and old.targets[0].last_oom_kind == "cuda_oom"


def test_a_clusters_thousands_of_gpus_are_cut_to_the_fullest() -> None:
    gpus = [(str(i), i / 200, None, None) for i in range(150)]
    view = build(snapshot(*gpus), thresholds=default_thresholds())
    assert len(view.gpus) == MAX_GPUS and view.hidden_gpus == 150 - MAX_GPUS
    assert view.gpus[0].gpu == "149"


def test_nan_and_absent_figures_are_no_figures() -> None:
    nan = GpuReadings(True, gpus=(GpuReading(0, True, total_bytes=math.nan),))
    view = build(Snapshot(nan, (), {"nvml": SourceResult(True, 0.01)}, NOW), thresholds=default_thresholds())
    assert view.gpus == [] and view.holding == []


def test_a_climbing_gpu_at_the_top_is_exhausted_soons_as_the_rules_judge() -> None:
    """GpuMemoryCritical pages on a GPU the trend gives no time to full; one that climbs is GpuMemoryExhaustedSoon's,
    on its headroom, or on its total once exhausted_soon.min_total_ratio of it is used."""
    th = default_thresholds()
    soon = th.exhausted_soon_seconds - 60
    top = build(snapshot(("0", 0.99, th.headroom_critical + 0.05, soon)), thresholds=default_thresholds())
    assert [h.alert for h in top.holding] == ["OomGuardGpuMemoryExhaustedSoon"]
    later = build(
        snapshot(("0", 0.99, th.headroom_critical + 0.05, th.exhausted_soon_seconds + 60)),
        thresholds=default_thresholds(),
    )
    assert later.holding == []  # climbing, full later than the hour: GpuMemoryClimbing's ticket, not a page
    low = build(
        snapshot(("0", th.exhausted_soon_min_total - 0.01, None, soon)),
        thresholds=default_thresholds(),
    )
    assert low.holding == []
    high = build(snapshot(("0", th.exhausted_soon_min_total, None, soon)), thresholds=default_thresholds())
    assert [h.alert for h in high.holding] == ["OomGuardGpuMemoryExhaustedSoon"]


def test_top_once_frame_shows_the_bar_the_trend_and_what_holds() -> None:
    th = default_thresholds()
    view = build(
        snapshot(("0", 0.95, th.headroom_critical + 0.1, 42.0), ("1", 0.95, th.headroom_critical + 0.1, None)),
        history={("", "0"): [0.9, 0.95]},
        thresholds=th,
    )
    text = frame(view.to_json(), width=150)
    assert "PAGE   OomGuardGpuMemoryExhaustedSoon" in text and "climbing" in text and "42s" in text
    assert "PAGE   OomGuardGpuMemoryCritical" in text
    assert "[RRRR" in text and "#" in text, text
    assert all(len(line) <= 150 for line in text.splitlines())
    assert "sources: FAILING: targets" in text


def test_on_a_drills_clock_the_pages_judge_as_its_rules_do() -> None:
    """Thresholds of a bundle 30 times faster (a drill's): the rules compare the measured time to full (real
    seconds) with the threshold turned into real seconds, and count an OOM within its window turned so; the view
    judges alike."""
    th = dataclasses.replace(default_thresholds(), time_scale=30.0)
    rule_soon = th.exhausted_soon_seconds / 30  # GpuMemoryExhaustedSoon's `scaled(exhausted_soon.seconds)`
    rule_oom_window = th.oom_window_seconds / 30
    soon = build(snapshot(("0", 0.9, 0.2, rule_soon - 1)), thresholds=th)
    assert [h.alert for h in soon.holding] == ["OomGuardGpuMemoryExhaustedSoon"]
    assert soon.holding[0].why.endswith(f"(pages under {duration(rule_soon)})")  # 45 simulated minutes: 90 real s
    later = build(snapshot(("0", 0.9, 0.2, rule_soon + 1)), thresholds=th)
    assert later.holding == []  # 91 real seconds, 45.5 simulated minutes (against an unscaled 45 minutes: a page)
    recent = build(snapshot(("0", 0.5, None, None), oom_ago=rule_oom_window - 1), thresholds=th)
    assert [h.alert for h in recent.holding] == ["OomGuardOomEvent"]
    old = build(snapshot(("0", 0.5, None, None), oom_ago=rule_oom_window + 1), thresholds=th)
    assert old.holding == []


def test_a_used_figure_above_the_total_reads_as_full() -> None:
    view = build(snapshot(("0", 1.125, None, None)), thresholds=default_thresholds())
    assert view.gpus[0].used_ratio == 1.0 and view.gpus[0].used_bytes == 1.125 * 80 * GIB
    assert view.holding[0].why.startswith("100.0% of the GPU used")


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x85", "\r", "\x0c", "\x0b", "\x1c", "\x1d", "\x1e"])
def test_a_name_reaches_the_view_as_metrics_writes_it(char: str) -> None:
    """A name may hold any character (an engine's model, a pod's): the view has it as /metrics writes it, the
    characters that end a line for `str.splitlines()` or drive a terminal as visible escapes, and a served model's
    name changes none of its figures."""
    held = snapshot(("0", 0.5, None, None))
    (llm,) = held.targets
    model = dataclasses.replace(llm.engine_reading.models[0], model_name=f"m{char}m")
    named = dataclasses.replace(llm, name=f"llm{char}", engine_reading=EngineReading(models=(model,)))
    view = build(
        dataclasses.replace(held, targets=(named,), memory={named.name: held.memory["llm"]}),
        thresholds=default_thresholds(),
    )
    assert view.targets[0].name == f"llm{visible(char)}" and view.targets[0].waiting == 12
    assert view.gpus[0].targets == [f"llm{visible(char)}"]


@pytest.mark.parametrize("url", ["http://[::1", "http://a b", "http://:9847", "http://127.0.0.1:99999"])
def test_top_says_an_unusable_address_in_one_line(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    top.add_arguments(parser)
    assert top.main(parser.parse_args([url, "--once"])) == 2
    err = capsys.readouterr().err
    assert "is not a usable address" in err and len(err.strip().splitlines()) == 1, err


def test_serve_simulate_judges_its_pages_on_the_runtimes_clock() -> None:
    """`serve --simulate` at 10x: the runtime holds the bundle's thresholds (written on life's clock) and runs on the
    simulation's. The status page judges its pages on the runtime's clock, as its sparkline reads it (and as the
    drill's rules, rendered at 10x, judge them): a time to full of 300 real seconds is 50 simulated minutes, beyond
    ExhaustedSoon's 45; an OOM 100 real seconds ago is 1,000 simulated, beyond OomEvent's 10 minutes. On the real
    clock both held."""
    from oomguard.exporter.runtime import Runtime
    from oomguard.exporter.web import _view
    from oomguard.simulate.checks import load_config
    from oomguard.simulate.host import SimulatedHost

    config = load_config(None, {"simulation": {"scenario": "incident", "time_scale": 10}})
    runtime = Runtime(config, nvml_lib=None, simulated=SimulatedHost(config), thresholds=default_thresholds())
    assert runtime.clock == TimeScale(10) and runtime.thresholds.time_scale == 1
    quiet = _view(snapshot(("0", 0.9, 0.2, 300.0), oom_ago=100.0), runtime)
    assert quiet.holding == []
    held = _view(snapshot(("0", 0.9, 0.2, 260.0), oom_ago=50.0), runtime)  # 2,600 and 500 simulated seconds
    assert {h.alert for h in held.holding} == {"OomGuardGpuMemoryExhaustedSoon", "OomGuardOomEvent"}
    assert held.holding[0].why.endswith("(pages under 4m)")  # 45 simulated minutes: 270 real seconds, not 45m
