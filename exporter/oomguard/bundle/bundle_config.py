"""The bundle configuration: typed like the exporter's, its defaults in defaults.yaml only.

`load_bundle_config` deep-merges the user's file over the shipped defaults.yaml (a user setting
`alerts.gpu_memory_high.threshold` keeps that alert's other keys), then validates the result with
the models below: unknown keys are refused with a did-you-mean, except in the free-form label maps.
The models hold no default values: every key's default, and its documentation, is in defaults.yaml.
"""

from __future__ import annotations

import copy
import re
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BeforeValidator, Field, ValidationError, field_validator, model_validator

from oomguard.common.time_scale import TimeScale
from oomguard.exporter.config import ConfigError, StrictModel, explain, read_yaml

Severity = Literal["critical", "warning", "info"]
_DURATION = re.compile(r"^(\d+)(s|m|h|d)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _duration(value: Any) -> Any:
    if not isinstance(value, str) or not _DURATION.match(value):
        raise ValueError("not a duration like 30s, 5m, 1h or 1d")
    return value


def _label_value(value: Any) -> Any:
    """A label value is a string; a YAML number or boolean is taken as written (1 -> "1")."""
    if isinstance(value, bool | int | float):
        return str(value)
    return value


# A Prometheus duration as the rules write it: a number and one unit.
Duration = Annotated[str, BeforeValidator(_duration)]
Ratio = Annotated[float, Field(gt=0, le=1)]
LabelValue = Annotated[str, BeforeValidator(_label_value)]


class _Alert(StrictModel):
    severity: Severity


class _Sustained(_Alert):
    """Fires once its condition has held `for` this long."""

    for_: Duration = Field(alias="for")


class _Held(_Sustained):
    """Once firing, keeps firing `keep_firing_for` after its condition stops (Prometheus 2.42 and later): memory
    that hovers at a line is one alert, not one an hour."""

    keep_firing_for: Duration


class _Recent(_Alert):
    """Fires while its event happened within `window`."""

    window: Duration


class ThresholdAlert(_Sustained):
    threshold: Ratio


class GpuMemoryAlert(_Held):
    """`threshold` judges used/total on a GPU without a known reservation, `headroom_threshold` the share of the
    headroom left by the engines' reservation that is in use, on a GPU with one."""

    threshold: Ratio
    headroom_threshold: Ratio


class ClimbingAlert(_Held):
    """A climb that fills later than `slow_beyond` is ticketed once it has lasted `slow_for`."""

    slow_beyond: Duration
    slow_for: Duration
    new_high_margin: float = Field(ge=0, lt=1)  # on a GPU judged on its total: above the day before's highest by this


class OverBudgetAlert(_Held):
    margin_ratio: float = Field(ge=0, lt=1)


class ClimbingPredictedAlert(_Held):
    min_level: float = Field(ge=0, lt=1)
    window: Duration
    still_rising: Duration  # the slope must hold over this recent span too: a load's ramp is over, a leak is not
    horizon: Duration


class ExhaustedSoonAlert(_Held):
    seconds: float = Field(gt=0)
    min_total_ratio: Ratio  # on a GPU judged on its total: paged only above this


class RestartCountAlert(_Recent):
    count: int = Field(ge=1)


class ProbeAlert(_Alert):
    probe_initial_delay_seconds: int = Field(gt=0)


class QueueBacklogAlert(_Sustained):
    threshold: int = Field(ge=0)


class EventSourceErrorsAlert(_Sustained):
    window: Duration


def _setting_name(value: Any) -> Any:
    if not isinstance(value, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", value):
        raise ValueError("not a setting as oomguard_engine_setting names it: lower case and _, e.g. max_num_seqs")
    return value


SettingName = Annotated[str, BeforeValidator(_setting_name)]


class ConcurrencyOverKvCacheAlert(_Sustained):
    """An engine's concurrency cap against the requests its KV cache holds, with its reservation high."""

    window: Duration
    quantile: Ratio
    min_running: int = Field(ge=1)
    min_kv_usage: Ratio
    min_loaded: Duration
    margin_ratio: float = Field(ge=0)
    reservation_threshold: Ratio
    require_preemptions: bool
    concurrency_settings: tuple[SettingName, ...]
    reservation_settings: tuple[SettingName, ...]

    @model_validator(mode="after")
    def _loaded_within_window(self) -> ConcurrencyOverKvCacheAlert:
        if not self.concurrency_settings or not self.reservation_settings:
            raise ValueError("concurrency_settings and reservation_settings: name at least one setting each")
        if seconds(self.min_loaded) > seconds(self.window):
            raise ValueError(f"min_loaded {self.min_loaded} is longer than window {self.window}: it could never hold")
        if seconds(self.min_loaded) < 60:
            raise ValueError(f"min_loaded {self.min_loaded}: at least 1m (the capacity is sampled every minute)")
        return self


class Alerts(StrictModel):
    """One field per alert (its key in defaults.yaml), each with the keys that alert reads."""

    gpu_memory_high: GpuMemoryAlert
    gpu_memory_critical: GpuMemoryAlert
    over_budget: OverBudgetAlert
    memory_climbing: ClimbingAlert
    memory_climbing_predicted: ClimbingPredictedAlert
    exhausted_soon: ExhaustedSoonAlert
    oom_event: _Recent
    kernel_oom_kill: _Recent
    restart_storm: RestartCountAlert
    restarts_without_oom: RestartCountAlert
    startup_slower_than_probe: ProbeAlert
    queue_backlog: QueueBacklogAlert
    kv_cache_saturated: ThresholdAlert
    requests_refused: _Sustained
    low_headroom_config: ThresholdAlert
    concurrency_over_kv_cache: ConcurrencyOverKvCacheAlert
    exporter_down: _Sustained
    target_down: _Sustained
    target_loading_long: _Sustained
    gpu_lost: _Sustained
    nvml_down: _Sustained
    source_failing: _Sustained
    dcgm_pod_refused: _Recent
    dcgm_node_conflict: _Sustained
    event_source_errors: EventSourceErrorsAlert
    event_source_reads_nothing: _Sustained
    engine_figure_missing: _Sustained
    xid_error: _Recent


class PrometheusRuleConfig(StrictModel):
    name: str = Field(min_length=1)
    namespace: str = Field(min_length=1)
    labels: dict[str, LabelValue]  # Kubernetes labels: free-form


class BundleConfig(StrictModel):
    prefix: str
    selector: str
    extra_labels: dict[str, LabelValue]  # free-form: any label name
    runbook_base_url: str
    group_labels: tuple[str, ...]
    fleet_labels: tuple[str, ...]
    time_scale: float = Field(gt=0, allow_inf_nan=False)
    prometheus_rule: PrometheusRuleConfig
    alerts: Alerts

    @property
    def clock(self) -> TimeScale:
        """The clock the rules judge on (`time_scale`: a drill's compressed one; 1 in production)."""
        return TimeScale(self.time_scale)

    @field_validator("prefix")
    @classmethod
    def _camel_case(cls, value: str) -> str:
        if not re.fullmatch(r"([A-Z][a-z0-9]+)+", value):
            raise ValueError("must be CamelCase, e.g. OomGuard: it is the first word of every alert name")
        return value

    @field_validator("selector")
    @classmethod
    def _no_braces(cls, value: str) -> str:
        if value.strip().startswith("{"):
            raise ValueError('write the label matchers without braces, e.g. job="oomguard"')
        return value

    @field_validator("extra_labels", "group_labels", "fleet_labels")
    @classmethod
    def _label_names(cls, value: Any) -> Any:
        for name in value:
            if not _LABEL_NAME.match(name):
                raise ValueError(f"{name!r} is not a Prometheus label name (letters, digits and _)")
            if name == "severity" and isinstance(value, dict):
                raise ValueError("severity is set per alert: alerts.<name>.severity")
        return value


def grouping(config: BundleConfig, *labels: str) -> list[str]:
    """The labels of every by() and on() of the rules and dashboards: the fleet's first (cluster, ...), so that behind
    Thanos or Mimir two clusters' series of the same job, instance and target are never summed or matched together;
    then the group's (job, instance), then `labels`; each label once."""
    return list(dict.fromkeys([*config.fleet_labels, *config.group_labels, *labels]))


def defaults_text() -> str:
    return resources.files("oomguard.bundle").joinpath("defaults.yaml").read_text("utf-8")


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` over `base`, mapping into mapping; a key left empty (`alerts:` alone) keeps the default."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(out.get(key), dict) and isinstance(value, dict):
            out[key] = _merge(out[key], value)
        elif not (value is None and isinstance(out.get(key), dict)):
            out[key] = value
    return out


def seconds(duration: str, where: str = "duration") -> int:
    match = _DURATION.match(str(duration))
    if not match:
        raise ConfigError(f"bundle configuration: {where}: {duration!r} is not a duration like 30s, 5m, 1h or 1d")
    return int(match.group(1)) * _UNITS[match.group(2)]


def load_bundle_config(path: Path | None = None) -> BundleConfig:
    """The shipped defaults with the file at `path` (if any) merged over them, validated."""
    raw = yaml.safe_load(defaults_text())
    source = "bundle defaults"
    if path is not None:
        source = str(path)
        override = read_yaml(path, "bundle configuration") or {}
        if not isinstance(override, dict):
            raise ConfigError(f"{path}: the top level must be a mapping (keys such as alerts:, selector:)")
        raw = _merge(raw, override)
    try:
        return BundleConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(explain(exc, source, BundleConfig, "bundle configuration")) from None
