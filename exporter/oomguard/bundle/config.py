"""The bundle configuration: shipped defaults, deep-merged with the user's file; unknown keys refused."""

from __future__ import annotations

import copy
import difflib
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from oomguard.config import ConfigError

SEVERITIES = ("critical", "warning", "info")
_DURATION = re.compile(r"^(\d+)(s|m|h|d)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def defaults_text() -> str:
    return resources.files("oomguard.bundle").joinpath("defaults.yaml").read_text("utf-8")


def _merge(base: dict[str, Any], override: dict[str, Any], path: str) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        where = f"{path}.{key}" if path else key
        if key not in base:
            # extra_labels and prometheus_rule.labels are free-form; everything else is a known key.
            if path in ("extra_labels", "prometheus_rule.labels"):
                out[key] = value
                continue
            close = difflib.get_close_matches(key, list(base), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(base)}"
            raise ConfigError(f"bundle configuration: unknown key {where!r}; {hint}")
        if isinstance(base[key], dict) and isinstance(value, dict):
            out[key] = _merge(base[key], value, where)
        else:
            out[key] = value
    return out


def seconds(duration: str, where: str = "duration") -> int:
    match = _DURATION.match(str(duration))
    if not match:
        raise ConfigError(f"bundle configuration: {where}: {duration!r} is not a duration like 30s, 5m, 1h")
    return int(match.group(1)) * _UNITS[match.group(2)]


def load_bundle_config(path: Path | None = None) -> dict[str, Any]:
    config = yaml.safe_load(defaults_text())
    if path is not None:
        try:
            override = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the bundle configuration: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(override, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        config = _merge(config, override, "")
    _check(config)
    return config


def _check(config: dict[str, Any]) -> None:
    if not re.fullmatch(r"([A-Z][a-z0-9]+)+", str(config["prefix"])):
        raise ConfigError(f"bundle configuration: prefix {config['prefix']!r} must be CamelCase, e.g. OomGuard")
    if float(config["time_scale"]) <= 0:
        raise ConfigError("bundle configuration: time_scale must be above 0 (1 in production)")
    for name, alert in config["alerts"].items():
        if alert.get("severity") not in SEVERITIES:
            severity = alert.get("severity")
            raise ConfigError(
                f"bundle configuration: alerts.{name}.severity {severity!r} is not one of {', '.join(SEVERITIES)}"
            )
        for key in ("for", "window", "horizon"):
            if key in alert:
                seconds(alert[key], f"alerts.{name}.{key}")
