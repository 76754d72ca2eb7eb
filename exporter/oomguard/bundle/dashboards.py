"""Grafana dashboards, generated from the bundle configuration (selector, thresholds, runbooks).

Two dashboards: the fleet, worst first, and one host or target with everything the
postmortem needed at T+0: memory against its limit and the engine's budget, the
trend, the KV cache and queue, OOMs and restarts as markers, startup against the
probe delay, and the health of the monitor itself.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from oomguard.bundle.config import BundleConfig, grouping
from oomguard.events.kinds import TARGET_OOM_KINDS, kind_matcher

SCHEMA_VERSION = 39
DS = {"type": "prometheus", "uid": "${datasource}"}
OOM_KINDS = kind_matcher(TARGET_OOM_KINDS)


def _sel(config: BundleConfig, *extra: str) -> str:
    """Every query's matchers: one variable per fleet label (cluster, ...), the job and the instance, then `extra`.
    A fleet label absent from the series (a single Prometheus) is matched by the variable's All (.*)."""
    fleet = [f'{label}=~"${label}"' for label in config.fleet_labels]
    return "{" + ",".join([*fleet, 'job=~"$job"', 'instance=~"$instance"', *extra]) + "}"


def _by(config: BundleConfig, *labels: str) -> str:
    """A panel's by(): the fleet labels, so that two clusters' targets of the same name stay apart, then `labels`."""
    return ", ".join(dict.fromkeys([*config.fleet_labels, *labels]))


def _judged(config: BundleConfig, alert: str) -> str:
    """GPUs past a memory alert's threshold, judged as the alert judges them (its `basis`, without its `for:`):
    the headroom the engines' reservation leaves where one is known, used/total elsewhere."""
    a = getattr(config.alerts, alert)
    M = _sel(config)
    on = ", ".join(grouping(config, "gpu"))
    return (
        f"(oomguard_gpu_memory_headroom_used_ratio{M} > {a.headroom_threshold})"
        f" or (oomguard_gpu_memory_used_ratio{M} > {a.threshold}"
        f" unless on({on}) oomguard_gpu_memory_headroom_used_ratio{M})"
    )


def _uid(name: str) -> str:
    # Stable across runs and machines, as the mixins do: derived from the file name.
    return hashlib.md5(name.encode()).hexdigest()[:24]  # an identifier, not security


def _target(
    expr: str, legend: str = "", ref: str = "A", instant: bool = False, fmt: str = "time_series"
) -> dict[str, Any]:
    target: dict[str, Any] = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref}
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
        panel |= {"id": self.next_id, "gridPos": {"x": self.x, "y": self.y, "w": w, "h": h}, "datasource": DS}
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


def _timeseries(title: str, description: str, targets: list[dict[str, Any]], unit: str, **extra: Any) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 10, "showPoints": "never"}}
    if "thresholds" in extra:
        defaults["thresholds"] = extra.pop("thresholds")
        defaults["custom"]["thresholdsStyle"] = {"mode": "line+area" if extra.pop("area", False) else "line"}
    if "max" in extra:
        defaults["max"] = extra.pop("max")
        defaults["min"] = 0
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": extra.pop("overrides", [])},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        **extra,
    }


def _headroom_steps(config: BundleConfig) -> dict[str, Any]:
    a = config.alerts
    return _thresholds(
        ("green", None),
        ("orange", a.gpu_memory_high.headroom_threshold),
        ("red", a.gpu_memory_critical.headroom_threshold),
    )


def _stat(title: str, description: str, expr: str, unit: str, thresholds: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "targets": [_target(expr, instant=True)],
        "fieldConfig": {
            "defaults": {"unit": unit, "thresholds": thresholds, "color": {"mode": "thresholds"}},
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
            "textMode": "value",
        },
    }


def _variables(config: BundleConfig, with_target: bool, with_gpu: bool) -> list[dict[str, Any]]:
    def query_var(name: str, label: str, query: str, include_all: bool = True) -> dict[str, Any]:
        return {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": DS,
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
    M = _sel(config)
    if with_target:
        variables.append(query_var("target", "Target", f"label_values(oomguard_target_info{M}, target)"))
    if with_gpu:
        variables.append(query_var("gpu", "GPU", f"label_values(oomguard_gpu_info{M}, gpu)"))
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
    M = _sel(config)

    def annotation(name: str, expr: str, color: str, text: str) -> dict[str, Any]:
        return {
            "name": name,
            "datasource": DS,
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
            f"increase(oomguard_target_events_total{_sel(config, OOM_KINDS)}[$__rate_interval]) > 0",
            "red",
            "{{kind}} in {{target}}",
        ),
        annotation(
            "Restarts",
            f"increase(oomguard_target_restarts_total{M}[$__rate_interval]) > 0",
            "orange",
            "{{target}} restarted",
        ),
    ]


def overview(config: BundleConfig) -> dict[str, Any]:
    a = config.alerts
    high, critical = a.gpu_memory_high.threshold, a.gpu_memory_critical.threshold
    ratio_steps = _thresholds(("green", None), ("orange", high), ("red", critical))
    headroom_steps = _headroom_steps(config)
    M, climbing = _sel(config), _sel(config, 'state="climbing"')
    layout = _Layout()
    layout.add(
        _stat(
            "GPUs at the warning level",
            f"GPUs past the memory warning now, judged as OomGuardGpuMemoryHigh judges them: more than {a.gpu_memory_high.headroom_threshold:.0%} of the headroom an engine's reservation leaves in use, or, with no reservation known, more than {high:.0%} of the GPU. The postmortem's first signal; a healthy vLLM sitting at its reservation (90-95 %) is not counted.",
            f"count({_judged(config, 'gpu_memory_high')}) or vector(0)",
            "none",
            _thresholds(("green", None), ("orange", 1)),
        ),
        6,
        4,
    )
    layout.add(
        _stat(
            "Memory climbing",
            "GPUs and targets whose memory climbs without falling back (trend state climbing): leaks.",
            f"count(oomguard_gpu_memory_trend_state{climbing} == 1) or vector(0)",
            "none",
            _thresholds(("green", None), ("orange", 1)),
        ),
        6,
        4,
    )
    layout.add(
        _stat(
            "OOM events in range",
            "CUDA OOMs, startup memory failures and cgroup OOM kills in the time range: it already happened.",
            f"sum(increase(oomguard_target_events_total{_sel(config, OOM_KINDS)}[$__range])) or vector(0)",
            "none",
            _thresholds(("green", None), ("red", 1)),
        ),
        6,
        4,
    )
    layout.add(
        _stat(
            "Restarts in range",
            "Engine restarts in the time range; a loop of them is a restart storm.",
            f"sum(increase(oomguard_target_restarts_total{M}[$__range])) or vector(0)",
            "none",
            _thresholds(("green", None), ("orange", 1), ("red", 3)),
        ),
        6,
        4,
    )
    gpu_table_targets = [
        _target(f"oomguard_gpu_memory_used_ratio{M}", ref="used", instant=True, fmt="table"),
        _target(
            f"oomguard_gpu_memory_total_bytes{M} - oomguard_gpu_memory_used_bytes{M}",
            ref="headroom",
            instant=True,
            fmt="table",
        ),
        _target(f"oomguard_gpu_memory_headroom_used_ratio{M}", ref="headroom_used", instant=True, fmt="table"),
        _target(
            f"oomguard_gpu_memory_trend_state{M} == 1",
            ref="trend",
            instant=True,
            fmt="table",
        ),
        _target(f"oomguard_gpu_memory_seconds_to_full{M}", ref="to_full", instant=True, fmt="table"),
    ]
    layout.add(
        {
            "type": "table",
            "title": "GPUs, worst first",
            "description": "Every GPU: memory used (sorted, worst first), headroom, the share of the headroom an engine's reservation leaves that is in use (only on reserved GPUs: what the memory alerts judge there), trend state and time to full while climbing.",
            "targets": gpu_table_targets,
            "fieldConfig": {
                "defaults": {"unit": "percentunit", "thresholds": ratio_steps},
                "overrides": [
                    {
                        "matcher": {"id": "byName", "options": "Value #headroom"},
                        "properties": [{"id": "unit", "value": "bytes"}],
                    },
                    {
                        "matcher": {"id": "byName", "options": "Value #headroom_used"},
                        "properties": [
                            {"id": "thresholds", "value": headroom_steps},
                            {"id": "custom.cellOptions", "value": {"type": "color-background"}},
                        ],
                    },
                    {
                        "matcher": {"id": "byName", "options": "Value #to_full"},
                        "properties": [{"id": "unit", "value": "s"}],
                    },
                    {
                        "matcher": {"id": "byName", "options": "Value #used"},
                        "properties": [{"id": "custom.cellOptions", "value": {"type": "color-background"}}],
                    },
                ],
            },
            "transformations": [
                {"id": "merge", "options": {}},
                {
                    "id": "organize",
                    "options": {"excludeByName": {"Time": True, "__name__": True, "job": True, "Value #trend": True}},
                },
            ],
            "options": {"sortBy": [{"displayName": "Value #used", "desc": True}], "showHeader": True},
        },
        24,
        8,
    )
    by_target = _by(config, "instance", "target")
    target_table = [
        _target(f"oomguard_target_gpu_memory_used_ratio{M}", ref="used", instant=True, fmt="table"),
        _target(f"instance_target:oomguard_target_memory_headroom:ratio{M}", ref="headroom", instant=True, fmt="table"),
        _target(f"instance_target:oomguard_engine_requests_waiting:sum{M}", ref="waiting", instant=True, fmt="table"),
        _target(
            f"sum by ({by_target}) (increase(oomguard_target_events_total{_sel(config, OOM_KINDS)}[$__range]))",
            ref="ooms",
            instant=True,
            fmt="table",
        ),
        _target(
            f"sum by ({by_target}) (increase(oomguard_target_restarts_total{M}[$__range]))",
            ref="restarts",
            instant=True,
            fmt="table",
        ),
    ]
    layout.add(
        {
            "type": "table",
            "title": "Targets, worst first",
            "description": "Every engine: memory of its GPUs (sorted, worst first), headroom, waiting requests, OOMs and restarts in the time range.",
            "targets": target_table,
            "fieldConfig": {
                "defaults": {"unit": "percentunit", "thresholds": ratio_steps},
                "overrides": [
                    {
                        "matcher": {"id": "byRegexp", "options": "Value #(waiting|ooms|restarts)"},
                        "properties": [{"id": "unit", "value": "none"}],
                    }
                ],
            },
            "transformations": [
                {"id": "merge", "options": {}},
                {"id": "organize", "options": {"excludeByName": {"Time": True, "__name__": True, "job": True}}},
            ],
            "options": {"sortBy": [{"displayName": "Value #used", "desc": True}], "showHeader": True},
        },
        24,
        8,
    )
    layout.add(
        _timeseries(
            "GPU memory used",
            "Every GPU's memory used against the warning and critical lines: a climb that never falls back is a leak, a jump to the top is over-provisioning.",
            [_target(f"oomguard_gpu_memory_used_ratio{M}", "{{instance}} GPU {{gpu}}")],
            "percentunit",
            thresholds=ratio_steps,
            max=1,
        ),
        24,
        8,
    )
    return _dashboard(
        config,
        "oomguard-overview.json",
        "oomguard / Fleet overview",
        "Every GPU and inference engine watched by oomguard, worst first.",
        layout.panels,
        with_target=False,
        with_gpu=False,
    )


def target(config: BundleConfig) -> dict[str, Any]:
    a = config.alerts
    high, critical = a.gpu_memory_high.threshold, a.gpu_memory_critical.threshold
    probe = float(a.startup_slower_than_probe.probe_initial_delay_seconds)
    M, MT, MG = _sel(config), _sel(config, 'target=~"$target"'), _sel(config, 'gpu=~"$gpu"')
    layout = _Layout()
    layout.row("GPU memory")
    layout.add(
        _timeseries(
            "GPU memory used",
            f"Used memory of each GPU as a share of its total, with the {high:.0%} and {critical:.0%} lines: the memory alerts' judgement on a GPU with no known engine reservation. A GPU an engine reserves (vLLM: gpu_memory_utilization x total, from its start) sits at its reservation, idle or busy: judge it on the headroom panel.",
            [_target(f"oomguard_gpu_memory_used_ratio{MG}", "GPU {{gpu}}")],
            "percentunit",
            thresholds=_thresholds(("green", None), ("orange", high), ("red", critical)),
            max=1,
        ),
        12,
        8,
    )
    layout.add(
        _timeseries(
            "Headroom used beyond the reservation",
            f"On a GPU an engine reserves: the memory outside the reservation (the engines' use beyond it, and every other process) as a share of the headroom the reservation leaves (total - reserved). The memory alerts judge this there: warning above {a.gpu_memory_high.headroom_threshold:.0%}, page above {a.gpu_memory_critical.headroom_threshold:.0%}; above 100 % the reservation cannot be honoured.",
            [_target(f"oomguard_gpu_memory_headroom_used_ratio{MG}", "GPU {{gpu}}")],
            "percentunit",
            thresholds=_headroom_steps(config),
        ),
        12,
        8,
    )
    stacked = {"id": "custom.stacking", "value": {"mode": "normal", "group": "used"}}
    line = [
        {"id": "custom.stacking", "value": {"mode": "none", "group": "lines"}},
        {"id": "custom.fillOpacity", "value": 0},
        {"id": "custom.lineWidth", "value": 2},
    ]

    def color(name: str) -> dict[str, Any]:
        return {"id": "color", "value": {"mode": "fixed", "fixedColor": name}}

    layout.add(
        _timeseries(
            "GPU $gpu: the engines' reservation, use within and beyond it",
            "One panel per GPU (on a GPU no engine reserves, only the total shows). Stacked: the use within the reservation (used - unreserved used: the engines' preallocated weights and KV pool, flat whether the KV cache is empty or full) and the use beyond it (what can still grow: activations, other processes, a leak), adding up to NVML's used. Lines: the reservation and the total. Memory runs out when the orange part fills the gap between the reservation and the total.",
            [
                _target(
                    f"oomguard_gpu_memory_used_bytes{MG} - oomguard_gpu_memory_unreserved_used_bytes{MG}",
                    "within the reservation",
                    "A",
                ),
                _target(f"oomguard_gpu_memory_unreserved_used_bytes{MG}", "beyond the reservation", "B"),
                _target(f"oomguard_gpu_memory_engine_reserved_bytes{MG}", "reservation", "C"),
                _target(f"oomguard_gpu_memory_total_bytes{MG}", "total", "D"),
            ],
            "bytes",
            overrides=[
                {"matcher": {"id": "byFrameRefID", "options": "A"}, "properties": [stacked, color("green")]},
                {"matcher": {"id": "byFrameRefID", "options": "B"}, "properties": [stacked, color("orange")]},
                {
                    "matcher": {"id": "byFrameRefID", "options": "C"},
                    "properties": [
                        *line,
                        color("blue"),
                        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                    ],
                },
                {"matcher": {"id": "byFrameRefID", "options": "D"}, "properties": [*line, color("red")]},
            ],
            repeat="gpu",
            repeatDirection="h",
            maxPerRow=4,
        ),
        24,
        8,
    )
    layout.add(
        _timeseries(
            "GPU memory: used, reserved by the driver, total",
            "Bytes used, reserved by the driver (NVML's reserved memory, not an engine's reservation), and total, per GPU.",
            [
                _target(f"oomguard_gpu_memory_used_bytes{MG}", "used GPU {{gpu}}", "A"),
                _target(f"oomguard_gpu_memory_reserved_bytes{MG}", "reserved GPU {{gpu}}", "B"),
                _target(f"oomguard_gpu_memory_total_bytes{MG}", "total GPU {{gpu}}", "C"),
            ],
            "bytes",
        ),
        12,
        8,
    )
    layout.add(
        _timeseries(
            "Target memory against the engine's budget",
            "Memory of the target's GPUs against the engine's budget (gpu_memory_utilization x total): above the budget is memory the KV cache cannot explain.",
            [
                _target(f"oomguard_target_gpu_memory_used_bytes{MT}", "{{target}} used", "A"),
                _target(f"oomguard_target_memory_budget_bytes{MT}", "{{target}} budget", "B"),
                _target(f"oomguard_target_process_gpu_memory_bytes{MT}", "{{target}} own processes", "C"),
            ],
            "bytes",
        ),
        12,
        8,
    )
    layout.add(
        _timeseries(
            "Per-process GPU memory",
            "GPU memory of each compute process: who holds the memory.",
            [_target(f"oomguard_gpu_process_memory_used_bytes{MG}", "GPU {{gpu}} pid {{pid}} {{process_name}}")],
            "bytes",
        ),
        12,
        8,
    )
    layout.row("Trend")
    layout.add(
        _timeseries(
            "Memory slope",
            "Robust slope of used memory per GPU over the long window: positive and steady is a climb.",
            [
                _target(
                    "oomguard_gpu_memory_slope_bytes_per_second" + _sel(config, 'gpu=~"$gpu"', 'window="long"'),
                    "GPU {{gpu}}",
                )
            ],
            "Bps",
        ),
        8,
        7,
    )
    layout.add(
        _timeseries(
            "Trend state",
            "The trend state of each GPU's memory (1 = current): steady, sawtooth, climbing (leak), spike (over-provisioning), saturated.",
            [_target(f"oomguard_gpu_memory_trend_state{MG} == 1", "GPU {{gpu}} {{state}}")],
            "none",
        ),
        8,
        7,
    )
    layout.add(
        _timeseries(
            "Time to full",
            "At the current pace, time until each GPU is full; shown only while climbing or spiking.",
            [_target(f"oomguard_gpu_memory_seconds_to_full{MG}", "GPU {{gpu}}")],
            "s",
            thresholds=_thresholds(
                ("red", None),
                ("orange", a.exhausted_soon.seconds),
                ("green", 4 * a.exhausted_soon.seconds),
            ),
        ),
        8,
        7,
    )
    layout.row("Engine")
    layout.add(
        _timeseries(
            "KV cache usage",
            "Share of the engine's KV cache blocks in use: at the top, requests wait and get preempted.",
            [_target(f"oomguard_engine_kv_cache_usage_ratio{MT}", "{{target}} {{model_name}}")],
            "percentunit",
            thresholds=_thresholds(("green", None), ("red", a.kv_cache_saturated.threshold)),
            max=1,
        ),
        8,
        7,
    )
    layout.add(
        _timeseries(
            "Requests waiting and running",
            "The engine's queue: waiting that stays up means concurrency is over-provisioned.",
            [
                _target(f"instance_target:oomguard_engine_requests_waiting:sum{MT}", "{{target}} waiting", "A"),
                _target(f"instance_target:oomguard_engine_requests_running:sum{MT}", "{{target}} running", "B"),
            ],
            "none",
            thresholds=_thresholds(("green", None), ("orange", float(a.queue_backlog.threshold))),
        ),
        8,
        7,
    )
    layout.add(
        _timeseries(
            "Preemption rate",
            "Requests preempted per second because the KV cache was full.",
            [
                _target(
                    f"sum by ({_by(config, 'target')}) (rate(oomguard_engine_preemptions_total{MT}[$__rate_interval]))",
                    "{{target}}",
                )
            ],
            "reqps",
        ),
        8,
        7,
    )
    layout.row("Events and restarts")
    layout.add(
        _timeseries(
            "OOM events and restarts",
            "Events counted from the engine's logs, cgroup and kernel, and restarts, per interval.",
            [
                _target(
                    f"sum by ({_by(config, 'target', 'kind')}) (increase(oomguard_target_events_total{MT}[$__rate_interval]))",
                    "{{target}} {{kind}}",
                    "A",
                ),
                _target(
                    f"sum by ({_by(config, 'target')}) (increase(oomguard_target_restarts_total{MT}[$__rate_interval]))",
                    "{{target}} restarts",
                    "B",
                ),
            ],
            "none",
            drawStyle="bars",
        ),
        12,
        7,
    )
    layout.add(
        _timeseries(
            "Startup time against the probe delay",
            f"Measured startup (process start to first /health 200) against the grace its probe gives it: a pod's own (initialDelaySeconds + failureThreshold x periodSeconds of its startupProbe, else its livenessProbe), else the bundle's probe_initial_delay_seconds ({probe:g} s, the red area). Startup above its grace: the probe kills the engine while it loads.",
            [
                _target(f"oomguard_target_startup_seconds{MT}", "{{target}} startup", "A"),
                _target(
                    f"oomguard_target_probe_grace_seconds{MT}"
                    f" or on({', '.join(grouping(config, 'target'))}) (0 * oomguard_target_startup_seconds{MT} + {probe:g})",
                    "{{target}} grace",
                    "B",
                ),
            ],
            "s",
            thresholds=_thresholds(("green", None), ("red", probe)),
            area=True,
        ),
        12,
        7,
    )
    layout.row("Monitor health")
    layout.add(
        _timeseries(
            "Target state",
            "Each target's state (1 = current): up, loading (not down: the model is loading), down.",
            [_target(f"oomguard_target_state{MT} == 1", "{{target}} {{state}}")],
            "none",
        ),
        8,
        7,
    )
    layout.add(
        _timeseries(
            "Source success",
            "1 when oomguard's NVML and target sources completed in the last collection.",
            [_target(f"oomguard_source_success{M}", "{{instance}} {{source}}")],
            "none",
            max=1,
        ),
        8,
        7,
    )
    layout.add(
        _timeseries(
            "Scrape errors",
            "Failed reads of each target by kind (timeout, refused, http_status, too_large, parse).",
            [
                _target(
                    f"sum by ({_by(config, 'target', 'kind')}) (rate(oomguard_target_scrape_errors_total{MT}[$__rate_interval]))",
                    "{{target}} {{kind}}",
                )
            ],
            "reqps",
        ),
        8,
        7,
    )
    return _dashboard(
        config,
        "oomguard-target.json",
        "oomguard / Host and target",
        "One host or inference engine: GPU memory against its limit and the engine's budget, trend, KV cache, queue, OOMs, restarts, startup time.",
        layout.panels,
        with_target=True,
        with_gpu=True,
    )


DASHBOARDS = {"oomguard-overview.json": overview, "oomguard-target.json": target}


def render(config: BundleConfig) -> dict[str, str]:
    return {name: json.dumps(build(config), indent=2, sort_keys=False) + "\n" for name, build in DASHBOARDS.items()}
