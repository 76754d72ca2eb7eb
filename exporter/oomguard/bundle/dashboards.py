"""Grafana dashboards, generated from the bundle configuration (selector, thresholds, runbooks).

Two dashboards: the fleet, worst first, and one host or target with everything the
postmortem needed at T+0: memory against its limit and the engine's budget, the
trend, the KV cache and queue, OOMs and restarts as markers, startup against the
probe delay, and the health of the monitor itself.

Read it top down: the words a panel is written in (`Query`, `Graph`, `Stat`, `Table`, `Row`, `Selectors`), then
the dashboards, one function per row, each a list of panels with their fields named, then `DASHBOARDS`; what turns
them into Grafana's JSON (the grid, the variables, the annotations) comes last.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

from oomguard.bundle.bundle_config import BundleConfig, grouping
from oomguard.common.kinds import TARGET_OOM_KINDS, kind_matcher

SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
OOM_KINDS = kind_matcher(TARGET_OOM_KINDS)
PICKED_TARGET = 'target=~"$target"'
PICKED_GPU = ('node=~"$node"', 'gpu=~"$gpu"')


# -- the panels' vocabulary ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Query:
    """One query of a panel: its PromQL, its legend, its refId (by default A, B, C... by its place in the panel;
    in a table, the name of its column, `Value #<ref>`)."""

    expr: str
    _: KW_ONLY
    legend: str = ""
    ref: str | None = None


@dataclass(frozen=True, kw_only=True)
class Graph:
    """A time series panel. `size`: (width in the grid's 24 columns, height); panels fill the grid left to right."""

    title: str
    unit: str
    size: tuple[int, int]
    queries: Sequence[Query]
    description: str
    thresholds: dict[str, Any] | None = None  # drawn as lines
    thresholds_as_area: bool = False  # ... or as a shaded area above each step
    max: float | None = None  # with a min of 0
    bars: bool = False  # bars per interval, not lines
    overrides: Sequence[dict[str, Any]] = ()  # a style for some series (`_on_query`)
    repeat: str | None = None  # one panel per value of this variable, side by side, 4 a row

    def json(self) -> dict[str, Any]:
        defaults: dict[str, Any] = {"unit": self.unit, "custom": {"lineWidth": 1, "fillOpacity": 10,
                                                                   "showPoints": "never"}}  # fmt: skip
        if self.bars:  # a field's style: Grafana reads it there, not at the panel's top level
            defaults["custom"]["drawStyle"] = "bars"
        if self.thresholds is not None:
            defaults["thresholds"] = self.thresholds
            defaults["custom"]["thresholdsStyle"] = {"mode": "line+area" if self.thresholds_as_area else "line"}
        if self.max is not None:
            defaults["max"] = self.max
            defaults["min"] = 0
        repeat = {"repeat": self.repeat, "repeatDirection": "h", "maxPerRow": 4} if self.repeat else {}
        return {
            "type": "timeseries",
            "title": self.title,
            "description": self.description,
            "targets": _targets(self.queries),
            "fieldConfig": {"defaults": defaults, "overrides": list(self.overrides)},
            "options": {
                "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
                "tooltip": {"mode": "multi", "sort": "desc"},
            },
            **repeat,
        }


@dataclass(frozen=True, kw_only=True)
class Stat:
    """One number, coloured by its thresholds."""

    title: str
    unit: str = "none"
    size: tuple[int, int] = (6, 4)
    expr: str
    thresholds: dict[str, Any]
    description: str

    def json(self) -> dict[str, Any]:
        return {
            "type": "stat",
            "title": self.title,
            "description": self.description,
            "targets": _targets([Query(self.expr)], instant=True),
            "fieldConfig": {
                "defaults": {"unit": self.unit, "thresholds": self.thresholds, "color": {"mode": "thresholds"}},
                "overrides": [],
            },
            "options": {
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "colorMode": "background",
                "graphMode": "none",
                "textMode": "value",
            },
        }


@dataclass(frozen=True, kw_only=True)
class Table:
    """Instant queries merged into one row per series; each query a column, named by its `ref`. Sorted by the
    column `sort_by`, worst first; `unit` and `thresholds` for every column, `overrides` (`_on_column`) for some."""

    title: str
    unit: str
    size: tuple[int, int] = (24, 8)
    columns: Sequence[Query]
    thresholds: dict[str, Any]
    sort_by: str
    hidden: Sequence[str] = ()  # columns left out, besides the time, the name and the job
    overrides: Sequence[dict[str, Any]] = ()
    description: str

    def json(self) -> dict[str, Any]:
        hidden = dict.fromkeys(("Time", "__name__", "job", *(_column(ref) for ref in self.hidden)), True)
        return {
            "type": "table",
            "title": self.title,
            "description": self.description,
            "targets": _targets(self.columns, instant=True, fmt="table"),
            "fieldConfig": {
                "defaults": {"unit": self.unit, "thresholds": self.thresholds},
                "overrides": list(self.overrides),
            },
            "transformations": [
                {"id": "merge", "options": {}},
                {"id": "organize", "options": {"excludeByName": hidden}},
            ],
            "options": {"sortBy": [{"displayName": _column(self.sort_by), "desc": True}], "showHeader": True},
        }


@dataclass(frozen=True)
class Row:
    """A row's title across the grid: the panels after it, until the next, are its."""

    title: str


Panel = Graph | Stat | Table | Row


def _thresholds(base: str, **steps: float) -> dict[str, Any]:
    """Colours by value: `base` below the first step, then each step's colour from its value up, in order:
    `_thresholds("green", orange=0.9, red=0.95)`."""
    return {
        "mode": "absolute",
        "steps": [{"color": base, "value": None}, *({"color": c, "value": v} for c, v in steps.items())],
    }


def _ratio_steps(config: BundleConfig) -> dict[str, Any]:
    """The memory alerts' used/total lines: warning, critical."""
    alerts = config.alerts
    return _thresholds("green", orange=alerts.gpu_memory_high.threshold, red=alerts.gpu_memory_critical.threshold)


def _headroom_steps(config: BundleConfig) -> dict[str, Any]:
    """The memory alerts' lines on the headroom an engine's reservation leaves: warning, critical."""
    alerts = config.alerts
    return _thresholds(
        "green",
        orange=alerts.gpu_memory_high.headroom_threshold,
        red=alerts.gpu_memory_critical.headroom_threshold,
    )


# A series' or a column's style, as Grafana names it: a tuple (property, value).
COLOR_BACKGROUND = ("custom.cellOptions", {"type": "color-background"})
STACKED = ("custom.stacking", {"mode": "normal", "group": "used"})
LINE = (("custom.stacking", {"mode": "none", "group": "lines"}), ("custom.fillOpacity", 0), ("custom.lineWidth", 2))
DASHED = ("custom.lineStyle", {"fill": "dash", "dash": [10, 10]})


def _color(name: str) -> tuple[str, Any]:
    return "color", {"mode": "fixed", "fixedColor": name}


def _override(matcher: str, options: str, properties: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    return {
        "matcher": {"id": matcher, "options": options},
        "properties": [{"id": i, "value": v} for i, v in properties],
    }


def _column(ref: str) -> str:
    """A table's column, as Grafana names the values of the query `ref`."""
    return f"Value #{ref}"


def _on_query(ref: str, *properties: tuple[str, Any]) -> dict[str, Any]:
    """A graph's style for the series of one query."""
    return _override("byFrameRefID", ref, properties)


def _on_column(ref: str, *properties: tuple[str, Any]) -> dict[str, Any]:
    """A table's style for one column."""
    return _override("byName", _column(ref), properties)


def _on_columns(refs: Sequence[str], *properties: tuple[str, Any]) -> dict[str, Any]:
    """A table's style for several columns."""
    return _override("byRegexp", _column(f"({'|'.join(refs)})"), properties)


@dataclass(frozen=True)
class Selectors:
    """The matchers and groupings every query is built from.

    `all`: one variable per fleet label (cluster, ...), the job and the instance; `target`: those and the picked
    target; `gpu`: those and the picked node and GPU; `where(...)`: those and more matchers. A fleet label absent
    from the series (a single Prometheus) is matched by its variable's All (.*)."""

    config: BundleConfig

    def where(self, *matchers: str) -> str:
        fleet = [f'{label}=~"${label}"' for label in self.config.fleet_labels]
        return "{" + ",".join([*fleet, 'job=~"$job"', 'instance=~"$instance"', *matchers]) + "}"

    @property
    def all(self) -> str:
        return self.where()

    @property
    def target(self) -> str:
        return self.where(PICKED_TARGET)

    @property
    def gpu(self) -> str:
        return self.where(*PICKED_GPU)

    def sum_by(self, labels: str, expr: str) -> str:
        """`sum by (labels) (expr)`, the fleet labels first, so that two clusters' targets of one name stay apart."""
        by = ", ".join(dict.fromkeys([*self.config.fleet_labels, *(label.strip() for label in labels.split(","))]))
        return f"sum by ({by}) ({expr})"

    def on(self, *labels: str) -> str:
        """`on(...)` as the rules match: the fleet's labels, the group's (job, instance), then `labels`."""
        return f"on({', '.join(grouping(self.config, *labels))})"

    def judged(self, alert: str) -> str:
        """GPUs past a memory alert's threshold, judged as the alert judges them (its `basis`, without its `for:`):
        the headroom the engines' reservation leaves where one is known, used/total elsewhere."""
        thresholds = getattr(self.config.alerts, alert)
        return (
            f"(oomguard_gpu_memory_headroom_used_ratio{self.all} > {thresholds.headroom_threshold})"
            f" or (oomguard_gpu_memory_used_ratio{self.all} > {thresholds.threshold}"
            f" unless {self.on('node', 'gpu')} oomguard_gpu_memory_headroom_used_ratio{self.all})"
        )


# -- the fleet overview ----------------------------------------------------------------------------------------
def _fleet_counts(config: BundleConfig) -> list[Panel]:
    """The overview's first line: four numbers, green while nothing is wrong."""
    sel, high = Selectors(config), config.alerts.gpu_memory_high
    climbing = sel.where('state="climbing"')
    return [
        Stat(
            title="GPUs at the warning level",
            expr=f"count({sel.judged('gpu_memory_high')}) or vector(0)",
            thresholds=_thresholds("green", orange=1),
            description=f"GPUs past the memory warning now, judged as OomGuardGpuMemoryHigh judges them: more than {high.headroom_threshold:.0%} of the headroom an engine's reservation leaves in use, or, with no reservation known, more than {high.threshold:.0%} of the GPU. The postmortem's first signal; a healthy vLLM sitting at its reservation (90-95 %) is not counted.",
        ),
        Stat(
            title="Memory climbing",
            expr=f"count(oomguard_gpu_memory_trend_state{climbing} == 1) or vector(0)",
            thresholds=_thresholds("green", orange=1),
            description="GPUs and targets whose memory climbs without falling back (trend state climbing): leaks.",
        ),
        Stat(
            title="OOM events in range",
            expr=f"sum(increase(oomguard_target_events_total{sel.where(OOM_KINDS)}[$__range])) or vector(0)",
            thresholds=_thresholds("green", red=1),
            description="CUDA OOMs, startup memory failures and cgroup OOM kills in the time range: it already happened.",
        ),
        Stat(
            title="Restarts in range",
            expr=f"sum(increase(oomguard_target_restarts_total{sel.all}[$__range])) or vector(0)",
            thresholds=_thresholds("green", orange=1, red=3),
            description="Engine restarts in the time range; a loop of them is a restart storm.",
        ),
    ]


def _fleet_worst_first(config: BundleConfig) -> list[Panel]:
    """The overview's tables, worst first, and every GPU's memory."""
    sel = Selectors(config)
    ooms = sel.where(OOM_KINDS)
    return [
        Table(
            title="GPUs, worst first",
            unit="percentunit",
            thresholds=_ratio_steps(config),
            columns=[
                Query(f"oomguard_gpu_memory_used_ratio{sel.all}", ref="used"),
                Query(
                    f"oomguard_gpu_memory_total_bytes{sel.all} - oomguard_gpu_memory_used_bytes{sel.all}",
                    ref="headroom",
                ),
                Query(f"oomguard_gpu_memory_headroom_used_ratio{sel.all}", ref="headroom_used"),
                Query(f"oomguard_gpu_memory_trend_state{sel.all} == 1", ref="trend"),
                Query(f"oomguard_gpu_memory_seconds_to_full{sel.all}", ref="to_full"),
            ],
            sort_by="used",
            hidden=["trend"],
            overrides=[
                _on_column("headroom", ("unit", "bytes")),
                _on_column("headroom_used", ("thresholds", _headroom_steps(config)), COLOR_BACKGROUND),
                _on_column("to_full", ("unit", "s")),
                _on_column("used", COLOR_BACKGROUND),
            ],
            description="Every GPU: memory used (sorted, worst first), headroom, the share of the headroom an engine's reservation leaves that is in use (only on reserved GPUs: what the memory alerts judge there), trend state and time to full while climbing.",
        ),
        Table(
            title="Targets, worst first",
            unit="percentunit",
            thresholds=_ratio_steps(config),
            columns=[
                Query(f"oomguard_target_gpu_memory_used_ratio{sel.all}", ref="used"),
                Query(f"instance_target:oomguard_target_memory_headroom:ratio{sel.all}", ref="headroom"),
                Query(f"instance_target:oomguard_engine_requests_waiting:sum{sel.all}", ref="waiting"),
                Query(
                    sel.sum_by("instance, target", f"increase(oomguard_target_events_total{ooms}[$__range])"),
                    ref="ooms",
                ),
                Query(
                    sel.sum_by("instance, target", f"increase(oomguard_target_restarts_total{sel.all}[$__range])"),
                    ref="restarts",
                ),
            ],
            sort_by="used",
            overrides=[_on_columns(["waiting", "ooms", "restarts"], ("unit", "none"))],
            description="Every engine: memory of its GPUs (sorted, worst first), headroom, waiting requests, OOMs and restarts in the time range.",
        ),
        Graph(
            title="GPU memory used",
            unit="percentunit",
            size=(24, 8),
            thresholds=_ratio_steps(config),
            max=1,
            queries=[Query(f"oomguard_gpu_memory_used_ratio{sel.all}", legend="{{instance}} GPU {{gpu}} {{node}}")],
            description="Every GPU's memory used against the warning and critical lines: a climb that never falls back is a leak, a jump to the top is over-provisioning.",
        ),
    ]


def fleet_overview(config: BundleConfig) -> list[Panel]:
    return [*_fleet_counts(config), *_fleet_worst_first(config)]


# -- one host or target, row by row ----------------------------------------------------------------------------
def _gpu_memory_row(config: BundleConfig) -> list[Panel]:
    sel, high, critical = Selectors(config), config.alerts.gpu_memory_high, config.alerts.gpu_memory_critical
    return [
        Row("GPU memory"),
        Graph(
            title="GPU memory used",
            unit="percentunit",
            size=(12, 8),
            thresholds=_ratio_steps(config),
            max=1,
            queries=[Query(f"oomguard_gpu_memory_used_ratio{sel.gpu}", legend="GPU {{gpu}} {{node}}")],
            description=f"Used memory of each GPU as a share of its total, with the {high.threshold:.0%} and {critical.threshold:.0%} lines: the memory alerts' judgement on a GPU with no known engine reservation. A GPU an engine reserves (vLLM: gpu_memory_utilization x total, from its start) sits at its reservation, idle or busy: judge it on the headroom panel.",
        ),
        Graph(
            title="Headroom used beyond the reservation",
            unit="percentunit",
            size=(12, 8),
            thresholds=_headroom_steps(config),
            queries=[Query(f"oomguard_gpu_memory_headroom_used_ratio{sel.gpu}", legend="GPU {{gpu}} {{node}}")],
            description=f"On a GPU an engine reserves: the memory outside the reservation (the engines' use beyond it, and every other process) as a share of the headroom the reservation leaves (total - reserved). The memory alerts judge this there: warning above {high.headroom_threshold:.0%}, page above {critical.headroom_threshold:.0%}; above 100 % the reservation cannot be honoured.",
        ),
        Graph(
            title="GPU $gpu: the engines' reservation, use within and beyond it",
            unit="bytes",
            size=(24, 8),
            repeat="gpu",
            queries=[
                Query(
                    f"oomguard_gpu_memory_used_bytes{sel.gpu} - oomguard_gpu_memory_unreserved_used_bytes{sel.gpu}",
                    legend="within the reservation",
                    ref="A",
                ),
                Query(f"oomguard_gpu_memory_unreserved_used_bytes{sel.gpu}", legend="beyond the reservation", ref="B"),
                Query(f"oomguard_gpu_memory_engine_reserved_bytes{sel.gpu}", legend="reservation", ref="C"),
                Query(f"oomguard_gpu_memory_total_bytes{sel.gpu}", legend="total", ref="D"),
            ],
            overrides=[
                _on_query("A", STACKED, _color("green")),
                _on_query("B", STACKED, _color("orange")),
                _on_query("C", *LINE, _color("blue"), DASHED),
                _on_query("D", *LINE, _color("red")),
            ],
            description="One panel per GPU (on a GPU no engine reserves, only the total shows). Stacked: the use within the reservation (used - unreserved used: the engines' preallocated weights and KV pool, flat whether the KV cache is empty or full) and the use beyond it (what can still grow: activations, other processes, a leak), adding up to NVML's used. Lines: the reservation and the total. Memory runs out when the orange part fills the gap between the reservation and the total.",
        ),
        Graph(
            title="GPU memory: used, reserved by the driver, total",
            unit="bytes",
            size=(12, 8),
            queries=[
                Query(f"oomguard_gpu_memory_used_bytes{sel.gpu}", legend="used GPU {{gpu}} {{node}}"),
                Query(f"oomguard_gpu_memory_reserved_bytes{sel.gpu}", legend="reserved GPU {{gpu}} {{node}}"),
                Query(f"oomguard_gpu_memory_total_bytes{sel.gpu}", legend="total GPU {{gpu}} {{node}}"),
            ],
            description="Bytes used, reserved by the driver (NVML's reserved memory, not an engine's reservation), and total, per GPU.",
        ),
        Graph(
            title="Target memory against the engine's budget",
            unit="bytes",
            size=(12, 8),
            queries=[
                Query(f"oomguard_target_gpu_memory_used_bytes{sel.target}", legend="{{target}} used"),
                Query(f"oomguard_target_memory_budget_bytes{sel.target}", legend="{{target}} budget"),
                Query(f"oomguard_target_process_gpu_memory_bytes{sel.target}", legend="{{target}} own processes"),
            ],
            description="Memory of the target's GPUs against the engine's budget (gpu_memory_utilization x total): above the budget is memory the KV cache cannot explain.",
        ),
        Graph(
            title="Per-process GPU memory",
            unit="bytes",
            size=(12, 8),
            queries=[
                Query(
                    f"oomguard_gpu_process_memory_used_bytes{sel.gpu}",
                    legend="GPU {{gpu}} {{node}} pid {{pid}} {{process_name}}",
                )
            ],
            description="GPU memory of each compute process: who holds the memory.",
        ),
    ]


def _trend_row(config: BundleConfig) -> list[Panel]:
    sel, soon = Selectors(config), config.alerts.exhausted_soon.seconds
    long_window = sel.where(*PICKED_GPU, 'window="long"')
    return [
        Row("Trend"),
        Graph(
            title="Memory slope",
            unit="Bps",
            size=(8, 7),
            queries=[Query(f"oomguard_gpu_memory_slope_bytes_per_second{long_window}", legend="GPU {{gpu}} {{node}}")],
            description="Robust slope of used memory per GPU over the long window: positive and steady is a climb.",
        ),
        Graph(
            title="Trend state",
            unit="none",
            size=(8, 7),
            queries=[Query(f"oomguard_gpu_memory_trend_state{sel.gpu} == 1", legend="GPU {{gpu}} {{node}} {{state}}")],
            description="The trend state of each GPU's memory (1 = current): steady, sawtooth, climbing (leak), spike (over-provisioning), saturated.",
        ),
        Graph(
            title="Time to full",
            unit="s",
            size=(8, 7),
            thresholds=_thresholds("red", orange=soon, green=4 * soon),
            queries=[Query(f"oomguard_gpu_memory_seconds_to_full{sel.gpu}", legend="GPU {{gpu}} {{node}}")],
            description="At the current pace, time until each GPU is full; shown only while climbing or spiking.",
        ),
    ]


def _engine_row(config: BundleConfig) -> list[Panel]:
    sel, alerts = Selectors(config), config.alerts
    return [
        Row("Engine"),
        Graph(
            title="KV cache usage",
            unit="percentunit",
            size=(8, 7),
            thresholds=_thresholds("green", red=alerts.kv_cache_saturated.threshold),
            max=1,
            queries=[Query(f"oomguard_engine_kv_cache_usage_ratio{sel.target}", legend="{{target}} {{model_name}}")],
            description="Share of the engine's KV cache blocks in use: at the top, requests wait and get preempted.",
        ),
        Graph(
            title="Requests waiting and running",
            unit="none",
            size=(8, 7),
            thresholds=_thresholds("green", orange=float(alerts.queue_backlog.threshold)),
            queries=[
                Query(f"instance_target:oomguard_engine_requests_waiting:sum{sel.target}", legend="{{target}} waiting"),
                Query(f"instance_target:oomguard_engine_requests_running:sum{sel.target}", legend="{{target}} running"),
            ],
            description="The engine's queue: waiting that stays up means concurrency is over-provisioned.",
        ),
        Graph(
            title="Preemption rate",
            unit="reqps",
            size=(8, 7),
            queries=[
                Query(
                    sel.sum_by("target", f"rate(oomguard_engine_preemptions_total{sel.target}[$__rate_interval])"),
                    legend="{{target}}",
                )
            ],
            description="Requests preempted per second because the KV cache was full.",
        ),
        Graph(
            title="Requests refused",
            unit="reqps",
            size=(12, 7),
            queries=[
                Query(
                    sel.sum_by(
                        "target", f"rate(oomguard_engine_admission_rejections_total{sel.target}[$__rate_interval])"
                    ),
                    legend="{{target}}",
                )
            ],
            description="Requests refused with 503 at admission because the engine's queue limit was reached"
            " (vLLM 0.32+): clients see errors while memory may still look fine.",
        ),
        Graph(
            title="KV cache offloaded and loaded back",
            unit="Bps",
            size=(12, 7),
            queries=[
                Query(
                    sel.sum_by(
                        "target", f"rate(oomguard_engine_kv_offload_store_bytes_total{sel.target}[$__rate_interval])"
                    ),
                    legend="{{target}} stored",
                ),
                Query(
                    sel.sum_by(
                        "target", f"rate(oomguard_engine_kv_offload_load_bytes_total{sel.target}[$__rate_interval])"
                    ),
                    legend="{{target}} loaded back",
                ),
            ],
            description="KV cache moved to the engine's offload tier (CPU memory) and back, with KV offloading"
            " only: while it loads back, a full GPU KV cache is not out of KV cache.",
        ),
    ]


def _events_and_restarts_row(config: BundleConfig) -> list[Panel]:
    sel = Selectors(config)
    probe = float(config.alerts.startup_slower_than_probe.probe_initial_delay_seconds)
    return [
        Row("Events and restarts"),
        Graph(
            title="OOM events and restarts",
            unit="none",
            size=(12, 7),
            bars=True,
            queries=[
                Query(
                    sel.sum_by("target, kind", f"increase(oomguard_target_events_total{sel.target}[$__rate_interval])"),
                    legend="{{target}} {{kind}}",
                ),
                Query(
                    sel.sum_by("target", f"increase(oomguard_target_restarts_total{sel.target}[$__rate_interval])"),
                    legend="{{target}} restarts",
                ),
            ],
            description="Events counted from the engine's logs, cgroup and kernel, and restarts, per interval.",
        ),
        Graph(
            title="Startup time against the probe delay",
            unit="s",
            size=(12, 7),
            thresholds=_thresholds("green", red=probe),
            thresholds_as_area=True,
            queries=[
                Query(f"oomguard_target_startup_seconds{sel.target}", legend="{{target}} startup"),
                Query(
                    f"oomguard_target_probe_grace_seconds{sel.target}"
                    f" or {sel.on('target')} (0 * oomguard_target_startup_seconds{sel.target} + {probe:g})",
                    legend="{{target}} grace",
                ),
            ],
            description=f"Measured startup (process start to first /health 200) against the grace its probe gives it: a pod's own (initialDelaySeconds + failureThreshold x periodSeconds of its startupProbe, else its livenessProbe), else the bundle's probe_initial_delay_seconds ({probe:g} s, the red area). Startup above its grace: the probe kills the engine while it loads.",
        ),
    ]


def _monitor_health_row(config: BundleConfig) -> list[Panel]:
    sel = Selectors(config)
    return [
        Row("Monitor health"),
        Graph(
            title="Target state",
            unit="none",
            size=(8, 7),
            queries=[Query(f"oomguard_target_state{sel.target} == 1", legend="{{target}} {{state}}")],
            description="Each target's state (1 = current): up, loading (not down: the model is loading), down.",
        ),
        Graph(
            title="Source success",
            unit="none",
            size=(8, 7),
            max=1,
            queries=[Query(f"oomguard_source_success{sel.all}", legend="{{instance}} {{source}}")],
            description="1 when oomguard's NVML and target sources completed in the last collection.",
        ),
        Graph(
            title="Scrape errors",
            unit="reqps",
            size=(8, 7),
            queries=[
                Query(
                    sel.sum_by(
                        "target, kind", f"rate(oomguard_target_scrape_errors_total{sel.target}[$__rate_interval])"
                    ),
                    legend="{{target}} {{kind}}",
                )
            ],
            description="Failed reads of each target by kind (timeout, refused, http_status, too_large, parse).",
        ),
    ]


def host_and_target(config: BundleConfig) -> list[Panel]:
    return [
        *_gpu_memory_row(config),
        *_trend_row(config),
        *_engine_row(config),
        *_events_and_restarts_row(config),
        *_monitor_health_row(config),
    ]


@dataclass(frozen=True)
class Board:
    title: str
    description: str
    panels: Callable[[BundleConfig], list[Panel]]
    with_target: bool  # its variables: a target and a GPU to pick
    with_gpu: bool


DASHBOARDS = {
    "oomguard-overview.json": Board(
        "oomguard / Fleet overview",
        "Every GPU and inference engine watched by oomguard, worst first.",
        fleet_overview, with_target=False, with_gpu=False,
    ),
    "oomguard-target.json": Board(
        "oomguard / Host and target",
        "One host or inference engine: GPU memory against its limit and the engine's budget, trend, KV cache, queue, OOMs, restarts, startup time.",
        host_and_target, with_target=True, with_gpu=True,
    ),
}  # fmt: skip


# -- to Grafana's JSON -----------------------------------------------------------------------------------------
def render(config: BundleConfig) -> dict[str, str]:
    return {
        name: json.dumps(
            _dashboard(config, name, board.title, board.description, _laid_out(board.panels(config)),
                       with_target=board.with_target, with_gpu=board.with_gpu),
            indent=2, sort_keys=False,
        ) + "\n"
        for name, board in DASHBOARDS.items()
    }  # fmt: skip


def _targets(queries: Sequence[Query], instant: bool = False, fmt: str = "time_series") -> list[dict[str, Any]]:
    """A panel's queries as Grafana's targets; a query with no ref is named by its place: A, B, C..."""
    targets = []
    for place, query in enumerate(queries):
        ref = query.ref if query.ref is not None else chr(ord("A") + place)
        target: dict[str, Any] = {
            "datasource": DATASOURCE,
            "expr": query.expr,
            "legendFormat": query.legend,
            "refId": ref,
        }
        if instant:
            target |= {"instant": True, "range": False, "format": fmt}
        targets.append(target)
    return targets


def _laid_out(panels: list[Panel]) -> list[dict[str, Any]]:
    layout = _Layout()
    for panel in panels:
        if isinstance(panel, Row):
            layout.row(panel.title)
        else:
            layout.add(panel.json(), *panel.size)
    return layout.panels


class _Layout:
    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = self.y = 0
        self.row_height = 0
        self.next_id = 1

    def add(self, panel: dict[str, Any], w: int, h: int) -> None:
        if self.x + w > 24:
            self.x, self.y = 0, self.y + self.row_height
            self.row_height = 0
        panel |= {"id": self.next_id, "gridPos": {"x": self.x, "y": self.y, "w": w, "h": h}, "datasource": DATASOURCE}
        self.next_id += 1
        self.x += w
        self.row_height = max(self.row_height, h)
        self.panels.append(panel)

    def row(self, title: str) -> None:
        self.x, self.y = 0, self.y + self.row_height
        self.row_height = 1
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "id": self.next_id,
                "collapsed": False,
                "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1},
                "panels": [],
            }
        )
        self.next_id += 1
        self.x, self.y, self.row_height = 0, self.y + 1, 0


def _variables(config: BundleConfig, with_target: bool, with_gpu: bool) -> list[dict[str, Any]]:
    def query_var(name: str, label: str, query: str, include_all: bool = True) -> dict[str, Any]:
        return {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": DATASOURCE,
            "query": {"query": query, "refId": f"{name}-query"},
            "definition": query,
            "refresh": 2,
            "multi": True,
            "includeAll": include_all,
            "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "sort": 1,
            "hide": 0,
        }

    variables: list[dict[str, Any]] = [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "refresh": 1,
            "regex": "",
        },
    ]
    # One variable per fleet label (cluster, ...), from the exporters' build info. On a single Prometheus the label
    # is absent: the variable lists no value, and its All (.*) matches the absent label.
    fleet: list[str] = []
    for label in config.fleet_labels:
        build_info = "{" + ",".join([config.selector, *fleet]) + "}"
        variables.append(
            query_var(label, label.capitalize(), f"label_values(oomguard_build_info{build_info}, {label})")
        )
        fleet.append(f'{label}=~"${label}"')
    build_info = "{" + ",".join([config.selector, *fleet]) + "}"
    variables.append(query_var("job", "Job", f"label_values(oomguard_build_info{build_info}, job)"))
    build_info = "{" + ",".join([*fleet, 'job=~"$job"']) + "}"
    variables.append(query_var("instance", "Instance", f"label_values(oomguard_build_info{build_info}, instance)"))
    sel = Selectors(config)
    if with_target:
        variables.append(query_var("target", "Target", f"label_values(oomguard_target_info{sel.all}, target)"))
    if with_gpu:
        # The cluster mode's GPUs are on many nodes; a node agent's carry its one node, or none outside Kubernetes
        # (then the variable lists no value, and its All matches the absent label, as a fleet label's does).
        variables.append(query_var("node", "Node", f"label_values(oomguard_gpu_info{sel.all}, node)"))
        on_node = sel.where('node=~"$node"')
        variables.append(query_var("gpu", "GPU", f"label_values(oomguard_gpu_info{on_node}, gpu)"))
    return variables


def _dashboard(
    config: BundleConfig,
    file_name: str,
    title: str,
    description: str,
    panels: list[dict[str, Any]],
    *,
    with_target: bool,
    with_gpu: bool,
) -> dict[str, Any]:
    return {
        "__inputs": [
            {
                "name": "DS_PROMETHEUS",
                "label": "Prometheus",
                "description": "Prometheus that scrapes oomguard",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
        ],
        "uid": _uid(file_name),
        "title": title,
        "description": description,
        "tags": ["oomguard", "gpu", "llm-inference"],
        "timezone": "utc",
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": _variables(config, with_target, with_gpu)},
        "annotations": {"list": _annotations(config)},
        "links": [
            {
                "title": "Runbooks",
                "type": "link",
                "url": config.runbook_base_url,
                "targetBlank": True,
                "icon": "doc",
            },
            {"title": "oomguard dashboards", "type": "dashboards", "tags": ["oomguard"], "asDropdown": True},
        ],
        "panels": panels,
    }


def _annotations(config: BundleConfig) -> list[dict[str, Any]]:
    sel = Selectors(config)

    def annotation(name: str, expr: str, color: str, text: str) -> dict[str, Any]:
        return {
            "name": name,
            "datasource": DATASOURCE,
            "enable": True,
            "iconColor": color,
            "expr": expr,
            "step": "15s",
            "titleFormat": name,
            "textFormat": text,
            "tagKeys": "target,kind",
        }

    return [
        {
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        },
        annotation(
            "OOM events",
            # The counters exist at 0 from the start, so increase() sees the first event too.
            f"increase(oomguard_target_events_total{sel.where(OOM_KINDS)}[$__rate_interval]) > 0",
            "red",
            "{{kind}} in {{target}}",
        ),
        annotation(
            "Restarts",
            f"increase(oomguard_target_restarts_total{sel.all}[$__rate_interval]) > 0",
            "orange",
            "{{target}} restarted",
        ),
    ]


def _uid(name: str) -> str:
    # Stable across runs and machines, as the mixins do: derived from the file name.
    return hashlib.md5(name.encode()).hexdigest()[:24]  # an identifier, not security
