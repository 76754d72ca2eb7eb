"""`oomguard diagnose --exporter` agrees with the shipped pages: through every drill scenario's timeline,
one reading of the exporter is never HEALTHY while one of the shipped critical alerts' conditions holds, and it names
the memory pages that hold, as the rules do.

Each scenario runs as `oomguard serve --simulate` runs it, on a virtual clock (virtual_exporter.py), at life's pace
and at `make run`'s 10 times faster (SCALES): the exporter's own code reads the engine's simulator and the fake NVML,
and its exposition is taken every SCRAPE simulated seconds, as Prometheus would scrape it. Every exposition is
diagnosed as `diagnose --exporter` diagnoses one reading, on the bundle configuration of the drill's scenario at
that time scale (`--bundle-config`), and again without the exporter's trend (`untrended`): what a reading says while
the trend is still `unknown` (its first minutes, or a series started afresh), judged on the present figures alone.
The pages' conditions are the shipped rules' own: every critical alert of the bundle rendered from the same
configuration, its expression (without its `for:`) evaluated by a real Prometheus over what was scraped (backfilled
with promtool), at each scrape's time. The same Prometheus holds the history `diagnose --prometheus` reads: over each
whole timeline it reaches the verdict the drill requires of the scenario, on the same thresholds.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from oomguard.bundle.bundle_config import load_bundle_config
from oomguard.bundle.generate import ALERTS_FILE, render
from oomguard.bundle.thresholds import load_thresholds
from oomguard.diagnose.core import Diagnosis, diagnose_data, diagnose_prometheus
from oomguard.diagnose.query import METRICS, exporter_data
from oomguard.drill.scenarios import SCENARIOS, DrillScenario
from oomguard.drill.services import Prometheus
from tests.diagnose.virtual_exporter import VirtualRun, patch

SCRAPE = 15  # simulated seconds between two readings: Prometheus' scrape interval at life's pace
SCALES = (1.0, 10.0)  # life's pace, and `make run`'s (what a newcomer watches first)
INSTANCE = "127.0.0.1:9847"  # the exporter, as diagnose --exporter names it
MEMORY_PAGES = {"OomGuardGpuMemoryCritical", "OomGuardTargetMemoryOverBudget", "OomGuardGpuMemoryExhaustedSoon"}
# The page that stands on the trend's time to full: without the trend, no reading can judge it.
TREND_PAGES = {"OomGuardGpuMemoryExhaustedSoon"}
TREND_SERIES = ("oomguard_gpu_memory_trend_state", "oomguard_target_memory_trend_state",
                "oomguard_gpu_memory_seconds_to_full")  # fmt: skip


@dataclass
class Reading:
    at: float  # Unix seconds (the virtual clock's)
    seconds: float  # simulated seconds from the first launch
    text: str  # the exposition
    diagnosis: Diagnosis
    untrended: Diagnosis  # the same reading without the exporter's trend series: its state unknown, no time to full


@dataclass
class Timeline:
    scenario: DrillScenario
    scale: float
    readings: list[Reading] = field(default_factory=list)
    deaths: list[float] = field(default_factory=list)  # simulated seconds of each life's end of its own (an OOM)


def key(name: str, scale: float) -> str:
    """A timeline's name, and its Prometheus instance: the scenario at its time scale."""
    return f"{name}@{scale:g}x"


TIMELINES = [key(name, scale) for scale in SCALES for name in SCENARIOS]


def bundle_file(workdir: Path, scenario: DrillScenario, scale: float) -> Path:
    """The drill scenario's bundle configuration on a clock `scale` times faster, as the drill writes it."""
    path = workdir / f"{scenario.name}-x{scale:g}-bundle.yaml"
    path.write_text(yaml.safe_dump({**scenario.bundle, "time_scale": scale}))
    return path


# A selector of an instant vector (not a range's), with its offset: where the NaN that ends a series (openmetrics())
# must make it absent, as a scraping Prometheus's staleness marker does, also for `unless` and `and`.
INSTANT_SELECTOR = re.compile(r"(oomguard_\w+\{[^}]*\}(?: offset \w+)?)(?!\[)")
# GpuMemoryCritical's "not falling" over 10 minutes: one reading cannot judge it (see below).
NOT_FALLING = re.compile(r"\s*unless on\([^)]*\) deriv\([^\n]*\) < 0")
CRITICAL = "OomGuardGpuMemoryCritical"
CRITICAL_AT_ITS_LEVEL = CRITICAL + " (falling or not)"


def critical_rules(bundle: Path) -> dict[str, str]:
    """Every critical alert of the bundle rendered from `bundle`: name -> expression, each selector's NaN absent;
    and GpuMemoryCritical without its "not falling" (CRITICAL_AT_ITS_LEVEL)."""
    rules = yaml.safe_load(render(load_bundle_config(bundle))[ALERTS_FILE])
    out = {
        rule["alert"]: INSTANT_SELECTOR.sub(r"(\1 == \1)", rule["expr"])
        for group in rules["groups"]
        for rule in group["rules"]
        if rule.get("labels", {}).get("severity") == "critical"
    }
    level = NOT_FALLING.sub("", out[CRITICAL])
    assert level != out[CRITICAL], f"GpuMemoryCritical's expression has no deriv(...) < 0: {out[CRITICAL]}"
    out[CRITICAL_AT_ITS_LEVEL] = level
    return out


async def run_timeline(scenario: DrillScenario, workdir: Path, base: float, scale: float) -> Timeline:
    """The scenario from its first launch to its end, read every SCRAPE simulated seconds, each reading diagnosed
    (with `--bundle-config`: the scenario's at `scale`, whose time_scale is diagnose's clock)."""
    run = VirtualRun(scenario.simulation, scenario.engine, workdir, base, time_scale=scale)
    thresholds = load_thresholds(bundle_file(workdir, scenario, scale))
    out = Timeline(scenario, scale)
    end = int(scenario.minutes * 60)
    with pytest.MonkeyPatch.context() as monkeypatch:
        patch(monkeypatch, run)
        await run.start()
        # The trend's sample interval in whole simulated seconds (2 by default, on the simulation's clock too).
        trend_every = max(1, round(run.tracker.settings.interval_seconds * scale))
        try:
            for second in range(end + 1):
                scrape = second % SCRAPE == 0 and second > 0
                if second % trend_every and not scrape:
                    continue
                await run.advance(second / scale)
                run.poll_events()
                if second % trend_every == 0:
                    await run.sample_trend()
                if scrape:
                    text = await run.exposition()
                    data = exporter_data(text, instance=INSTANCE, now=run.clock.wall())
                    (diagnosis,) = diagnose_data(data, thresholds=thresholds)
                    data.series = [s for s in data.series if s.name not in TREND_SERIES]
                    (untrended,) = diagnose_data(data, thresholds=thresholds)
                    out.readings.append(Reading(run.clock.wall(), float(second), text, diagnosis, untrended))
        finally:
            await run.stop()
    out.deaths = run.deaths
    return out


def openmetrics(timelines: dict[str, Timeline], names: set[str]) -> str:
    """What a Prometheus scraping each exporter would hold of the series the rules read (instance: the timeline's
    name), `up` among them. A series gone from one reading to the next gets a NaN there: no comparison holds on it,
    as none would on the stale series a scraping Prometheus marks it with."""
    by_series: dict[str, list[str]] = {}
    wanted = tuple(sorted(names))
    for name, timeline in timelines.items():
        base = {"instance": name, "job": "oomguard"}
        last: set[str] = set()
        for reading in timeline.readings:
            seen = {}
            # Only the lines of the series the rules read: parsed whole, each exposition would cost more than its run.
            text = "\n".join(line for line in reading.text.splitlines() if line.startswith(wanted))
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name in names:
                        labels = ",".join(f'{k}="{v}"' for k, v in sorted((base | sample.labels).items()))
                        seen[f"{sample.name}{{{labels}}}"] = sample.value
            seen[f'up{{instance="{name}",job="oomguard"}}'] = 1.0
            for series in last - set(seen):
                by_series.setdefault(series, []).append(f"{series} NaN {reading.at:.3f}")
            for series, value in seen.items():
                by_series.setdefault(series, []).append(f"{series} {value!r} {reading.at:.3f}")
            last = set(seen)
    # OpenMetrics: a series' samples together, in time order.
    return "\n".join(line for series in sorted(by_series) for line in by_series[series]) + "\n# EOF\n"


def query_range(url: str, expr: str, start: float, end: float, step: float) -> set[tuple[str, float]]:
    """(instance, time) of every evaluation where `expr` has a result."""
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{params}", timeout=60) as response:
        answer = json.loads(response.read())
    assert answer["status"] == "success", answer
    return {(r["metric"].get("instance", ""), round(float(t), 1)) for r in answer["data"]["result"]
            for t, _ in r["values"]}  # fmt: skip


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory, promtool: str) -> Iterator[tuple[dict, dict, dict]]:
    """Every drill scenario's timeline at each time scale, where each critical rule held ({alert: {(timeline,
    time)}}), and each timeline's diagnosis over its whole history."""
    work = tmp_path_factory.mktemp("agrees-with-pages")
    # Hours in the past: a Prometheus loads blocks that old at once.
    base = float(int(time.time() - 6 * 3600))
    started = time.monotonic()
    timelines = {key(name, scale): asyncio.run(run_timeline(scenario, work, base, scale))
                 for scale in SCALES for name, scenario in SCENARIOS.items()}  # fmt: skip
    print(f"\n{len(timelines)} timelines read and diagnosed in {time.monotonic() - started:.1f}s")
    # The critical rules differ by scale only in their durations (the bundle's time_scale), not in what they read.
    rules = {scale: critical_rules(bundle_file(work, next(iter(SCENARIOS.values())), scale)) for scale in SCALES}
    names = {
        n for by_alert in rules.values() for expr in by_alert.values() for n in re.findall(r"\boomguard_\w+", expr)
    }
    source = work / "scraped.om"
    source.write_text(openmetrics(timelines, names | set(METRICS)))
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(work / "data")],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    prometheus = Prometheus(work, ["127.0.0.1:9"], scrape_interval="1h", evaluation_interval="1h")
    prometheus.start()
    held: dict[str, set[tuple[str, float]]] = {}
    histories: dict[str, Diagnosis] = {}
    try:
        end = base + max(s.minutes for s in SCENARIOS.values()) * 60
        for scale, by_alert in rules.items():
            for alert, expr in by_alert.items():
                # Each scale's timelines, judged by the rules rendered for it, at each of its readings' times.
                found = query_range(prometheus.url, expr, base + SCRAPE / scale, end, SCRAPE / scale)
                held.setdefault(alert, set()).update(w for w in found if w[0].endswith(f"@{scale:g}x"))
        for name, timeline in timelines.items():
            thresholds = load_thresholds(bundle_file(work, timeline.scenario, timeline.scale))
            end = timeline.readings[-1].at
            (histories[name],) = diagnose_prometheus(prometheus.url, at=end, window=end - base + 1, instance=name,
                                                     probe_delay=thresholds.probe_delay_seconds,
                                                     thresholds=thresholds)  # fmt: skip
    finally:
        prometheus.stop()
    print(f"the rules judged in {time.monotonic() - started:.1f}s in all")
    yield timelines, held, histories


def holding(held: dict, timeline: str, at: float, level: bool = False) -> set[str]:
    """The critical rules that hold; with `level`, CRITICAL_AT_ITS_LEVEL too where it does."""
    return {alert for alert, where in held.items() if (timeline, round(at, 1)) in where
            and (level or alert != CRITICAL_AT_ITS_LEVEL)}  # fmt: skip


def test_the_rules_page_in_the_scenarios_that_run_out(judged) -> None:
    """The judge is awake: the incident's memory pages hold before its OOM, and a healthy scenario's never."""
    timelines, held, _ = judged
    for scale in SCALES:
        incident = timelines[key("incident", scale)]
        before = [r for r in incident.readings if r.seconds < incident.deaths[0]]
        assert any(holding(held, key("incident", scale), r.at) & MEMORY_PAGES for r in before)
        for name in ("hot-steady", "default-steady", "tight-steady", "long-warmup", "long-loading"):
            timeline = key(name, scale)
            assert not any(holding(held, timeline, r.at) for r in timelines[timeline].readings), timeline


@pytest.mark.parametrize("name", TIMELINES)
def test_never_healthy_while_a_page_holds(judged, name: str) -> None:
    """Neither as read, nor without the trend (state unknown) for the pages that do not stand on it."""
    timelines, held, _ = judged
    wrong = []
    for r in timelines[name].readings:
        pages = holding(held, name, r.at)
        when = f"T+{r.seconds / 60:.2f} min"
        if pages and r.diagnosis.verdict == "healthy":
            wrong.append(f"{when}: HEALTHY ({r.diagnosis.summary}) while {sorted(pages)} hold")
        if pages - TREND_PAGES and r.untrended.verdict == "healthy":
            wrong.append(f"{when}, trend unknown: HEALTHY ({r.untrended.summary}) while {sorted(pages)} hold")
    assert not wrong, "\n".join(wrong[:10])


@pytest.mark.parametrize("name", TIMELINES)
def test_it_names_the_memory_pages_the_rules_page_on(judged, name: str) -> None:
    """The memory pages diagnose says hold now are those whose conditions the rules find, no more, no fewer; a
    memory verdict names them in its summary, and GpuMemoryCritical's is memory at the top."""
    timelines, held, _ = judged
    wrong = []
    for r in timelines[name].readings:
        holds = holding(held, name, r.at, level=True)
        rules = holds & MEMORY_PAGES
        facts = r.diagnosis.facts
        assert facts is not None
        said = {page.name for page, _ in facts.memory_paging}
        when = f"T+{r.seconds / 60:.2f} min"
        # GpuMemoryCritical holds only where memory did not fall over the last 10 minutes, which one reading cannot
        # see: diagnose says it where its level holds, and must where the rule holds.
        if CRITICAL in said and CRITICAL_AT_ITS_LEVEL in holds:
            rules.add(CRITICAL)
        if said != rules:
            wrong.append(f"{when}: diagnose says {sorted(said)}, the rules {sorted(rules)}")
        elif r.diagnosis.verdict.startswith("memory_") or r.diagnosis.verdict == "foreign_process":
            missing = [page for page in rules if page not in r.diagnosis.summary]
            if missing:
                wrong.append(f"{when}: {r.diagnosis.summary!r} does not name {missing}")
        if "OomGuardGpuMemoryCritical" in rules and not facts.memory_top:
            wrong.append(f"{when}: GpuMemoryCritical holds, and diagnose's memory is not at the top")
    assert not wrong, "\n".join(wrong[:10])


@pytest.mark.parametrize("name", TIMELINES)
def test_the_history_reaches_the_drills_verdict(judged, name: str) -> None:
    """`diagnose --prometheus` over the whole timeline, on the same thresholds: the verdict the drill requires."""
    timelines, _, histories = judged
    d = histories[name]
    assert d.verdict == timelines[name].scenario.verdict, d.summary
