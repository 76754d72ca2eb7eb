"""The generated bundle: style rules, drift, and a non-default configuration changing exactly what it should."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel
from support import REPO

from oomguard.bundle.bundle_config import BundleConfig, defaults_text, load_bundle_config
from oomguard.bundle.generate import ALERTS_FILE, PROMETHEUS_RULE_FILE, RECORDS_FILE, render
from oomguard.cli import main
from oomguard.common import kinds
from oomguard.common.kinds import kind_matcher
from oomguard.common.time_scale import TimeScale
from oomguard.exporter.config import ConfigError

NAME = re.compile(r"^([A-Z]+[a-z0-9]+)+$")
RECORD = re.compile(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")


def rules(text: str) -> list[dict]:
    return [rule for group in yaml.safe_load(text)["groups"] for rule in group["rules"]]


@pytest.fixture(scope="module")
def default() -> dict[str, str]:
    return render(load_bundle_config())


def test_committed_rules_are_what_the_generator_makes(default: dict[str, str]) -> None:
    for name, text in default.items():
        assert (REPO / "rules" / name).read_text() == text, f"rules/{name} is stale: run make generate"


def test_alert_style(default: dict[str, str]) -> None:
    alerts = rules(default[ALERTS_FILE])
    assert len(alerts) >= 20
    names = [a["alert"] for a in alerts]
    assert len(set(names)) == len(names)
    for alert in alerts:
        name = alert["alert"]
        assert NAME.match(name) and name.startswith("OomGuard"), name
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), name
        summary, description = alert["annotations"]["summary"], alert["annotations"]["description"]
        assert summary[0].isupper() and summary.endswith(".") and "{{" not in summary, (name, summary)
        assert "{{" in description and "$labels" in description, (name, description)
        assert alert["annotations"]["runbook_url"].endswith("runbooks.md#" + name.lower()), name
        assert 'job="oomguard"' in alert["expr"], name


def test_record_names_follow_level_metric_operation(default: dict[str, str]) -> None:
    for record in rules(default[RECORDS_FILE]):
        assert RECORD.match(record["record"]), record["record"]
        assert 'job="oomguard"' in record["expr"]


def test_prometheus_rule_resource_holds_every_rule(default: dict[str, str]) -> None:
    resource = yaml.safe_load(default[PROMETHEUS_RULE_FILE])
    assert resource["apiVersion"] == "monitoring.coreos.com/v1" and resource["kind"] == "PrometheusRule"
    assert resource["metadata"]["labels"] == {"role": "alert-rules", "release": "kube-prometheus-stack"}
    in_resource = [r for g in resource["spec"]["groups"] for r in g["rules"]]
    assert in_resource == rules(default[RECORDS_FILE]) + rules(default[ALERTS_FILE])


def test_non_default_configuration_changes_exactly_what_it_should(tmp_path: Path, default: dict[str, str]) -> None:
    custom = tmp_path / "bundle.yaml"
    custom.write_text(
        'selector: \'job="gpu-exporter",cluster="prod"\'\n'
        "extra_labels: {team: inference}\n"
        "alerts:\n"
        "  gpu_memory_high: {threshold: 0.85, for: 10m}\n"
        "  queue_backlog: {severity: critical}\n"
    )
    theirs = {a["alert"]: a for a in rules(render(load_bundle_config(custom))[ALERTS_FILE])}
    ours = {a["alert"]: a for a in rules(default[ALERTS_FILE])}
    assert theirs.keys() == ours.keys()
    for name, alert in ours.items():
        expected = yaml.safe_load(yaml.safe_dump(alert))
        expected["expr"] = alert["expr"].replace('job="oomguard"', 'job="gpu-exporter",cluster="prod"')
        expected["labels"]["team"] = "inference"
        if name == "OomGuardGpuMemoryHigh":
            expected["expr"] = expected["expr"].replace("> 0.9", "> 0.85")
            expected["for"] = "10m"
            expected["annotations"]["description"] = alert["annotations"]["description"].replace("90 %", "85 %")
        if name == "OomGuardQueueBacklog":
            expected["labels"]["severity"] = "critical"
        assert theirs[name] == expected, name


def test_time_scale_shortens_every_duration(tmp_path: Path, default: dict[str, str]) -> None:
    custom = tmp_path / "bundle.yaml"
    custom.write_text("time_scale: 60\n")
    scaled = {a["alert"]: a for a in rules(render(load_bundle_config(custom))[ALERTS_FILE])}
    assert scaled["OomGuardGpuMemoryHigh"]["for"] == "5s"  # 5m / 60
    assert "[10s]" in scaled["OomGuardOomEvent"]["expr"] and "offset 10s" in scaled["OomGuardOomEvent"]["expr"]
    assert "[15s]" in scaled["OomGuardRestartStorm"]["expr"]


def test_time_scale_judges_a_time_to_full_in_real_seconds(tmp_path: Path, default: dict[str, str]) -> None:
    """deriv() reads Prometheus' real timestamps: on a clock 30 times faster what is left over its pace is a time to
    full in real seconds, as the trend's oomguard_gpu_memory_seconds_to_full is (measured durations stay real,
    simulate/clock.py). Its horizon, ExhaustedSoon's and the slow climb's thresholds are real seconds on that clock
    too, and the slope is taken over the window and at the step of that clock."""
    custom = tmp_path / "bundle.yaml"
    custom.write_text("time_scale: 30\n")
    fast = {a["alert"]: a for a in rules(render(load_bundle_config(custom))[ALERTS_FILE])}
    life = {a["alert"]: a for a in rules(default[ALERTS_FILE])}
    horizon = re.compile(r"\)\) / deriv\(.*\[(\w+):(\w+)\]\) < ([0-9.e]+)\n")
    assert horizon.findall(life["OomGuardGpuMemoryClimbingPredicted"]["expr"]) == [("3570s", "1m", "86400")]
    assert horizon.findall(fast["OomGuardGpuMemoryClimbingPredicted"]["expr"]) == [("119s", "2s", "2880")]
    assert "[870s:1m]) > 0" in life["OomGuardGpuMemoryClimbingPredicted"]["expr"]
    assert "[29s:2s]) > 0" in fast["OomGuardGpuMemoryClimbingPredicted"]["expr"]
    clock = TimeScale(30.0)
    for name, written in (("OomGuardGpuMemoryExhaustedSoon", 2700), ("OomGuardGpuMemoryClimbing", 21600)):
        assert f'seconds_to_full{{job="oomguard"}} < {written}\n' in life[name]["expr"], name
        assert f'seconds_to_full{{job="oomguard"}} < {clock.real(written):g}\n' in fast[name]["expr"], name


def test_an_infinite_time_scale_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bundle.yaml"
    path.write_text("time_scale: .inf\n")
    with pytest.raises(ConfigError, match="time_scale"):
        load_bundle_config(path)


GROUPINGS = re.compile(r"\b(by|on)\s*\(([^()]*)\)")


def groupings(expr: str) -> list[list[str]]:
    """The label lists of every by() and on() of a PromQL expression."""
    return [[label.strip() for label in labels.split(",") if label.strip()] for _, labels in GROUPINGS.findall(expr)]


def test_every_grouping_keeps_the_fleet_labels(default: dict[str, str]) -> None:
    """Behind Thanos or Mimir, two clusters' series of the same job, instance and target must not be summed or
    matched together, nor an HA pair's two exporters (replica): every by() and on() of every rule starts with the
    fleet labels (cluster, replica)."""
    found = 0
    for name in (ALERTS_FILE, RECORDS_FILE):
        for rule in rules(default[name]):
            for labels in groupings(rule["expr"]):
                found += 1
                wanted = ["cluster", "replica", "job", "instance"]
                assert labels[:4] == wanted, (rule.get("alert") or rule.get("record"), labels)
    assert found >= 12


def test_fleet_labels_are_configurable(tmp_path: Path, default: dict[str, str]) -> None:
    custom = tmp_path / "bundle.yaml"
    custom.write_text("fleet_labels: [cluster, replica, region]\n")
    theirs = render(load_bundle_config(custom))
    for name in (ALERTS_FILE, RECORDS_FILE):
        expected = default[name].replace("cluster, replica, job, instance", "cluster, replica, region, job, instance")
        # The startup alert's description looks the pod's grace up by the same labels.
        expected = expected.replace("replica=%q,job=%q", "replica=%q,region=%q,job=%q")
        expected = expected.replace("$labels.replica $labels.job", "$labels.replica $labels.region $labels.job")
        assert theirs[name] == expected
    # None: the rules of a single Prometheus, as before fleets; a label in both lists is written once.
    custom.write_text("fleet_labels: []\n")
    assert "cluster" not in render(load_bundle_config(custom))[ALERTS_FILE]
    custom.write_text("fleet_labels: [instance]\n")
    for rule in rules(render(load_bundle_config(custom))[ALERTS_FILE]):
        assert all(len(labels) == len(set(labels)) for labels in groupings(rule["expr"])), rule["alert"]


def test_startup_alert_judges_each_pod_on_its_own_grace(default: dict[str, str]) -> None:
    alert = next(a for a in rules(default[ALERTS_FILE]) if a["alert"] == "OomGuardStartupSlowerThanProbe")
    expr = alert["expr"]
    grace = 'oomguard_target_probe_grace_seconds{job="oomguard"}'
    assert f"> on(cluster, replica, job, instance, target) group_left {grace}" in expr
    assert f"> 60\n  unless on(cluster, replica, job, instance, target) {grace}" in expr
    assert '"grace", "pod"' in expr and '"grace", "bundle"' in expr
    # The fallback follows the bundle's setting and its time scale; the pod's own grace is never scaled.
    custom = {"probe_initial_delay_seconds": 120}
    assert "> 120\n" in _startup_expr(custom, 1)
    assert "> 2\n" in _startup_expr(custom, 60) and f"group_left {grace}" in _startup_expr(custom, 60)


def _startup_expr(settings: dict, time_scale: float) -> str:
    config = load_bundle_config().model_copy(update={"time_scale": time_scale})
    alerts = config.alerts.model_copy(
        update={
            "startup_slower_than_probe": config.alerts.startup_slower_than_probe.model_copy(update=settings),
        }
    )
    config = config.model_copy(update={"alerts": alerts})
    return next(a for a in rules(render(config)[ALERTS_FILE]) if a["alert"] == "OomGuardStartupSlowerThanProbe")["expr"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("selectr: x\n", "\n  selectr: unknown key; did you mean 'selector'?"),
        (
            "alerts:\n  gpu_memory_hgh: {threshold: 0.8}\n",
            "\n  alerts.gpu_memory_hgh: unknown key; did you mean 'gpu_memory_high'?",
        ),
        (
            "alerts:\n  gpu_memory_high: {treshold: 0.8}\n",
            "\n  alerts.gpu_memory_high.treshold: unknown key; did you mean 'threshold'?",
        ),
        # `for` is a field alias: the Python name is not a key of the file.
        ("alerts:\n  queue_backlog: {for_: 5m}\n", "\n  alerts.queue_backlog.for_: unknown key; did you mean 'for'?"),
        (
            "alerts:\n  gpu_memory_high: {severity: page}\n",
            "\n  alerts.gpu_memory_high.severity: must be one of 'critical', 'warning' or 'info' (got 'page')",
        ),
        (
            "alerts:\n  gpu_memory_high: {for: 5 minutes}\n",
            "\n  alerts.gpu_memory_high.for: not a duration like 30s, 5m, 1h or 1d (got '5 minutes')",
        ),
        ("alerts:\n  oom_event: {window: 600}\n", "\n  alerts.oom_event.window: not a duration like"),
        (
            "alerts:\n  gpu_memory_high: {threshold: 90}\n",
            "\n  alerts.gpu_memory_high.threshold: must be at most 1; write a ratio from 0 to 1",
        ),
        ("prefix: oom_guard\n", "\n  prefix: must be CamelCase, e.g. OomGuard"),
        ("time_scale: 0\n", "\n  time_scale: must be greater than 0; write a number above 0"),
        ("extra_labels: {bad-name: x}\n", "\n  extra_labels: 'bad-name' is not a Prometheus label name"),
        ("extra_labels: {severity: page}\n", "\n  extra_labels: severity is set per alert"),
        ("fleet_labels: [cluster, bad-name]\n", "\n  fleet_labels: 'bad-name' is not a Prometheus label name"),
        ("selector: '{job=\"x\"}'\n", "\n  selector: write the label matchers without braces"),
        (
            "alerts:\n  concurrency_over_kv_cache: {min_loaded: 2h}\n",
            "\n  alerts.concurrency_over_kv_cache: min_loaded 2h is longer than window 1h: it could never hold",
        ),
        (
            "alerts:\n  concurrency_over_kv_cache: {concurrency_settings: [Max-Seqs]}\n",
            "\n  alerts.concurrency_over_kv_cache.concurrency_settings[0]: not a setting as oomguard_engine_setting",
        ),
        (
            "alerts:\n  concurrency_over_kv_cache: {reservation_settings: []}\n",
            "\n  alerts.concurrency_over_kv_cache: concurrency_settings and reservation_settings: name at least one",
        ),
    ],
)
def test_bad_bundle_configuration_is_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bundle.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        load_bundle_config(path)
    assert str(caught.value).startswith(f"{path}: the bundle configuration is not valid:\n  ")


def test_every_error_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "bundle.yaml"
    path.write_text("prefx: X\ntime_scale: 0\nalerts: {gpu_memory_high: {severity: page}}\n")
    with pytest.raises(ConfigError) as caught:
        load_bundle_config(path)
    assert len(str(caught.value).splitlines()) == 1 + 3


def test_partial_override_keeps_the_other_keys(tmp_path: Path) -> None:
    default = load_bundle_config()
    path = tmp_path / "bundle.yaml"
    path.write_text("alerts:\n  gpu_memory_high: {threshold: 0.8}\nprometheus_rule: {namespace: obs}\n")
    config = load_bundle_config(path)
    assert config.alerts.gpu_memory_high.threshold == 0.8
    assert config.alerts.gpu_memory_high.for_ == default.alerts.gpu_memory_high.for_ == "5m"
    assert config.alerts.gpu_memory_high.severity == default.alerts.gpu_memory_high.severity
    assert config.alerts.model_dump(exclude={"gpu_memory_high"}) == default.alerts.model_dump(
        exclude={"gpu_memory_high"}
    )
    assert config.prometheus_rule.namespace == "obs"
    assert config.prometheus_rule.name == default.prometheus_rule.name
    assert config.prometheus_rule.labels == default.prometheus_rule.labels
    assert config.model_dump(exclude={"alerts", "prometheus_rule"}) == default.model_dump(
        exclude={"alerts", "prometheus_rule"}
    )


def test_an_empty_section_keeps_its_defaults(tmp_path: Path) -> None:
    path = tmp_path / "bundle.yaml"
    path.write_text("alerts:\n  # gpu_memory_high: {threshold: 0.8}\n")
    assert load_bundle_config(path) == load_bundle_config()


def test_label_maps_are_free_form(tmp_path: Path) -> None:
    path = tmp_path / "bundle.yaml"
    path.write_text(
        "extra_labels: {team: inference, any_label_at_all: x, tier: 1}\n"
        "prometheus_rule:\n  labels: {app.kubernetes.io/part-of: oomguard}\n"
    )
    config = load_bundle_config(path)
    assert config.extra_labels == {"team": "inference", "any_label_at_all": "x", "tier": "1"}
    # Merged over the shipped labels, as every mapping is.
    assert config.prometheus_rule.labels == {
        "role": "alert-rules",
        "release": "kube-prometheus-stack",
        "app.kubernetes.io/part-of": "oomguard",
    }
    alerts = rules(render(config)[ALERTS_FILE])
    assert all(a["labels"]["tier"] == "1" and a["labels"]["any_label_at_all"] == "x" for a in alerts)


def test_defaults_live_in_defaults_yaml_only() -> None:
    """The models have no default values: every key comes from defaults.yaml, which documents it."""

    def models(model: type[BaseModel]) -> Iterator[type[BaseModel]]:
        yield model
        for field in model.model_fields.values():
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
                yield from models(field.annotation)

    for model in models(BundleConfig):
        assert all(field.is_required() for field in model.model_fields.values()), model.__name__
    assert BundleConfig.model_validate(yaml.safe_load(defaults_text())).model_dump(
        mode="json", by_alias=True
    ) == yaml.safe_load(defaults_text())


def test_templates_take_event_kinds_from_kinds_py(default: dict[str, str]) -> None:
    templates = REPO / "exporter" / "oomguard" / "bundle" / "templates"
    for path in templates.glob("*.j2"):
        assert not re.search(r"kind=~?\"", path.read_text()), f"{path.name}: use kind_matcher(kinds.…)"
    assert kind_matcher(kinds.TARGET_OOM_KINDS) in default[RECORDS_FILE]
    oom_event = next(a for a in rules(default[ALERTS_FILE]) if a["alert"] == "OomGuardOomEvent")
    assert kind_matcher(kinds.LOG_OOM_KINDS) == 'kind=~"cuda_oom|startup_memory"'
    assert kind_matcher(kinds.LOG_OOM_KINDS) in oom_event["expr"]
    assert kind_matcher(kinds.XID) == 'kind="xid"'


def test_generate_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--print-defaults"]) == 0
    assert capsys.readouterr().out == defaults_text()
    assert main(["generate", "--output", str(tmp_path)]) == 0
    assert sorted(p.name for p in (tmp_path / "rules").iterdir()) == sorted(
        [ALERTS_FILE, RECORDS_FILE, PROMETHEUS_RULE_FILE]
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("nope: 1\n")
    assert main(["generate", "--config", str(bad), "--output", str(tmp_path)]) == 1
    assert "nope: unknown key" in capsys.readouterr().err
