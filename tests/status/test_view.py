"""The status view (status/view.py) from an exposition: the GPUs worst first, what holds now with the bundle's
thresholds, and `oomguard top --once`'s frame of it."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from oomguard.bundle.thresholds import default_thresholds
from oomguard.exporter.status import top
from oomguard.exporter.status.top import frame
from oomguard.exporter.status.view import MAX_GPUS, build, duration, parse

GIB = 1024**3
NOW = 1_800_000_000.0


def exposition(*gpus: tuple[str, float, float | None, float | None], oom_ago: float | None = None) -> str:
    """GPUs as (label, used share, headroom used or None, seconds to full or None), on one target `llm`."""
    lines = ['oomguard_target_info{target="llm",engine="vllm",url="http://10.0.0.1:8000"} 1',
             'oomguard_target_state{target="llm",state="up"} 1', 'oomguard_target_state{target="llm",state="down"} 0',
             'oomguard_engine_kv_cache_usage_ratio{target="llm",model_name="m"} 0.75',
             'oomguard_engine_requests_waiting{target="llm",model_name="m"} 12',
             'oomguard_source_success{source="nvml"} 1', 'oomguard_source_success{source="targets"} 0']  # fmt: skip
    for label, used, headroom, to_full in gpus:
        g = f'gpu="{label}",node=""'
        lines += [f"oomguard_gpu_memory_total_bytes{{{g}}} {80 * GIB}",
                  f"oomguard_gpu_memory_used_bytes{{{g}}} {used * 80 * GIB}",
                  f'oomguard_target_gpu_info{{target="llm",{g}}} 1',
                  f'oomguard_gpu_memory_trend_state{{{g},state="climbing"}} {1 if to_full else 0}']  # fmt: skip
        if headroom is not None:
            lines += [f"oomguard_gpu_memory_engine_reserved_bytes{{{g}}} {0.9 * 80 * GIB}",
                      f"oomguard_gpu_memory_headroom_used_ratio{{{g}}} {headroom}"]  # fmt: skip
        if to_full is not None:
            lines.append(f"oomguard_gpu_memory_seconds_to_full{{{g}}} {to_full}")
    if oom_ago is not None:
        oom = '{target="llm",kind="cuda_oom"}'
        lines += [
            f"oomguard_target_events_total{oom} 1",
            f"oomguard_target_last_event_timestamp_seconds{oom} {NOW - oom_ago}",
        ]
    return "\n".join(lines) + "\n"


def test_the_worst_gpu_first_and_a_page_where_the_rules_page() -> None:
    th = default_thresholds()
    view = build(
        parse(exposition(("0", 0.5, None, None), ("1", 0.93, th.headroom_critical + 0.01, None))),
        now=NOW,
        thresholds=default_thresholds(),
    )
    assert [g.gpu for g in view.gpus] == ["1", "0"]
    (held,) = view.holding
    assert (held.alert, held.severity, held.subject) == ("OomGuardGpuMemoryCritical", "critical", "GPU 1")
    assert view.targets[0].state == "up" and view.targets[0].kv_cache == 0.75 and view.targets[0].waiting == 12
    assert view.gpus[0].targets == ["llm"]
    assert view.sources == {"nvml": True, "targets": False}
    # At the threshold the rule (">") does not page yet; nor does the view.
    quiet = build(parse(exposition(("1", 0.93, th.headroom_critical, None))), now=NOW, thresholds=default_thresholds())
    assert quiet.holding == []


def test_without_a_reservation_used_over_total_is_judged() -> None:
    th = default_thresholds()
    view = build(
        parse(exposition(("0", th.used_critical + 0.005, None, None))), now=NOW, thresholds=default_thresholds()
    )
    assert [h.alert for h in view.holding] == ["OomGuardGpuMemoryCritical"]
    assert "no reservation known" in view.holding[0].why


def test_time_to_full_and_a_recent_oom_hold_an_old_one_does_not() -> None:
    th = default_thresholds()
    view = build(
        parse(exposition(("0", 0.9, 0.2, th.exhausted_soon_seconds - 1), oom_ago=30.0)),
        now=NOW,
        thresholds=default_thresholds(),
    )
    assert {h.alert for h in view.holding} == {"OomGuardGpuMemoryExhaustedSoon", "OomGuardOomEvent"}
    old = build(
        parse(exposition(("0", 0.9, 0.2, None), oom_ago=th.oom_window_seconds + 60)),
        now=NOW,
        thresholds=default_thresholds(),
    )
    assert old.holding == [] and old.targets[0].last_oom_kind == "cuda_oom"


def test_a_clusters_thousands_of_gpus_are_cut_to_the_fullest() -> None:
    gpus = [(str(i), i / 200, None, None) for i in range(150)]
    view = build(parse(exposition(*gpus)), now=NOW, thresholds=default_thresholds())
    assert len(view.gpus) == MAX_GPUS and view.hidden_gpus == 150 - MAX_GPUS
    assert view.gpus[0].gpu == "149"


def test_nan_and_absent_figures_are_no_figures() -> None:
    view = build(
        parse('oomguard_gpu_memory_total_bytes{gpu="0",node=""} NaN\n'), now=NOW, thresholds=default_thresholds()
    )
    assert view.gpus == [] and view.holding == []


def test_a_climbing_gpu_at_the_top_is_exhausted_soons_as_the_rules_judge() -> None:
    """GpuMemoryCritical pages on a GPU the trend gives no time to full; one that climbs is GpuMemoryExhaustedSoon's,
    on its headroom, or on its total once exhausted_soon.min_total_ratio of it is used."""
    th = default_thresholds()
    soon = th.exhausted_soon_seconds - 60
    top = build(
        parse(exposition(("0", 0.99, th.headroom_critical + 0.05, soon))), now=NOW, thresholds=default_thresholds()
    )
    assert [h.alert for h in top.holding] == ["OomGuardGpuMemoryExhaustedSoon"]
    later = build(
        parse(exposition(("0", 0.99, th.headroom_critical + 0.05, th.exhausted_soon_seconds + 60))),
        now=NOW,
        thresholds=default_thresholds(),
    )
    assert later.holding == []  # climbing, full later than the hour: GpuMemoryClimbing's ticket, not a page
    low = build(
        parse(exposition(("0", th.exhausted_soon_min_total - 0.01, None, soon))),
        now=NOW,
        thresholds=default_thresholds(),
    )
    assert low.holding == []
    high = build(
        parse(exposition(("0", th.exhausted_soon_min_total, None, soon))), now=NOW, thresholds=default_thresholds()
    )
    assert [h.alert for h in high.holding] == ["OomGuardGpuMemoryExhaustedSoon"]


def test_top_once_frame_shows_the_bar_the_trend_and_what_holds() -> None:
    th = default_thresholds()
    view = build(
        parse(exposition(("0", 0.95, th.headroom_critical + 0.1, 42.0), ("1", 0.95, th.headroom_critical + 0.1, None))),
        now=NOW,
        history={("", "0"): [0.9, 0.95]},
        thresholds=th,
    )
    text = frame(view.to_json(), width=150)
    assert "PAGE   OomGuardGpuMemoryExhaustedSoon" in text and "climbing" in text and "42s" in text
    assert "PAGE   OomGuardGpuMemoryCritical" in text
    assert "[RRRR" in text and "#" in text, text
    assert all(len(line) <= 150 for line in text.splitlines())
    assert "sources: FAILING: targets" in text


@pytest.mark.parametrize("bad", ["nope", "oomguard_x{", 'oomguard_gpu_memory_used_bytes{gpu="0"} one\n'])
def test_text_that_is_not_an_exposition_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse(bad)


def test_families_the_view_does_not_read_are_passed_over() -> None:
    """A cluster's exposition is megabytes: only the families the view reads are parsed (others, even broken, cost
    a line split)."""
    text = exposition(("0", 0.5, None, None)) + '# TYPE other_total counter\nother_total{x="1"} not-a-number\n'
    assert [g.gpu for g in build(parse(text), now=NOW, thresholds=default_thresholds()).gpus] == ["0"]


def test_on_a_drills_clock_the_pages_judge_as_its_rules_do() -> None:
    """Thresholds of a bundle 30 times faster (a drill's): the rules compare the measured time to full (real
    seconds) with the threshold turned into real seconds, and count an OOM within its window turned so; the view
    judges alike."""
    th = dataclasses.replace(default_thresholds(), time_scale=30.0)
    rule_soon = th.exhausted_soon_seconds / 30  # GpuMemoryExhaustedSoon's `scaled(exhausted_soon.seconds)`
    rule_oom_window = th.oom_window_seconds / 30
    soon = build(parse(exposition(("0", 0.9, 0.2, rule_soon - 1))), now=NOW, thresholds=th)
    assert [h.alert for h in soon.holding] == ["OomGuardGpuMemoryExhaustedSoon"]
    assert soon.holding[0].why.endswith(f"(pages under {duration(rule_soon)})")  # 45 simulated minutes: 90 real s
    later = build(parse(exposition(("0", 0.9, 0.2, rule_soon + 1))), now=NOW, thresholds=th)
    assert later.holding == []  # 91 real seconds, 45.5 simulated minutes (against an unscaled 45 minutes: a page)
    recent = build(parse(exposition(("0", 0.5, None, None), oom_ago=rule_oom_window - 1)), now=NOW, thresholds=th)
    assert [h.alert for h in recent.holding] == ["OomGuardOomEvent"]
    old = build(parse(exposition(("0", 0.5, None, None), oom_ago=rule_oom_window + 1)), now=NOW, thresholds=th)
    assert old.holding == []


def test_a_used_figure_above_the_total_reads_as_full() -> None:
    view = build(parse(exposition(("0", 1.125, None, None))), now=NOW, thresholds=default_thresholds())
    assert view.gpus[0].used_ratio == 1.0 and view.gpus[0].used_bytes == 1.125 * 80 * GIB
    assert view.holding[0].why.startswith("100.0% of the GPU used")


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x85", "\r", "\x0c", "\x0b", "\x1c", "\x1d", "\x1e"])
def test_a_label_value_is_split_at_line_feeds_only(char: str) -> None:
    """The text format ends a line at a line feed alone; a label value may hold any other character raw (an engine's,
    or an older exporter's), which `str.splitlines()` would end a line at."""
    text = exposition(("0", 0.5, None, None)).replace('model_name="m"', f'model_name="m{char}m"')
    samples = parse(text)
    assert ("oomguard_engine_requests_waiting", {"target": "llm", "model_name": f"m{char}m"}, 12.0) in samples
    assert build(samples, now=NOW, thresholds=default_thresholds()).targets[0].waiting == 12


@pytest.mark.parametrize("url", ["http://[::1", "http://a b", "http://:9847", "http://127.0.0.1:99999"])
def test_top_says_an_unusable_address_in_one_line(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    top.add_arguments(parser)
    assert top.main(parser.parse_args([url, "--once"])) == 2
    err = capsys.readouterr().err
    assert "is not a usable address" in err and len(err.strip().splitlines()) == 1, err
