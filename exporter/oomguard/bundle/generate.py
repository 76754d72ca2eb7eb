"""Render the bundle (rules, PrometheusRule) from its configuration with the shipped jinja2 templates."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import yaml

from oomguard.bundle import dashboards
from oomguard.bundle.bundle_config import BundleConfig, grouping, seconds
from oomguard.common import kinds
from oomguard.common import thresholds as pages

ALERTS_FILE = "oomguard-alerts.yaml"
RECORDS_FILE = "oomguard-records.yaml"
PROMETHEUS_RULE_FILE = "oomguard-prometheusrule.yaml"
# The kustomize base (docs/kubernetes.md) and its copy of the PrometheusRule.
KUBERNETES_DIR = Path("deploy") / "kubernetes"
KUBERNETES_CLUSTER_DIR = Path("deploy") / "kubernetes-cluster"  # the cluster mode's base (a Deployment)
KUBERNETES_PROMETHEUS_RULE_FILE = "prometheusrule.yaml"


def _environment(config: BundleConfig) -> jinja2.Environment:
    # PromQL and Prometheus' own templates use {{ }}: ours use [[ ]] and [% %].
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("oomguard.bundle", "templates"),
        variable_start_string="[[", variable_end_string="]]", block_start_string="[%", block_end_string="%]",
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False,
    )  # fmt: skip
    selector = config.selector
    clock = config.clock

    def s(extra: str = "") -> str:
        return "{" + ",".join(m for m in (selector, extra) if m) + "}"

    def by(*labels: str) -> str:
        """The labels of a by() or on(): the fleet's (cluster, ...), the group's (job, instance), then `labels`."""
        return ", ".join(grouping(config, *labels))

    def secs(duration: str) -> int:
        return max(1, round(clock.real(seconds(duration))))

    def dur(duration: str) -> str:
        return f"{secs(duration)}s" if clock.compressed else duration

    def sampled(window: str, step: str = "1m") -> str:
        """A subquery's `[range:step]` over `window`, its range half a step short: rules are evaluated on the step's
        grid (always in promtool), where a range of whole steps starts on a step, which Prometheus 2 reads and 3
        (left-open) does not. Half a step short, both read the same steps (docs/prometheus-versions.md)."""
        ms = secs(window) * 1000 - secs(step) * 500
        return f"[{ms // 1000}s:{dur(step)}]" if ms % 1000 == 0 else f"[{ms}ms:{dur(step)}]"

    def scaled(value: float) -> str:
        """A threshold in seconds, in the bundle's time scale."""
        return f"{clock.real(float(value)):g}"

    def per_real(value: float) -> str:
        """A pace threshold written per unit of the scenario's time (a slope per minute), per real one; as
        written in the bundle's time scale 1."""
        return f"{clock.rate(float(value)):g}" if clock.compressed else str(value)

    def value_of(metric: str, *labels: str) -> str:
        """A Prometheus template: the value of `metric` for the alert's own grouping labels and `labels`, humanized
        as a duration (an absent label is matched as absent: `cluster=""`)."""
        names = grouping(config, *labels)
        matchers = ",".join(f"{name}=%q" for name in names)
        args = " ".join(f"$labels.{name}" for name in names)
        query = f'with printf "{metric}{{{matchers}}}" {args} | query'
        return "{{ " + query + " }}{{ . | first | value | humanizeDuration }}{{ end }}"

    def when() -> str:
        """A Prometheus template: ", around <time>" for an alert whose value is seconds to come (the time to full)."""
        return (
            ', around {{ with printf "time() + %f" $value | query }}{{ . | first | value | humanizeTimestamp }}'
            "{{ end }}"
        )

    def full_at(metric: str, *labels: str, **fixed: str) -> str:
        """A Prometheus template: "At this pace full in <duration>. " where the alert's own series of `metric` (the
        trend's time to full, which exists only while it climbs) has a value; nothing otherwise. `fixed` pins labels
        the alert does not carry (a target's time to full has one series per memory: its GPUs and the host)."""
        names = grouping(config, *labels)
        matchers = ",".join(f"{name}=%q" for name in [*names, *fixed])
        args = " ".join([f"$labels.{name}" for name in names] + [f'"{value}"' for value in fixed.values()])
        return (
            '{{ with printf "' + metric + "{" + matchers + '}" ' + args + " | query }}At this pace full in "
            "{{ . | first | value | humanizeDuration }}. {{ end }}"
        )

    alerts = config.alerts.model_dump(by_alias=True)

    def threshold(key: str, basis: str) -> object:
        """The threshold a declared page (common/thresholds.py) compares on `basis`, from the configuration: the one the
        status page and diagnose judge with."""
        return alerts[key][pages.BY_KEY[key].thresholds[basis]]

    def hysteresis(key: str) -> str:
        """A declared page's `for:` and `keep_firing_for:` lines, as its declaration names them (none: none)."""
        return "".join(f"\n        {name}: {dur(alerts[key][name])}" for name in pages.BY_KEY[key].hysteresis)

    def runbook(alert: str) -> str:
        return f"{config.runbook_base_url}#{alert.lower()}"

    # A YAML double-quoted scalar (JSON's syntax is a subset), without jinja's HTML escapes.
    env.filters["q"] = lambda value: json.dumps(str(value), ensure_ascii=False)
    # The alerts as their YAML keys (`a.queue_backlog.for`); the event kinds as named in common/kinds.py.
    env.globals.update(
        s=s, by=by, secs=secs, dur=dur, sampled=sampled, scaled=scaled, per_real=per_real, runbook=runbook, when=when,
        full_at=full_at, pct=lambda r: f"{float(r) * 100:g} %", value_of=value_of, threshold=threshold,
        hysteresis=hysteresis, prefix=config.prefix, a=alerts, extra_labels=config.extra_labels,
        kinds=kinds, kind_matcher=kinds.kind_matcher,
    )  # fmt: skip
    return env


def render(config: BundleConfig) -> dict[str, str]:
    """File name -> content, for every rule file of the bundle."""
    env = _environment(config)
    alerts = env.get_template("alerts.yaml.j2").render()
    records = env.get_template("records.yaml.j2").render()
    resource = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": config.prometheus_rule.name,
            "namespace": config.prometheus_rule.namespace,
            "labels": dict(config.prometheus_rule.labels),
        },
        "spec": {"groups": yaml.safe_load(records)["groups"] + yaml.safe_load(alerts)["groups"]},
    }
    header = "# Generated by `oomguard generate` from the bundle configuration: do not edit by hand.\n"
    return {
        ALERTS_FILE: alerts,
        RECORDS_FILE: records,
        PROMETHEUS_RULE_FILE: header + yaml.safe_dump(resource, sort_keys=False, width=1000),
    }


def write(config: BundleConfig, output: Path) -> list[Path]:
    """Rules into OUTPUT/rules/, dashboards into OUTPUT/dashboards/, and the copies the Kubernetes manifests load.

    kustomize reads no file outside its own folder, so deploy/kubernetes/ and deploy/kubernetes-cluster/ hold the
    PrometheusRule and the dashboards' JSON themselves: the same text as rules/ and dashboards/, written here so
    that they cannot drift.
    """
    rules, boards = render(config), dashboards.render(config)
    outputs = (
        (Path("rules"), rules),
        (Path("dashboards"), boards),
        (KUBERNETES_DIR, {KUBERNETES_PROMETHEUS_RULE_FILE: rules[PROMETHEUS_RULE_FILE]}),
        (KUBERNETES_DIR / "dashboards", boards),
        (KUBERNETES_CLUSTER_DIR, {KUBERNETES_PROMETHEUS_RULE_FILE: rules[PROMETHEUS_RULE_FILE]}),
        (KUBERNETES_CLUSTER_DIR / "dashboards", boards),
    )
    written = []
    for folder, files in outputs:
        (output / folder).mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            path = output / folder / name
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written
