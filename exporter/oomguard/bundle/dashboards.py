"""Grafana dashboards, generated from the bundle configuration (selector, thresholds, runbooks).

Two dashboards: the fleet, worst first, and one host or target with everything the
postmortem needed at T+0: memory against its limit and the engine's budget, the
trend, the KV cache and queue, OOMs and restarts as markers, startup against the
probe delay, and the health of the monitor itself.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oomguard.bundle.bundle_config import BundleConfig, grouping
from oomguard.common.kinds import TARGET_OOM_KINDS, kind_matcher

SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
OOM_KINDS = kind_matcher(TARGET_OOM_KINDS)


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
        return self.where('target=~"$target"')

    @property
    def gpu(self) -> str:
        return self.where('node=~"$node"', 'gpu=~"$gpu"')

    def sum_by(self, labels: str, expr: str) -> str:
        """`sum by (labels) (expr)`, the fleet labels first, so that two clusters' targets of one name stay apart."""
        by = ", ".join(dict.fromkeys([*self.config.fleet_labels, *(label.strip() for label in labels.split(","))]))
        return f"sum by ({by}) ({expr})"

    def on(self, *labels: str) -> str:
        """`on(...)` as the rules match: the fleet's labels, the group's (job, instance), then `labels`."""
        return f"on({', '.join(grouping(self.config, *labels))})"


def _judged(config: BundleConfig, alert: str) -> str:
    """GPUs past a memory alert's threshold, judged as the alert judges them (its `basis`, without its `for:`):
    the headroom the engines' reservation leaves where one is known, used/total elsewhere."""
    thresholds = getattr(config.alerts, alert)
    sel = Selectors(config)
    return (
        f"(oomguard_gpu_memory_headroom_used_ratio{sel.all} > {thresholds.headroom_threshold})"
        f" or (oomguard_gpu_memory_used_ratio{sel.all} > {thresholds.threshold}"
        f" unless {sel.on('node', 'gpu')} oomguard_gpu_memory_headroom_used_ratio{sel.all})"
    )


def _uid(name: str) -> str:
    # Stable across runs and machines, as the mixins do: derived from the file name.
    return hashlib.md5(name.encode()).hexdigest()[:24]  # an identifier, not security


def _target(
    expr: str, legend: str = "", ref: str = "A", instant: bool = False, fmt: str = "time_series"
) -> dict[str, Any]:
    target: dict[str, Any] = {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref}
    if instant:
        target |= {"instant": True, "range": False, "format": fmt}
    return target


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


def _thresholds(*steps: tuple[str, float | None]) -> dict[str, Any]:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for c, v in steps]}


def _headroom_steps(config: BundleConfig) -> dict[str, Any]:
    alerts = config.alerts
    return _thresholds(
        ("green", None),
        ("orange", alerts.gpu_memory_high.headroom_threshold),
        ("red", alerts.gpu_memory_critical.headroom_threshold),
    )


# -- the panels, as data ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Query:
    """One query of a panel: its PromQL, its legend, its refId (a table's column: `Value #<ref>`)."""

    expr: str
    legend: str = ""
    ref: str = "A"


@dataclass(frozen=True)
class Graph:
    """A time series panel; `size` (width of 24, height) places it on the grid, left to right."""

    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str
    size: tuple[int, int]
    thresholds: dict[str, Any] | None = None  # drawn as lines (as an area with `area`)
    area: bool = False
    max: float | None = None  # with a min of 0
    overrides: tuple[dict[str, Any], ...] = ()
    bars: bool = False  # bars per interval, not lines
    extra: tuple[tuple[str, Any], ...] = ()  # more of the panel's keys, as Grafana takes them (repeat, ...)

    def json(self) -> dict[str, Any]:
        defaults: dict[str, Any] = {"unit": self.unit, "custom": {"lineWidth": 1, "fillOpacity": 10,
                                                                   "showPoints": "never"}}  # fmt: skip
        if self.bars:  # a field's style: Grafana reads it there, not at the panel's top level
            defaults["custom"]["drawStyle"] = "bars"
        if self.thresholds is not None:
            defaults["thresholds"] = self.thresholds
            defaults["custom"]["thresholdsStyle"] = {"mode": "line+area" if self.area else "line"}
        if self.max is not None:
            defaults["max"] = self.max
            defaults["min"] = 0
        return {
            "type": "timeseries",
            "title": self.title,
            "description": self.description,
            "targets": [_target(q.expr, q.legend, q.ref) for q in self.queries],
            "fieldConfig": {"defaults": defaults, "overrides": list(self.overrides)},
            "options": {
                "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
                "tooltip": {"mode": "multi", "sort": "desc"},
            },
            **dict(self.extra),
        }


@dataclass(frozen=True)
class Stat:
    """One number, coloured by its thresholds."""

    title: str
    description: str
    expr: str
    thresholds: dict[str, Any]
    size: tuple[int, int] = (6, 4)
    unit: str = "none"

    def json(self) -> dict[str, Any]:
        return {
            "type": "stat",
            "title": self.title,
            "description": self.description,
            "targets": [_target(self.expr, instant=True)],
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


@dataclass(frozen=True)
class Table:
    """Instant queries merged into one row per series, sorted by the column `sort`, worst first."""

    title: str
    description: str
    queries: tuple[Query, ...]  # each query's ref names its column
    defaults: dict[str, Any]
    overrides: tuple[dict[str, Any], ...]
    sort: str
    hidden: tuple[str, ...] = ()  # columns left out, besides the time, the name and the job
    size: tuple[int, int] = (24, 8)

    def json(self) -> dict[str, Any]:
        hidden = dict.fromkeys(("Time", "__name__", "job", *self.hidden), True)
        return {
            "type": "table",
            "title": self.title,
            "description": self.description,
            "targets": [_target(q.expr, q.legend, q.ref, instant=True, fmt="table") for q in self.queries],
            "fieldConfig": {"defaults": self.defaults, "overrides": list(self.overrides)},
            "transformations": [
                {"id": "merge", "options": {}},
                {"id": "organize", "options": {"excludeByName": hidden}},
            ],
            "options": {"sortBy": [{"displayName": self.sort, "desc": True}], "showHeader": True},
        }


@dataclass(frozen=True)
class Row:
    """A row's title across the grid: the panels after it, until the next, are its."""

    title: str


Panel = Graph | Stat | Table | Row


def _laid_out(panels: list[Panel]) -> list[dict[str, Any]]:
    layout = _Layout()
    for panel in panels:
        if isinstance(panel, Row):
            layout.row(panel.title)
        else:
            layout.add(panel.json(), *panel.size)
    return layout.panels


def _override(matcher: str, options: str, *properties: tuple[str, Any]) -> dict[str, Any]:
    return {
        "matcher": {"id": matcher, "options": options},
        "properties": [{"id": i, "value": v} for i, v in properties],
    }


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


# -- the dashboards --------------------------------------------------------------------------------------------
def overview(config: BundleConfig) -> list[Panel]:
    alerts = config.alerts
    high, critical = alerts.gpu_memory_high.threshold, alerts.gpu_memory_critical.threshold
    ratio_steps = _thresholds(("green", None), ("orange", high), ("red", critical))
    sel = Selectors(config)
    climbing, ooms = sel.where('state="climbing"'), sel.where(OOM_KINDS)
    color_background = ("custom.cellOptions", {"type": "color-background"})
    return [
        Stat(
            "GPUs at the warning level",
            f"GPUs past the memory warning now, judged as OomGuardGpuMemoryHigh judges them: more than {alerts.gpu_memory_high.headroom_threshold:.0%} of the headroom an engine's reservation leaves in use, or, with no reservation known, more than {high:.0%} of the GPU. The postmortem's first signal; a healthy vLLM sitting at its reservation (90-95 %) is not counted.",
            f"count({_judged(config, 'gpu_memory_high')}) or vector(0)",
            _thresholds(("green", None), ("orange", 1)),
        ),
        Stat(
            "Memory climbing",
            "GPUs and targets whose memory climbs without falling back (trend state climbing): leaks.",
            f"count(oomguard_gpu_memory_trend_state{climbing} == 1) or vector(0)",
            _thresholds(("green", None), ("orange", 1)),
        ),
        Stat(
            "OOM events in range",
            "CUDA OOMs, startup memory failures and cgroup OOM kills in the time range: it already happened.",
            f"sum(increase(oomguard_target_events_total{ooms}[$__range])) or vector(0)",
            _thresholds(("green", None), ("red", 1)),
        ),
        Stat(
            "Restarts in range",
            "Engine restarts in the time range; a loop of them is a restart storm.",
            f"sum(increase(oomguard_target_restarts_total{sel.all}[$__range])) or vector(0)",
            _thresholds(("green", None), ("orange", 1), ("red", 3)),
        ),
        Table(
            "GPUs, worst first",
            "Every GPU: memory used (sorted, worst first), headroom, the share of the headroom an engine's reservation leaves that is in use (only on reserved GPUs: what the memory alerts judge there), trend state and time to full while climbing.",
            (
                Query(f"oomguard_gpu_memory_used_ratio{sel.all}", ref="used"),
                Query(
                    f"oomguard_gpu_memory_total_bytes{sel.all} - oomguard_gpu_memory_used_bytes{sel.all}",
                    ref="headroom",
                ),
                Query(f"oomguard_gpu_memory_headroom_used_ratio{sel.all}", ref="headroom_used"),
                Query(f"oomguard_gpu_memory_trend_state{sel.all} == 1", ref="trend"),
                Query(f"oomguard_gpu_memory_seconds_to_full{sel.all}", ref="to_full"),
            ),
            {"unit": "percentunit", "thresholds": ratio_steps},
            (
                _override("byName", "Value #headroom", ("unit", "bytes")),
                _override("byName", "Value #headroom_used", ("thresholds", _headroom_steps(config)), color_background),
                _override("byName", "Value #to_full", ("unit", "s")),
                _override("byName", "Value #used", color_background),
            ),
            sort="Value #used",
            hidden=("Value #trend",),
        ),
        Table(
            "Targets, worst first",
            "Every engine: memory of its GPUs (sorted, worst first), headroom, waiting requests, OOMs and restarts in the time range.",
            (
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
            ),
            {"unit": "percentunit", "thresholds": ratio_steps},
            (_override("byRegexp", "Value #(waiting|ooms|restarts)", ("unit", "none")),),
            sort="Value #used",
        ),
        Graph(
            "GPU memory used",
            "Every GPU's memory used against the warning and critical lines: a climb that never falls back is a leak, a jump to the top is over-provisioning.",
            (Query(f"oomguard_gpu_memory_used_ratio{sel.all}", "{{instance}} GPU {{gpu}} {{node}}"),),
            "percentunit",
            (24, 8),
            thresholds=ratio_steps,
            max=1,
        ),
    ]


def _gpu_memory_row(config: BundleConfig) -> list[Panel]:
    """The target dashboard's row "GPU memory"."""
    alerts = config.alerts
    high = alerts.gpu_memory_high.threshold
    critical = alerts.gpu_memory_critical.threshold
    sel = Selectors(config)
    stacked = ("custom.stacking", {"mode": "normal", "group": "used"})
    line = (("custom.stacking", {"mode": "none", "group": "lines"}), ("custom.fillOpacity", 0), ("custom.lineWidth", 2))

    def color(name: str) -> tuple[str, Any]:
        return "color", {"mode": "fixed", "fixedColor": name}

    return [
        Row("GPU memory"),
        Graph(
            "GPU memory used",
            f"Used memory of each GPU as a share of its total, with the {high:.0%} and {critical:.0%} lines: the memory alerts' judgement on a GPU with no known engine reservation. A GPU an engine reserves (vLLM: gpu_memory_utilization x total, from its start) sits at its reservation, idle or busy: judge it on the headroom panel.",
            (Query(f"oomguard_gpu_memory_used_ratio{sel.gpu}", "GPU {{gpu}} {{node}}"),),
            "percentunit",
            (12, 8),
            thresholds=_thresholds(("green", None), ("orange", high), ("red", critical)),
            max=1,
        ),
        Graph(
            "Headroom used beyond the reservation",
            f"On a GPU an engine reserves: the memory outside the reservation (the engines' use beyond it, and every other process) as a share of the headroom the reservation leaves (total - reserved). The memory alerts judge this there: warning above {alerts.gpu_memory_high.headroom_threshold:.0%}, page above {alerts.gpu_memory_critical.headroom_threshold:.0%}; above 100 % the reservation cannot be honoured.",
            (Query(f"oomguard_gpu_memory_headroom_used_ratio{sel.gpu}", "GPU {{gpu}} {{node}}"),),
            "percentunit",
            (12, 8),
            thresholds=_headroom_steps(config),
        ),
        Graph(
            "GPU $gpu: the engines' reservation, use within and beyond it",
            "One panel per GPU (on a GPU no engine reserves, only the total shows). Stacked: the use within the reservation (used - unreserved used: the engines' preallocated weights and KV pool, flat whether the KV cache is empty or full) and the use beyond it (what can still grow: activations, other processes, a leak), adding up to NVML's used. Lines: the reservation and the total. Memory runs out when the orange part fills the gap between the reservation and the total.",
            (
                Query(
                    f"oomguard_gpu_memory_used_bytes{sel.gpu} - oomguard_gpu_memory_unreserved_used_bytes{sel.gpu}",
                    "within the reservation",
                    "A",
                ),
                Query(f"oomguard_gpu_memory_unreserved_used_bytes{sel.gpu}", "beyond the reservation", "B"),
                Query(f"oomguard_gpu_memory_engine_reserved_bytes{sel.gpu}", "reservation", "C"),
                Query(f"oomguard_gpu_memory_total_bytes{sel.gpu}", "total", "D"),
            ),
            "bytes",
            (24, 8),
            overrides=(
                _override("byFrameRefID", "A", stacked, color("green")),
                _override("byFrameRefID", "B", stacked, color("orange")),
                _override(
                    "byFrameRefID", "C", *line, color("blue"), ("custom.lineStyle", {"fill": "dash", "dash": [10, 10]})
                ),
                _override("byFrameRefID", "D", *line, color("red")),
            ),
            extra=(("repeat", "gpu"), ("repeatDirection", "h"), ("maxPerRow", 4)),
        ),
        Graph(
            "GPU memory: used, reserved by the driver, total",
            "Bytes used, reserved by the driver (NVML's reserved memory, not an engine's reservation), and total, per GPU.",
            (
                Query(f"oomguard_gpu_memory_used_bytes{sel.gpu}", "used GPU {{gpu}} {{node}}", "A"),
                Query(f"oomguard_gpu_memory_reserved_bytes{sel.gpu}", "reserved GPU {{gpu}} {{node}}", "B"),
                Query(f"oomguard_gpu_memory_total_bytes{sel.gpu}", "total GPU {{gpu}} {{node}}", "C"),
            ),
            "bytes",
            (12, 8),
        ),
        Graph(
            "Target memory against the engine's budget",
            "Memory of the target's GPUs against the engine's budget (gpu_memory_utilization x total): above the budget is memory the KV cache cannot explain.",
            (
                Query(f"oomguard_target_gpu_memory_used_bytes{sel.target}", "{{target}} used", "A"),
                Query(f"oomguard_target_memory_budget_bytes{sel.target}", "{{target}} budget", "B"),
                Query(f"oomguard_target_process_gpu_memory_bytes{sel.target}", "{{target}} own processes", "C"),
            ),
            "bytes",
            (12, 8),
        ),
        Graph(
            "Per-process GPU memory",
            "GPU memory of each compute process: who holds the memory.",
            (
                Query(
                    f"oomguard_gpu_process_memory_used_bytes{sel.gpu}",
                    "GPU {{gpu}} {{node}} pid {{pid}} {{process_name}}",
                ),
            ),
            "bytes",
            (12, 8),
        ),
    ]


def _trend_row(config: BundleConfig) -> list[Panel]:
    """The target dashboard's row "Trend"."""
    alerts = config.alerts
    sel = Selectors(config)
    return [
        Row("Trend"),
        Graph(
            "Memory slope",
            "Robust slope of used memory per GPU over the long window: positive and steady is a climb.",
            (
                Query(
                    "oomguard_gpu_memory_slope_bytes_per_second"
                    + sel.where('node=~"$node"', 'gpu=~"$gpu"', 'window="long"'),
                    "GPU {{gpu}} {{node}}",
                ),
            ),
            "Bps",
            (8, 7),
        ),
        Graph(
            "Trend state",
            "The trend state of each GPU's memory (1 = current): steady, sawtooth, climbing (leak), spike (over-provisioning), saturated.",
            (Query(f"oomguard_gpu_memory_trend_state{sel.gpu} == 1", "GPU {{gpu}} {{node}} {{state}}"),),
            "none",
            (8, 7),
        ),
        Graph(
            "Time to full",
            "At the current pace, time until each GPU is full; shown only while climbing or spiking.",
            (Query(f"oomguard_gpu_memory_seconds_to_full{sel.gpu}", "GPU {{gpu}} {{node}}"),),
            "s",
            (8, 7),
            thresholds=_thresholds(
                ("red", None), ("orange", alerts.exhausted_soon.seconds), ("green", 4 * alerts.exhausted_soon.seconds)
            ),
        ),
    ]


def _engine_row(config: BundleConfig) -> list[Panel]:
    """The target dashboard's row "Engine"."""
    alerts = config.alerts
    sel = Selectors(config)
    return [
        Row("Engine"),
        Graph(
            "KV cache usage",
            "Share of the engine's KV cache blocks in use: at the top, requests wait and get preempted.",
            (Query(f"oomguard_engine_kv_cache_usage_ratio{sel.target}", "{{target}} {{model_name}}"),),
            "percentunit",
            (8, 7),
            thresholds=_thresholds(("green", None), ("red", alerts.kv_cache_saturated.threshold)),
            max=1,
        ),
        Graph(
            "Requests waiting and running",
            "The engine's queue: waiting that stays up means concurrency is over-provisioned.",
            (
                Query(f"instance_target:oomguard_engine_requests_waiting:sum{sel.target}", "{{target}} waiting", "A"),
                Query(f"instance_target:oomguard_engine_requests_running:sum{sel.target}", "{{target}} running", "B"),
            ),
            "none",
            (8, 7),
            thresholds=_thresholds(("green", None), ("orange", float(alerts.queue_backlog.threshold))),
        ),
        Graph(
            "Preemption rate",
            "Requests preempted per second because the KV cache was full.",
            (
                Query(
                    sel.sum_by("target", f"rate(oomguard_engine_preemptions_total{sel.target}[$__rate_interval])"),
                    "{{target}}",
                ),
            ),
            "reqps",
            (8, 7),
        ),
    ]


def _events_and_restarts_row(config: BundleConfig) -> list[Panel]:
    """The target dashboard's row "Events and restarts"."""
    alerts = config.alerts
    probe = float(alerts.startup_slower_than_probe.probe_initial_delay_seconds)
    sel = Selectors(config)
    return [
        Row("Events and restarts"),
        Graph(
            "OOM events and restarts",
            "Events counted from the engine's logs, cgroup and kernel, and restarts, per interval.",
            (
                Query(
                    sel.sum_by("target, kind", f"increase(oomguard_target_events_total{sel.target}[$__rate_interval])"),
                    "{{target}} {{kind}}",
                    "A",
                ),
                Query(
                    sel.sum_by("target", f"increase(oomguard_target_restarts_total{sel.target}[$__rate_interval])"),
                    "{{target}} restarts",
                    "B",
                ),
            ),
            "none",
            (12, 7),
            bars=True,
        ),
        Graph(
            "Startup time against the probe delay",
            f"Measured startup (process start to first /health 200) against the grace its probe gives it: a pod's own (initialDelaySeconds + failureThreshold x periodSeconds of its startupProbe, else its livenessProbe), else the bundle's probe_initial_delay_seconds ({probe:g} s, the red area). Startup above its grace: the probe kills the engine while it loads.",
            (
                Query(f"oomguard_target_startup_seconds{sel.target}", "{{target}} startup", "A"),
                Query(
                    f"oomguard_target_probe_grace_seconds{sel.target}"
                    f" or {sel.on('target')} (0 * oomguard_target_startup_seconds{sel.target} + {probe:g})",
                    "{{target}} grace",
                    "B",
                ),
            ),
            "s",
            (12, 7),
            thresholds=_thresholds(("green", None), ("red", probe)),
            area=True,
        ),
    ]


def _monitor_health_row(config: BundleConfig) -> list[Panel]:
    """The target dashboard's row "Monitor health"."""
    sel = Selectors(config)
    return [
        Row("Monitor health"),
        Graph(
            "Target state",
            "Each target's state (1 = current): up, loading (not down: the model is loading), down.",
            (Query(f"oomguard_target_state{sel.target} == 1", "{{target}} {{state}}"),),
            "none",
            (8, 7),
        ),
        Graph(
            "Source success",
            "1 when oomguard's NVML and target sources completed in the last collection.",
            (Query(f"oomguard_source_success{sel.all}", "{{instance}} {{source}}"),),
            "none",
            (8, 7),
            max=1,
        ),
        Graph(
            "Scrape errors",
            "Failed reads of each target by kind (timeout, refused, http_status, too_large, parse).",
            (
                Query(
                    sel.sum_by(
                        "target, kind", f"rate(oomguard_target_scrape_errors_total{sel.target}[$__rate_interval])"
                    ),
                    "{{target}} {{kind}}",
                ),
            ),
            "reqps",
            (8, 7),
        ),
    ]


def target(config: BundleConfig) -> list[Panel]:
    """One target's dashboard, row by row."""
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
        overview, with_target=False, with_gpu=False,
    ),
    "oomguard-target.json": Board(
        "oomguard / Host and target",
        "One host or inference engine: GPU memory against its limit and the engine's budget, trend, KV cache, queue, OOMs, restarts, startup time.",
        target, with_target=True, with_gpu=True,
    ),
}  # fmt: skip


def render(config: BundleConfig) -> dict[str, str]:
    return {
        name: json.dumps(
            _dashboard(config, name, board.title, board.description, _laid_out(board.panels(config)),
                       with_target=board.with_target, with_gpu=board.with_gpu),
            indent=2, sort_keys=False,
        ) + "\n"
        for name, board in DASHBOARDS.items()
    }  # fmt: skip
