"""`oomguard drill --check URL`: will this deployment page? Read from its Prometheus (and its Alertmanager).

It asks, in order: are the bundle's alerts and recording rules loaded, and are they this
bundle's (not an older one's); does Prometheus scrape an exporter under the job the rules
select, and is it up; are its targets up; does every input of every alert exist where it
should. Each input is judged by its metric's declared presence (exposition/spec.py): an
input that exists whenever the exporter runs, a GPU is read or a target is known is a gap when
missing; an engine's figure, when an up engine that gives it lacks it
(oomguard_engine_figure_read); one born with its first event is *armed*; one that exists only
where its condition holds is *absent here*; an engine's figure while the engine loads is
*loading*. A log source of an engine that is up and follows no file is a gap too, and so is
an up engine's figure that its /metrics lacks (a renamed metric). With
`--alertmanager URL`, it also says where each severity is routed and whether
critical reaches a receiver that sends somewhere.

Exit 1 only for gaps: what makes an alert unable to fire on this deployment; a Prometheus that cannot be asked
at all is no deployment checked (CheckError: exit 2, "could not run", as `oomguard diagnose` says it).
"""

from __future__ import annotations

import json
import re
import textwrap
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import yaml

from oomguard.bundle.bundle_config import BundleConfig
from oomguard.bundle.dashboards import render as render_dashboards
from oomguard.bundle.generate import ALERTS_FILE, RECORDS_FILE, render
from oomguard.common import bounded_yaml
from oomguard.common.excerpt import excerpt
from oomguard.exporter.exposition import METRICS
from oomguard.exporter.exposition.spec import ALWAYS, CONDITIONAL, ENGINE_UP, EVENT, PER_GPU, PER_TARGET, MetricSpec

TIMEOUT_SECONDS = 10.0
_INPUT = re.compile(r"\b(oomguard_\w+)\{")

GAP = "gap"
OK = "ok"
ARMED = "armed"
LOADING = "loading"
ABSENT = "absent"
NOTE = "note"


class CheckError(Exception):
    """The check could not run: its Prometheus did not answer, or not as Prometheus does (one line, the fix)."""


@dataclass(frozen=True)
class Finding:
    level: str  # GAP, OK, ARMED, LOADING, ABSENT or NOTE
    text: str


@dataclass
class CheckReport:
    url: str
    findings: list[Finding] = field(default_factory=list)

    def add(self, level: str, text: str) -> None:
        self.findings.append(Finding(level, text))

    def of(self, level: str) -> list[str]:
        return [f.text for f in self.findings if f.level == level]

    @property
    def ok(self) -> bool:
        return not self.of(GAP)

    def summary(self) -> str:
        gaps = self.of(GAP)
        inputs = {level: len(self.of(level)) for level in (OK, ARMED, LOADING, ABSENT)}
        counts = (
            f"inputs: {inputs[OK]} present, {inputs[ARMED]} armed (appear with their first event), "
            f"{inputs[LOADING]} loading, {inputs[ABSENT]} absent here by design"
        )
        if gaps:
            plural = "s" if len(gaps) > 1 else ""
            return f"{self.url}: FAIL, {len(gaps)} gap{plural} that can keep an alert from firing; {counts}"
        return f"{self.url}: OK, the bundle is loaded and fed, every alert can fire; {counts}"

    def text(self) -> str:
        lines = [self.summary()]
        titles = {
            GAP: "Gaps (each keeps alerts from firing):",
            NOTE: "Notes:",
            LOADING: "Loading (these appear when the engine answers):",
            ARMED: "Armed (these appear with their first event):",
            ABSENT: "Absent here by design (only where their condition holds):",
            OK: "Present:",
        }
        for level, title in titles.items():
            items = self.of(level)
            if not items:
                continue
            lines.append("")
            lines.append(title)
            if level == OK:  # names only: one paragraph
                lines += textwrap.wrap(", ".join(items), 100, initial_indent="  ", subsequent_indent="  ")
            else:
                lines += [f"  - {item}" for item in items]
        return "\n".join(lines) + "\n"


class _Api:
    def __init__(self, base: str, timeout: float) -> None:
        self.base = base.rstrip("/")
        self.timeout = timeout

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.base}{path}", timeout=self.timeout) as response:
            return json.load(response)

    def query(self, promql: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query?query=" + urllib.parse.quote(promql))
        return data["data"]["result"]


def _specs() -> dict[str, MetricSpec]:
    return {spec.sample_name: spec for spec in METRICS}


def check_deployment(
    prometheus_url: str, bundle: BundleConfig, *, alertmanager_url: str | None = None, timeout: float = TIMEOUT_SECONDS
) -> CheckReport:
    report = CheckReport(prometheus_url)
    api = _Api(prometheus_url, timeout)
    rendered = render(bundle)
    alerts = [r for g in yaml.safe_load(rendered[ALERTS_FILE])["groups"] for r in g["rules"]]
    records = [r for g in yaml.safe_load(rendered[RECORDS_FILE])["groups"] for r in g["rules"]]
    groups = _rule_groups(api, prometheus_url)
    _check_rules(report, groups, alerts, records, bundle)
    selector = bundle.selector
    try:
        state = _check_scrape(report, api, selector)
        if state is not None:
            _check_inputs(report, api, selector, alerts + records, state)
            _check_event_sources(report, api, selector)
            _check_figures(report, api, selector)
            _check_dcgm_claims(report, api, selector)
            _say_dcgm_naming(report, api, selector)
    except (OSError, ValueError, KeyError) as exc:
        report.add(GAP, f"cannot query {prometheus_url}: {exc}")
    if alertmanager_url:
        _check_routing(report, alertmanager_url, alerts, timeout)
    _check_alertmanagers(report, api)
    return report


def _rule_groups(api: _Api, url: str) -> list[dict]:
    """The rule groups loaded in the Prometheus at `url`: the check's first question, and the one that says whether
    there is a Prometheus to ask at all (CheckError where there is none)."""
    fix = "check --check (the Prometheus server's base URL, e.g. http://prometheus:9090) and that it is running"
    try:
        groups = api.get("/api/v1/rules")["data"]["groups"]
        if not isinstance(groups, list):
            raise TypeError("groups is not a list")
        return groups
    except urllib.error.HTTPError as exc:
        raise CheckError(f"Prometheus at {url} answered HTTP {exc.code} {exc.reason} to /api/v1/rules; {fix}") from None
    except TimeoutError:
        raise CheckError(f"Prometheus at {url} did not answer within {api.timeout:g}s; {fix}") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            raise CheckError(f"Prometheus at {url} did not answer within {api.timeout:g}s; {fix}") from None
        why = getattr(reason, "strerror", None) or reason
        raise CheckError(f"cannot reach Prometheus at {url}: {excerpt(str(why), 200)}; {fix}") from None
    except OSError as exc:
        raise CheckError(f"cannot reach Prometheus at {url}: {excerpt(exc.strerror or str(exc), 200)}; {fix}") from None
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise CheckError(
            f"{url} did not answer as Prometheus's HTTP API does (/api/v1/rules); "
            "is --check the Prometheus server itself, not Grafana or an exporter?"
        ) from None


# -- the rules -----------------------------------------------------------------------------------
def _check_rules(
    report: CheckReport, groups: list[dict], alerts: list[dict], records: list[dict], bundle: BundleConfig
) -> None:
    loaded = {r.get("name"): r for g in groups for r in g.get("rules", [])}
    missing_alerts = [a["alert"] for a in alerts if a["alert"] not in loaded]
    missing_records = [r["record"] for r in records if r["record"] not in loaded]
    if missing_alerts:
        which = "none of its" if len(missing_alerts) == len(alerts) else f"{len(missing_alerts)} of its"
        report.add(
            GAP,
            f"{which} {len(alerts)} alerts loaded ({_few(missing_alerts)}): add the generated "
            "rules/oomguard-alerts.yaml to rule_files (or apply deploy/kubernetes/prometheusrule.yaml) and reload",
        )
    if missing_records:
        _records_missing(report, missing_records, records, bundle)
    ours = {a["alert"]: a for a in alerts}
    foreign = sorted(n for n, r in loaded.items() if n and n.startswith("OomGuard") and n not in ours)
    if foreign:
        report.add(
            GAP,
            f"loaded rules that this bundle does not have ({_few(foreign)}): the rules are from another version of "
            "oomguard; write them again with `oomguard generate` and reload",
        )
    drifted = _drifted(ours, loaded)
    if drifted:
        report.add(
            GAP,
            f"loaded alerts that differ from this bundle's in their `for` or severity ({_few(drifted)}): an older "
            "or hand-edited bundle; write it again with `oomguard generate` and reload",
        )
    if not missing_alerts and not missing_records and not foreign and not drifted:
        report.add(NOTE, f"the bundle's {len(alerts)} alerts and {len(records)} recording rules are loaded")


def _records_missing(report: CheckReport, missing: list[str], records: list[dict], bundle: BundleConfig) -> None:
    """The recording rules not loaded, and the dashboards' panels that show No data for them."""
    dashboards = "".join(render_dashboards(bundle).values())
    needed = [r for r in missing if r in dashboards]
    panels = f"; the dashboards read {_few(needed)}: their panels show No data" if needed else ""
    report.add(
        GAP,
        f"{len(missing)} of the {len(records)} recording rules not loaded ({_few(missing)})"
        f"{panels}: add rules/oomguard-records.yaml to rule_files and reload",
    )


def _drifted(ours: dict[str, dict], loaded: dict[Any, dict]) -> list[str]:
    """The bundle's alerts loaded with another `for` or severity."""
    drifted = []
    for name, alert in ours.items():
        if (rule := loaded.get(name)) is None or rule.get("type") != "alerting":
            continue
        severity = (rule.get("labels") or {}).get("severity")
        if rule.get("duration") != _seconds(alert.get("for", "0s")) or severity != alert["labels"].get("severity"):
            drifted.append(name)
    return drifted


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", duration))


def _few(names: Iterable[str], most: int = 4) -> str:
    names = list(names)
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


# -- the scrape and the targets ------------------------------------------------------------------
@dataclass(frozen=True)
class _State:
    gpus: int  # GPUs read
    targets: int  # targets known
    up: int  # targets up
    loading: int  # targets loading


def _check_scrape(report: CheckReport, api: _Api, selector: str) -> _State | None:
    up = api.query(f"up{{{selector}}}")
    if not up:
        elsewhere = api.query("count by (job) (oomguard_build_info)")
        if elsewhere:
            jobs = ", ".join(f'job="{r["metric"].get("job", "")}"' for r in elsewhere)
            report.add(
                GAP,
                f"the exporter is scraped as {jobs}, but the rules select {{{selector}}}: no alert reads it. Set the "
                "bundle's selector (`oomguard generate --set selector=...`) or the scrape job's name to match",
            )
        else:
            report.add(
                GAP,
                f"Prometheus scrapes no oomguard exporter under {{{selector}}}: add the scrape job "
                "(docs/kubernetes.md, or a static_configs job named as the selector says)",
            )
        return None
    down = [r["metric"].get("instance", "?") for r in up if float(r["value"][1]) == 0]
    for instance in down:
        report.add(GAP, f"the exporter at {instance} is down (up 0): nothing it watches can page")
    if len(down) == len(up):
        return None
    report.add(NOTE, f"{len(up) - len(down)} exporter(s) scraped under {{{selector}}} and up")
    states = api.query(f"oomguard_target_state{{{selector}}} == 1")
    by_state: dict[str, list[str]] = {}
    for r in states:
        by_state.setdefault(r["metric"].get("state", ""), []).append(
            f"{r['metric'].get('target', '?')} on {r['metric'].get('instance', '?')}"
        )
    for where in by_state.get("down", []):
        report.add(GAP, f"target {where} is down: its engine does not answer (its alerts fire on what it last said)")
    for where in by_state.get("loading", []):
        report.add(NOTE, f"target {where} is loading: its engine's figures appear when it answers")
    gpus = api.query(f"oomguard_gpu_up{{{selector}}} == 1")
    if not gpus:
        report.add(NOTE, "no GPU is read (oomguard_nvml_up 0, or no GPU): the GPU memory alerts have nothing to judge")
    # Up with its /metrics read: an engine's figures must be there. Up by /health alone (the scrape where a load
    # ends, before /metrics answers) is still coming up.
    answered = f"oomguard_target_up{{{selector}}} == 1"
    read = len(api.query(f'{answered} and on(instance, target) oomguard_target_state{{state="up",{selector}}} == 1'))
    coming = len(by_state.get("loading", [])) + len(by_state.get("up", [])) - read
    return _State(len(gpus), len(states), read, coming)


# -- the inputs ------------------------------------------------------------------------------------
def _check_inputs(report: CheckReport, api: _Api, selector: str, rules: list[dict], state: _State) -> None:
    specs = _specs()
    inputs = sorted({m for r in rules for m in _INPUT.findall(r["expr"]) if m in specs})
    names = "|".join(re.escape(m) for m in inputs)
    present = {r["metric"]["__name__"] for r in api.query(f'group by (__name__) ({{__name__=~"{names}",{selector}}})')}
    for name in inputs:
        spec = specs[name]
        if name in present:
            report.add(OK, name)
            continue
        level, why = _judge(spec, state)
        report.add(level, f"{name}: {why}" if level != GAP else f"no series {name}{{{selector}}}: {why}")


def _judge(spec: MetricSpec, state: _State) -> tuple[str, str]:
    """What a missing input means on this deployment, from its declared presence."""
    if spec.presence == EVENT:
        return ARMED, "armed: appears with its first event"
    if spec.presence == CONDITIONAL:
        return ABSENT, _condition(spec)
    if spec.presence == ENGINE_UP:
        if state.up:
            # Not every engine gives every figure (TGI no KV use): one that should and does not is a gap of its own,
            # from oomguard_engine_figure_read (below).
            return ABSENT, f"none of the {state.up} engine(s) up gives it"
        if state.loading:
            return LOADING, "loading: appears when the engine answers"
        return ABSENT, "no engine target is up here"
    if spec.presence == PER_TARGET:
        if state.targets:
            return GAP, "exported for every target, and missing: the alerts that read it can never fire"
        return ABSENT, "no target is known here"
    if spec.presence == PER_GPU:
        if state.gpus:
            return GAP, "exported for every GPU read, and missing: the alerts that read it can never fire"
        return ABSENT, "no GPU is read here"
    assert spec.presence == ALWAYS
    return GAP, "exported whenever the exporter runs, and missing: the alerts that read it can never fire"


# The clause of a metric's help that says when it has series: "...; only while climbing or spiking.", "Only with
# --web.config.file.", "(absent when it did not answer)".
_CONDITION = re.compile(
    r"(?:^|[;.(]\s?)((?:only|absent) (?:while|with|where|when|without|for|on) .+?)\s*(?=[;()]|\.(?:\s|$)|$)",
    re.IGNORECASE,
)


def _condition(spec: MetricSpec) -> str:
    """When a conditional metric has series, in its help's words, else where to read it."""
    found = _CONDITION.search(spec.help)
    return found[1][0].lower() + found[1][1:] if found else "only where its condition holds (docs/metrics.md)"


def _check_event_sources(report: CheckReport, api: _Api, selector: str) -> None:
    """A log source that follows no file counts nothing and fails nothing: a gap while its engine is up."""
    up = {
        (r["metric"].get("instance"), r["metric"].get("target"))
        for r in api.query(f'oomguard_target_state{{state="up",{selector}}} == 1')
    }
    for r in api.query(f"oomguard_event_source_files{{{selector}}} == 0"):
        m = r["metric"]
        where = f"{m.get('source', '?')} of target {m.get('target', '?')} on {m.get('instance', '?')}"
        if (m.get("instance"), m.get("target")) in up:
            report.add(
                GAP,
                f"{where} follows no file while its engine is up: its OOMs are never counted (a typo in logs:? "
                "`oomguard check-config` names the pattern)",
            )
        else:
            report.add(NOTE, f"{where} follows no file yet (its engine is not up)")


def _check_figures(report: CheckReport, api: _Api, selector: str) -> None:
    """A figure its engine gives, missing from an up target's /metrics: a renamed metric, its alerts silent."""
    for r in api.query(f"oomguard_engine_figure_read{{{selector}}} == 0"):
        m = r["metric"]
        report.add(
            GAP,
            f"target {m.get('target', '?')} on {m.get('instance', '?')} answers without its {m.get('figure', '?')} "
            "under any name oomguard reads: the alerts on it cannot fire (an engine upgrade renamed it? "
            "docs/runbooks.md#oomguardenginefiguremissing)",
        )


def _check_dcgm_claims(report: CheckReport, api: _Api, selector: str) -> None:
    """A pod refused as a node's dcgm-exporter in the last hour: a pose, or a node read from no one (a conflict)."""
    for r in api.query(f"max_over_time(oomguard_dcgm_pods_refused_total{{{selector}}}[1h]) > 0"):
        m = r["metric"]
        pod = f"{m.get('namespace', '?')}/{m.get('pod', '?')}"
        if m.get("reason") == "conflict":
            why = "two pods claim the node, so its GPUs are read from neither: its memory alerts cannot fire"
        else:
            why = "no DaemonSet of dcgm.daemonsets controls it: something poses as dcgm-exporter"
        report.add(
            GAP,
            f"pod {pod} refused as the dcgm-exporter of node {m.get('node', '?')} on {m.get('instance', '?')}: "
            f"{why} (docs/runbooks.md#oomguarddcgmpodrefused)",
        )


def _say_dcgm_naming(report: CheckReport, api: _Api, selector: str) -> None:
    """Which naming each node's dcgm-exporter uses (4.8's MiB families or 4.9's bytes): a note per naming, the nodes
    under it, so that a fleet half upgraded is seen as such."""
    namings: dict[str, list[str]] = {}
    for r in api.query(f"oomguard_dcgm_memory_family_info{{{selector}}}"):
        m = r["metric"]
        namings.setdefault(m.get("node", "?"), []).append(f"{m.get('family', '?')} ({m.get('unit', '?')})")
    by_naming: dict[str, list[str]] = {}
    for node, families in sorted(namings.items()):
        by_naming.setdefault(", ".join(sorted(families)), []).append(node)
    for families, nodes in sorted(by_naming.items()):
        report.add(NOTE, f"dcgm-exporter on {len(nodes)} node(s) ({_few(nodes)}): GPU memory from {families}")


# -- where alerts go ---------------------------------------------------------------------------------
def _check_alertmanagers(report: CheckReport, api: _Api) -> None:
    try:
        active = api.get("/api/v1/alertmanagers")["data"]["activeAlertmanagers"]
    except (OSError, ValueError, KeyError):
        return
    if not active:
        report.add(NOTE, "this Prometheus sends alerts to no Alertmanager: firing alerts page nobody")


def _check_routing(report: CheckReport, alertmanager_url: str, alerts: list[dict], timeout: float) -> None:
    api = _Api(alertmanager_url, timeout)
    try:
        config = bounded_yaml.load(api.get("/api/v2/status")["config"]["original"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError, yaml.YAMLError) as exc:
        report.add(GAP, f"cannot read the routing of {alertmanager_url}: {excerpt(str(exc), 300)}")
        return
    if not isinstance(config, dict):
        report.add(GAP, f"cannot read the routing of {alertmanager_url}: its configuration is not a mapping")
        return
    receivers = {r.get("name"): r for r in config.get("receivers") or []}
    route = config.get("route") or {}
    severities: dict[str, str] = {}
    for alert in alerts:
        severities.setdefault(alert["labels"].get("severity", ""), alert["alert"])
    for severity, example in sorted(severities.items()):
        name = _route(route, {"alertname": example, "severity": severity}, route.get("receiver", ""))
        sends = [
            k.removesuffix("_configs") for k, v in (receivers.get(name) or {}).items() if k.endswith("_configs") and v
        ]
        if sends:
            report.add(NOTE, f"severity {severity} ({example}, ...) goes to receiver {name!r} ({', '.join(sends)})")
        elif severity == "critical":
            report.add(
                GAP, f"critical alerts ({example}, ...) go to receiver {name!r}, which sends nowhere: nobody is paged"
            )
        else:
            report.add(NOTE, f"severity {severity} ({example}, ...) goes to receiver {name!r}, which sends nowhere")


def _route(node: dict, labels: dict[str, str], receiver: str) -> str:
    """The receiver Alertmanager picks for `labels` under `node` (the first matching child, depth first)."""
    receiver = node.get("receiver") or receiver
    for child in node.get("routes") or []:
        if _matches(child, labels):
            return _route(child, labels, receiver)
    return receiver


def _matches(route: dict, labels: dict[str, str]) -> bool:
    for name, value in (route.get("match") or {}).items():
        if labels.get(name, "") != value:
            return False
    for name, pattern in (route.get("match_re") or {}).items():
        if not re.fullmatch(pattern, labels.get(name, "")):
            return False
    for matcher in route.get("matchers") or []:
        m = re.fullmatch(r'\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"?(.*?)"?\s*', matcher)
        if m is None:
            continue
        name, op, value = m.groups()
        have = labels.get(name, "")
        ok = {
            "=": have == value,
            "!=": have != value,
            "=~": re.fullmatch(value, have) is not None,
            "!~": re.fullmatch(value, have) is None,
        }[op]
        if not ok:
            return False
    return True
