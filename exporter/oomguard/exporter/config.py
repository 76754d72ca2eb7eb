"""The exporter's configuration: one typed model, read from YAML, checked at start.

Precedence, lowest first: built-in defaults, the YAML file, `OOMGUARD_*` environment
variables, command-line flags (see `cli.py`). Every error names the key and the fix.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from oomguard.common import bounded_yaml
from oomguard.common.excerpt import LIMIT, excerpt
from oomguard.common.ports import url_port
from oomguard.common.promtext import LABEL_LIMIT, LABEL_VALUE_LENGTH_LIMIT, SAMPLE_LIMIT, Limits
from oomguard.common.urls import url_problem
from oomguard.exporter.model import TrendSettings

DEFAULT_PORT = 9847
MAX_SHARDS = 1024  # a shard reads at least a node; more replicas than that is a typo
_TREND = TrendSettings()  # the analysis' defaults, written once there
DEFAULT_LISTEN_ADDRESS = f":{DEFAULT_PORT}"


class ConfigError(Exception):
    """A configuration that cannot run; the message names the key and the fix."""


# The sections the parts above check, each with its own knowledge (config_loader.py gives the checks, as the context
# of the validation): a name no engine plugin has, an engine without a simulator, a scenario that does not exist,
# a pattern that does not compile. Each check raises ValueError naming the fix; a model built without them (a test
# making a TargetConfig by hand) is checked for its shape only.
ENGINE = "engine"
SIMULATED_ENGINE = "simulated_engine"
SCENARIO = "scenario"
# Not a check: a scenario's name that says its engine too (the drill's `sglang-incident`) -> (scenario, engine), or
# None for any other name.
SCENARIO_ON_ENGINE = "scenario_on_engine"
PATTERN = "pattern"
PartChecks = Mapping[str, Callable[[Any], Any]]


def _part_check(info: ValidationInfo, section: str, value: Any) -> None:
    check = (info.context or {}).get(section)
    if check is not None:
        check(value)


class StrictModel(BaseModel):
    """Unknown keys refused, values frozen: the base of every configuration model (the bundle's too)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class WebConfig(StrictModel):
    listen_address: str = Field(
        DEFAULT_LISTEN_ADDRESS, description="HOST:PORT to serve on; ':PORT' means all addresses."
    )

    @field_validator("listen_address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        parse_listen_address(value)
        return value


class NvmlConfig(StrictModel):
    enabled: bool = Field(True, description="Read GPU memory through NVML.")
    timeout_seconds: float = Field(
        3.0, gt=0, description="Longest wait for one NVML read before the scrape goes on without it."
    )
    per_process: bool = Field(
        True, description="Export per-process GPU memory (a `pid` label: one series per process)."
    )


class PodLogsConfig(StrictModel):
    namespace: str = Field(description="Namespace of the pod.")
    pod: str = Field(description="Pod name, or a glob for a Deployment's pods (`vllm-*`).")
    container: str = Field(description="Container name.")


class PatternConfig(StrictModel):
    kind: str = Field(description="cuda_oom, startup_memory, engine_death, or startup (a new life: ends an incident).")
    regex: str = Field(
        description="Python regular expression, matched at the start of what `at` names (never anywhere in a line)."
    )
    at: Literal["record", "exception"] = Field(
        "record",
        description="record: the message of one of the engine's own log records; exception: the last line of a "
        "Python traceback (docs/events.md).",
    )
    source: str | None = Field(
        None, description="at: record only: a regex the record's logger or source file must match whole."
    )

    @model_validator(mode="after")
    def _compiles(self, info: ValidationInfo) -> PatternConfig:
        _part_check(info, PATTERN, self.model_dump())  # raises ValueError naming the pattern
        return self


class TargetConfig(StrictModel):
    url: str = Field(description="Base URL of the engine; /metrics and /health are appended.")
    name: str | None = Field(None, description="The `target` label; defaults to host:port of url.")
    engine: str = Field("vllm", description="Which engine serves at url.")
    gpus: tuple[int, ...] = Field(
        (), description="GPU indices the engine runs on; found from its processes when empty."
    )
    timeout_seconds: float | None = Field(
        None, gt=0, description="Per-target scrape timeout; defaults to scrape.timeout_seconds."
    )
    logs: tuple[str, ...] = Field((), description="Log files or globs of the engine, followed like tail -F.")
    follow_symlinks: bool = Field(
        False,
        description="Follow a file of `logs`, or a directory a wildcard of it matches, that is a symbolic link; "
        "off: skipped, and logged once (a link planted in a log folder is never read).",
    )
    journald_unit: str | None = Field(None, description="systemd unit whose journal is the engine's log.")
    k8s_pod_logs: PodLogsConfig | None = Field(None, description="The engine's container logs under /var/log/pods.")
    cgroup: str | None = Field(
        None,
        description="The engine's cgroup directory (v2, or v1's memory controller): its OOM kills are counted "
        "from its own counter, not from the kernel log.",
    )
    sample_limit: int | None = Field(None, gt=0, description="The target's own scrape.sample_limit.")
    label_value_length_limit: int | None = Field(
        None, gt=0, description="The target's own scrape.label_value_length_limit."
    )
    label_limit: int | None = Field(None, gt=0, description="The target's own scrape.label_limit.")
    local_process: Literal["auto", "yes", "no"] = Field(
        "auto",
        description="Find the engine's processes on this host (RSS, GPU memory by pid, "
        "restarts); auto means yes when url's host is a loopback address.",
    )

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if (problem := url_problem(value)) is not None:
            fix = "" if "://" not in value else "; write the engine's base URL, e.g. http://127.0.0.1:8000"
            raise ValueError(problem + fix)
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError as exc:
            raise ValueError(f"{value!r} has a bad port ({exc}); use 1-65535") from None
        if parts.path not in ("", "/"):
            raise ValueError(
                f"{value!r} has a path ({parts.path}); give the base URL only, "
                "oomguard appends /metrics and /health itself"
            )
        return value.rstrip("/")

    @field_validator("engine")
    @classmethod
    def _check_engine(cls, value: str, info: ValidationInfo) -> str:
        _part_check(info, ENGINE, value)
        return value

    @field_validator("gpus")
    @classmethod
    def _check_gpus(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(index < 0 for index in value):
            raise ValueError("GPU indices are 0 or more, as nvidia-smi numbers them")
        return value

    @property
    def label(self) -> str:
        return self.name or f"{urlsplit(self.url).hostname}:{self.port}"

    @property
    def port(self) -> int:
        """The port its URL reaches (its scheme's where the URL gives none)."""
        return url_port(self.url)

    @property
    def is_local(self) -> bool:
        if self.local_process != "auto":
            return self.local_process == "yes"
        host = urlsplit(self.url).hostname or ""
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False


class ScrapeConfig(StrictModel):
    timeout_seconds: float = Field(3.0, gt=0, description="Default per-target timeout.")
    max_body_bytes: int = Field(8 * 1024 * 1024, gt=0, description="Largest /metrics body read from a target.")
    sample_limit: int = Field(
        SAMPLE_LIMIT,
        gt=0,
        description="Most samples of the families oomguard reads in one target's body (as Prometheus's "
        'sample_limit); over it the reading is dropped whole and counted as kind="limit".',
    )
    label_value_length_limit: int = Field(
        LABEL_VALUE_LENGTH_LIMIT,
        gt=0,
        description="Longest label value in those samples, in characters; over it, the same.",
    )
    label_limit: int = Field(
        LABEL_LIMIT,
        gt=0,
        description="Most labels of one of those samples (as Prometheus's label_limit); over it, the same.",
    )


class SimulationConfig(StrictModel):
    scenario: str | None = Field(None, description="Run on a built-in simulation (`oomguard serve --help` lists them).")
    gpus: int = Field(1, ge=1, le=64, description="Number of simulated GPUs.")
    time_scale: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="Speed of the simulated clock (10 = ten simulated seconds per second).",
    )
    engine: str = Field(
        "vllm",
        description="Which engine the simulation runs: one with a simulator (docs/engines.md, Simulators); another is "
        "refused, naming those.",
    )
    gpu_source: Literal["nvml", "dcgm"] = Field(
        "nvml",
        description="nvml: the GPUs through a fake NVML, as a node agent reads them; dcgm: through a simulated "
        "dcgm-exporter beside the engine, as the cluster mode reads them (no per-process memory).",
    )
    dcgm_version: Literal["3.x", "4.10"] = Field(
        "3.x",
        description="With gpu_source dcgm, which dcgm-exporter the simulated one speaks: 3.x (memory in MiB under "
        "DCGM_FI_DEV_FB_USED, ..., `Hostname`) or 4.10 (4.9's naming: bytes under DCGM_FI_DEV_FB_USED_BYTES, ..., "
        "`hostname`, DCGM_FI_SYSTEM_DRIVER_VERSION).",
    )

    @model_validator(mode="before")
    @classmethod
    def _scenario_on_engine(cls, data: Any, info: ValidationInfo) -> Any:
        """`scenario: sglang-incident` is `scenario: incident-quick` on `engine: sglang`: one name for the drill and
        the simulation. Another engine written beside it contradicts the name."""
        resolve = (info.context or {}).get(SCENARIO_ON_ENGINE)
        name = data.get("scenario") if isinstance(data, dict) else None
        named = resolve(name) if resolve is not None and isinstance(name, str) else None
        if named is None:
            return data
        scenario, engine = named
        if data.get("engine", engine) != engine:
            raise ValueError(
                f"scenario {name!r} runs on the {engine} simulator, not engine {excerpt(str(data['engine']))!r}: "
                f"remove engine:, or write scenario: {scenario} to run the same scenario on another engine"
            )
        return {**data, "scenario": scenario, "engine": engine}

    @field_validator("engine")
    @classmethod
    def _simulated_engine(cls, value: str, info: ValidationInfo) -> str:
        _part_check(info, SIMULATED_ENGINE, value)
        return value

    @field_validator("scenario")
    @classmethod
    def _known_scenario(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:
            _part_check(info, SCENARIO, value)
        return value


class TrendConfig(StrictModel):
    """Thresholds of the trend analysis; their defaults are TrendSettings' and their meaning is in docs/trend.md."""

    enabled: bool = Field(True, description="Sample memory in the background and export trends.")
    interval_seconds: float = Field(
        _TREND.interval_seconds, gt=0, description="Sample interval, independent of scrapes."
    )
    short_window_seconds: float = Field(_TREND.short_window_seconds, gt=0)
    long_window_seconds: float = Field(
        _TREND.long_window_seconds, gt=0, description="History kept per series (bounded memory)."
    )
    tolerance_ratio: float = Field(_TREND.tolerance_ratio, gt=0, lt=1)
    climb_min_seconds: float = Field(_TREND.climb_min_seconds, gt=0)
    climb_soonest_seconds: float = Field(
        _TREND.climb_soonest_seconds,
        gt=0,
        description="A climb from its engine's start is called no sooner than this (never later than climb_min_seconds "
        "for it).",
    )
    climb_share_of_time_to_full: float = Field(
        _TREND.climb_share_of_time_to_full,
        gt=0,
        le=1,
        description="A climb from its engine's start is called once it has lasted this share of its time to full.",
    )
    climb_min_rise_ratio: float = Field(_TREND.climb_min_rise_ratio, gt=0, lt=1)
    climb_min_slope_ratio_per_minute: float = Field(_TREND.climb_min_slope_ratio_per_minute, gt=0)
    spike_rise_ratio: float = Field(_TREND.spike_rise_ratio, gt=0, lt=1)
    spike_level_ratio: float = Field(_TREND.spike_level_ratio, gt=0, le=1)
    saturated_ratio: float = Field(_TREND.saturated_ratio, gt=0, le=1)
    sawtooth_span_ratio: float = Field(_TREND.sawtooth_span_ratio, gt=0, lt=1)
    restart_drop_ratio: float = Field(_TREND.restart_drop_ratio, gt=0, le=1)
    analysis_interval_seconds: float = Field(
        10.0,
        ge=0,
        description="How often each series is analysed (its share of the ticks), at most a quarter of the short "
        "window; 0: every sample. Samples are taken every interval_seconds all the same.",
    )
    creep_period_seconds: float = Field(
        _TREND.creep_period_seconds, gt=0, description="The slow climb's point: each period's lowest reading."
    )
    creep_window_seconds: float = Field(
        _TREND.creep_window_seconds, gt=0, description="How far back the slow climb is judged (bounded memory)."
    )
    creep_min_seconds: float = Field(
        _TREND.creep_min_seconds, gt=0, description="A slow climb is called once it has lasted this long."
    )
    creep_min_rise_ratio: float = Field(
        _TREND.creep_min_rise_ratio, gt=0, lt=1, description="... and risen by this share of what was left."
    )
    creep_tolerance_ratio: float = Field(
        _TREND.creep_tolerance_ratio, gt=0, lt=1, description="A fall of the floor beyond this ends a slow climb."
    )
    creep_quiet_ratio: float = Field(
        _TREND.creep_quiet_ratio,
        gt=0,
        lt=1,
        description="Quiet enough to judge a slow climb: a quarter of the periods wobble less than this.",
    )
    creep_horizon_seconds: float = Field(
        _TREND.creep_horizon_seconds, gt=0, description="A slower climb than one filling what is left in this is none."
    )

    @model_validator(mode="after")
    def _windows(self) -> TrendConfig:
        if not self.interval_seconds * 10 <= self.short_window_seconds < self.long_window_seconds:
            raise ValueError(
                "need interval_seconds x 10 <= short_window_seconds < long_window_seconds, "
                f"got {self.interval_seconds:g}, {self.short_window_seconds:g}, {self.long_window_seconds:g}"
            )
        if not self.creep_min_seconds < self.creep_window_seconds:
            raise ValueError(
                "need creep_min_seconds < creep_window_seconds (a slow climb is judged within the window), "
                f"got {self.creep_min_seconds:g}, {self.creep_window_seconds:g}"
            )
        return self

    def settings(self) -> TrendSettings:
        return TrendSettings(**self.model_dump(exclude={"enabled"}))


class EventsConfig(StrictModel):
    from_start: bool = Field(False, description="On first start read logs from their beginning, not their end.")
    quiet_seconds: float = Field(5.0, gt=0, description="An incident ends after this long without a traceback line.")
    rearm_seconds: float = Field(
        60.0, gt=0, description="After a counted death, matching lines are the same death until a startup line or this."
    )
    poll_interval_seconds: float = Field(0.5, gt=0, description="How often the event sources are read.")
    patterns: tuple[PatternConfig, ...] = Field((), description="Patterns added to the shipped catalogue.")
    kernel_log: bool = Field(True, description="Count kernel OOM kills from the kernel log where readable.")
    kernel_log_path: str = Field("/dev/kmsg", description="The kernel log device.")
    k8s_pods_dir: str = Field("/var/log/pods", description="Where the kubelet writes container logs.")
    xid: bool = Field(
        True,
        description="Count GPU XID errors from NVML events (an event source with a thread of its own; its counts "
        "saved in `state_dir` with the others).",
    )


class KubernetesConfig(StrictModel):
    """Pod discovery (docs/kubernetes.md): the engine pods of this node (or, in the cluster mode, of the whole
    cluster) become targets named `namespace/pod`."""

    scope: Literal["node", "cluster"] = Field(
        "node",
        description="node: the pods of this node (a DaemonSet; GPUs from NVML, logs from /var/log/pods); "
        "cluster: every node's (one Deployment, no host access; GPUs from dcgm-exporter, logs through the API).",
    )
    label_selector: str = Field("", description="Which pods are engines (`app.kubernetes.io/name=vllm`); empty: all.")
    port: str | int = Field(description="The engine's container port: its name (`http`) or its number (8000).")
    engine: str = Field("vllm", description="Which engine the pods run.")
    node_name: str = Field(
        "", description="This node's name; empty: $NODE_NAME (the downward API's spec.nodeName, as deploy/ sets it)."
    )
    namespaces: tuple[str, ...] = Field((), description="Namespaces to watch; empty: all.")
    kubeconfig: str = Field(
        "", description="A kubeconfig file; empty: $KUBECONFIG, else the pod's service account, else ~/.kube/config."
    )
    resync_seconds: float = Field(300.0, gt=0, description="A full list this often, besides the watch.")
    retry_max_seconds: float = Field(30.0, gt=0, description="Longest wait between tries while the API fails.")
    proc_dir: str = Field("/proc", description="Where the host's processes are (NVML's pids to pods via cgroups).")
    shards: int = Field(
        1,
        ge=1,
        le=MAX_SHARDS,
        description="The cluster mode split over this many exporters, as kube-state-metrics splits (a StatefulSet of "
        "this many replicas, deploy/kubernetes-sharded): each reads the nodes whose name hashes to its shard, their "
        'engine pods and their dcgm-exporter (docs/kubernetes.md, "Sharding").',
    )
    shard: int | None = Field(
        None,
        ge=0,
        description="This exporter's shard, 0 to shards-1; empty: the ordinal that ends $POD_NAME (a StatefulSet "
        "pod's name: oomguard-2 is shard 2).",
    )
    handover: str = Field(
        "oomguard-shards",
        description="A sharded cluster mode (shards > 1, or a StatefulSet's pod: $POD_NAME ends in an ordinal): the "
        "ConfigMap, in the exporter's own namespace, through which a node that changes shard takes its log "
        'positions along (deploy/kubernetes-sharded ships it; docs/kubernetes.md, "Resharding"); empty: none, a '
        "node that changes shard is read from now by its new shard.",
    )

    @field_validator("engine")
    @classmethod
    def _check_engine(cls, value: str, info: ValidationInfo) -> str:
        _part_check(info, ENGINE, value)
        return value

    @field_validator("port")
    @classmethod
    def _check_port(cls, value: str | int) -> str | int:
        if isinstance(value, int) and not 1 <= value <= 65535:
            raise ValueError("a port number is 1-65535")
        if isinstance(value, str) and not value:
            raise ValueError("give the container port's name or number")
        return value

    @model_validator(mode="after")
    def _node(self) -> KubernetesConfig:
        if self.scope == "cluster":
            object.__setattr__(self, "shard", self._own_shard())
            return self  # every node's pods: no node of its own needed
        if self.shards > 1:
            raise ValueError("shards: only the cluster mode (scope: cluster) is sharded; a node agent reads its node")
        object.__setattr__(self, "shard", 0)
        if not self.node_name:
            node = os.environ.get("NODE_NAME", "")
            if not node:
                raise ValueError(
                    "node_name is empty and so is $NODE_NAME: set NODE_NAME from the downward API "
                    "(fieldRef spec.nodeName, as deploy/kubernetes/daemonset.yaml does) or node_name"
                )
            object.__setattr__(self, "node_name", node)
        return self

    def _own_shard(self) -> int:
        if self.shards == 1:
            if self.shard:
                raise ValueError(f"shard is {self.shard} but shards is 1: set shards to the number of replicas")
            return 0
        if self.shard is None:
            pod = os.environ.get("POD_NAME", "")
            ordinal = re.search(r"-(\d+)$", pod)
            if ordinal is None:
                raise ValueError(
                    f"shards is {self.shards} but shard is empty and $POD_NAME ({pod!r}) ends in no ordinal: run it "
                    "as a StatefulSet with POD_NAME from the downward API (fieldRef metadata.name, as "
                    "deploy/kubernetes-sharded does), or set shard"
                )
            shard, origin = int(ordinal.group(1)), f"$POD_NAME {pod!r}"
        else:
            shard, origin = self.shard, "shard"
        if shard >= self.shards:
            raise ValueError(
                f"{origin} makes this shard {shard}, but shards is {self.shards} (shards 0 to {self.shards - 1}): set "
                "shards to the StatefulSet's replicas"
            )
        return shard


_METRIC_NAME = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*$")


class DcgmFieldsConfig(StrictModel):
    """Which dcgm-exporter families hold each figure, each list tried in order (sources/dcgm_body.py's Fields holds
    the same defaults: 4.9's byte names, then 4.8's MiB ones). A DCGM name has its field's unit; another family's
    unit comes from its `# HELP` text, else its name (`_BYTES`: bytes; else MiB)."""

    used: tuple[str, ...] = Field(
        ("DCGM_FI_DEV_FB_USED_BYTES", "DCGM_FI_DEV_FB_USED"),
        min_length=1,
        description="Framebuffer memory used (4.9 and later: _BYTES, in bytes; 4.8 and earlier: MiB).",
    )
    free: tuple[str, ...] = Field(
        ("DCGM_FI_DEV_FB_FREE_BYTES", "DCGM_FI_DEV_FB_FREE"), min_length=1, description="Framebuffer memory free."
    )
    reserved: tuple[str, ...] = Field(
        ("DCGM_FI_DEV_FB_RESERVED_BYTES", "DCGM_FI_DEV_FB_RESERVED"), description="Framebuffer memory reserved."
    )
    total: tuple[str, ...] = Field(
        ("DCGM_FI_DEV_FB_CAPACITY_BYTES", "DCGM_FI_DEV_FB_TOTAL"),
        description="Total framebuffer memory (4.9 and later collect DCGM_FI_DEV_FB_CAPACITY_BYTES, in bytes); "
        "without one, used + free + reserved.",
    )

    @field_validator("used", "free", "reserved", "total")
    @classmethod
    def _names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not _METRIC_NAME.match(name):
                raise ValueError(f"{name[:80]!r} is not a metric name (letters, digits, _ and :)")
        return value


class DcgmConfig(StrictModel):
    """GPU memory from NVIDIA's dcgm-exporter instead of NVML (docs/kubernetes.md, "The modes")."""

    urls: tuple[str, ...] = Field(
        (),
        description="dcgm-exporter /metrics URLs whose GPUs are this exporter's own node's (a node agent that may not "
        "read NVML).",
    )
    discover: bool = Field(
        False,
        description="Find every node's dcgm-exporter pod through the Kubernetes API (the cluster mode; needs "
        "`kubernetes:`); its GPUs are that pod's node's.",
    )
    label_selector: str = Field(
        "app=nvidia-dcgm-exporter", description="Which pods are dcgm-exporter (the GPU Operator's label)."
    )
    namespaces: tuple[str, ...] = Field(
        (),
        validate_default=True,
        description="Where its pods run (the GPU Operator's: gpu-operator): only these are watched, and a pod is "
        "taken only from one of them; required with discover (a tenant can make a DaemonSet of any name in its own "
        "namespace).",
    )
    daemonsets: tuple[str, ...] = Field(
        ("nvidia-dcgm-exporter",),
        validate_default=True,
        description="A pod is taken as dcgm-exporter only when a DaemonSet of one of these names, in one of "
        "`namespaces`, controls it (a tenant's pod with the label is refused); required with discover.",
    )
    port: int = Field(9400, ge=1, le=65535, description="dcgm-exporter's port on its pod.")
    timeout_seconds: float = Field(5.0, gt=0, description="Longest wait for one dcgm-exporter's answer.")
    max_body_bytes: int = Field(
        4 * 1024 * 1024, gt=0, description="Largest body read from one dcgm-exporter (8 GPUs take about 55 KB)."
    )
    fields: DcgmFieldsConfig = Field(
        default_factory=DcgmFieldsConfig,
        description="The families of each memory figure, 4.9's byte names and 4.8's MiB ones read by default: add "
        'the names a counters CSV of your own writes (docs/kubernetes.md, "dcgm-exporter 4.9 and later").',
    )

    @field_validator("urls")
    @classmethod
    def _check_urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            if url_problem(url) is not None:
                raise ValueError(f"{url!r} is not an http(s) URL; give dcgm-exporter's, e.g. http://HOST:9400/metrics")
        return value

    # Whom the cluster mode trusts for a node's GPU figures holds with nothing configured: any tenant can create a
    # DaemonSet named like the GPU Operator's in its own namespace, so "every namespace" is never the default.
    @field_validator("namespaces", "daemonsets")
    @classmethod
    def _needed_to_discover(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        if value or not info.data.get("discover"):
            return value
        if info.field_name == "namespaces":
            raise ValueError(
                "is empty: name the namespaces where the GPU Operator runs dcgm-exporter (namespaces: "
                "[gpu-operator]); a pod in any other namespace, a tenant's, is never taken as a node's dcgm-exporter"
            )
        raise ValueError(
            "is empty: name the DaemonSets whose pods are dcgm-exporter (daemonsets: [nvidia-dcgm-exporter]); "
            "without one, any pod with the label would decide its node's GPU figures"
        )

    @model_validator(mode="after")
    def _one_way(self) -> DcgmConfig:
        if bool(self.urls) == self.discover:
            raise ValueError(
                "give dcgm-exporter's urls (a node agent) or discover: true (the cluster mode), one of them"
            )
        return self


class DiscoveryConfig(StrictModel):
    """Discovery of the engines running on this host (docs/engines.md, "Discovery of local engines")."""

    local: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Find local engines by their command lines; auto: on when no targets:, no kubernetes: "
        "and no simulation are configured.",
    )
    interval_seconds: float = Field(10.0, gt=0, description="How often the processes are listed.")
    forget_after_seconds: float = Field(
        600.0,
        gt=0,
        description="A discovered engine is dropped this long after the last process with its command line "
        "went (a restart keeps its target and its counts).",
    )

    @field_validator("local", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare on/off as true/false.
        if isinstance(value, bool):
            return "on" if value else "off"
        if value not in ("auto", "on", "off"):
            raise ValueError("write auto, on or off")
        return value


class Config(StrictModel):
    state_dir: str | None = Field(
        None, description="Directory for read positions and event counts; without it a restart starts afresh."
    )
    web: WebConfig = WebConfig()
    events: EventsConfig = EventsConfig()
    trend: TrendConfig = TrendConfig()
    nvml: NvmlConfig = NvmlConfig()
    scrape: ScrapeConfig = ScrapeConfig()
    simulation: SimulationConfig = SimulationConfig()
    targets: tuple[TargetConfig, ...] = ()
    kubernetes: KubernetesConfig | None = Field(None, description="Discover engine pods on this node.")
    dcgm: DcgmConfig | None = Field(
        None, description="Read GPU memory from dcgm-exporter instead of NVML (no per-process memory, no XIDs)."
    )
    discovery: DiscoveryConfig = DiscoveryConfig()

    @model_validator(mode="after")
    def _unique_names(self) -> Config:
        seen: set[str] = set()
        for target in self.targets:
            if target.label in seen:
                raise ValueError(f"two targets are named {target.label!r}; give each a distinct `name:`")
            seen.add(target.label)
        return self

    @model_validator(mode="after")
    def _gpu_source(self) -> Config:
        cluster = self.kubernetes is not None and self.kubernetes.scope == "cluster"
        if self.dcgm is not None and self.dcgm.discover and not cluster:
            raise ValueError("dcgm.discover finds dcgm-exporter through the API: it needs kubernetes.scope: cluster")
        if cluster and self.dcgm is None and self.nvml.enabled:
            raise ValueError(
                "kubernetes.scope: cluster reads no NVML (it runs on no GPU node): add dcgm: {discover: true} to read "
                "every node's GPUs from dcgm-exporter, or set nvml.enabled: false for no GPU memory"
            )
        return self

    @property
    def local_node(self) -> str:
        """The node this exporter runs on, which its NVML GPUs and its configured targets are on: the DaemonSet's
        node, else $NODE_NAME, else "" (outside Kubernetes; in the cluster mode, GPUs are on their pods' nodes)."""
        k8s = self.kubernetes
        if k8s is not None and k8s.scope == "node":
            return k8s.node_name
        return os.environ.get("NODE_NAME", "")

    @property
    def discovers_local(self) -> bool:
        """Whether the engines on this host are discovered: `discovery.local`, where auto means when nothing
        else names an engine."""
        mode = self.discovery.local
        if mode != "auto":
            return mode == "on"
        return not self.targets and self.kubernetes is None and not self.simulation.scenario

    def target_timeout(self, target: TargetConfig) -> float:
        return target.timeout_seconds or self.scrape.timeout_seconds

    def target_limits(self, target: TargetConfig) -> Limits:
        return Limits(
            samples=target.sample_limit or self.scrape.sample_limit,
            label_value_length=target.label_value_length_limit or self.scrape.label_value_length_limit,
            labels=target.label_limit or self.scrape.label_limit,
        )


def parse_listen_address(value: str) -> tuple[str, int]:
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT; write e.g. ':{DEFAULT_PORT}' or '127.0.0.1:{DEFAULT_PORT}'")
    return host.strip("[]") or "0.0.0.0", int(port_text)


def _keys(model: type[BaseModel]) -> dict[str, Any]:
    """The keys a model reads (a field's alias where it has one, as in YAML `for:`) -> its field."""
    return {field.alias or name: field for name, field in model.model_fields.items()}


def _known_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys valid at `loc` under the root `model`, to suggest the closest one for a typo."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = _keys(current).get(part) if isinstance(current, type) else None
        if field is None:
            return []
        annotation = field.annotation
        args = getattr(annotation, "__args__", ())
        current = next((a for a in (annotation, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if current is None:
            return []
    return list(_keys(current)) if isinstance(current, type) else []


def _format_location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        name = excerpt(str(part))  # a key is as long as the file makes it
        out += f"[{part}]" if isinstance(part, int) else (f".{name}" if out else name)
    return out or "(top level)"


def explain(
    error: ValidationError,
    source: str,
    model: type[BaseModel] | None = None,
    what: str = "configuration",
    origins: Mapping[str, str] | None = None,
) -> str:
    """One line per error of `model` (default: the exporter's Config), naming the key and the fix; `origins`:
    dotted key -> what set it, other than the file (`$OOMGUARD_SIMULATE_TIME_SCALE=abc`), said first on its line."""
    lines = [f"{source}: the {what} is not valid:"]
    for item in error.errors():
        loc = tuple(item["loc"])
        where = _format_location(loc)
        if item["type"] == "extra_forbidden":
            known = _known_keys(model or Config, loc)
            key = str(loc[-1])
            close = difflib.get_close_matches(key, known, n=1) if len(key) <= LIMIT else []
            hint = f"did you mean {close[0]!r}?" if close else f"known keys here: {', '.join(known)}"
            lines.append(f"  {where}: unknown key; {hint}")
            continue
        message = _cut_quotes(_fix(item) or item["msg"].removeprefix("Value error, "), item.get("input"))
        origin = (origins or {}).get(".".join(str(part) for part in loc if not isinstance(part, int)))
        if origin is None:
            lines.append(f"  {where}: {message}{_got(item.get('input'), message)}")
        else:  # the variable or flag is what the user wrote: name it, with the value it holds
            lines.append(f"  {origin}: {where}{' ' if message.startswith(_VERBS) else ': '}{message}")
    return "\n".join(lines)


# A message that begins so reads on from its key ("simulation.time_scale must be a number").
_VERBS = ("must ", "is ", "needs ", "takes ")


def _cut_quotes(message: str, value: Any) -> str:
    """`message` with each long string of the input it quotes (a validator's f"{value!r}") cut to its head, then
    bounded whole: a 10 MB value gives an error of a few lines, not of 10 MB."""
    values = value.values() if isinstance(value, dict) else (value,)
    for text in values:
        if isinstance(text, str) and len(text) > LIMIT:
            message = message.replace(repr(text), f"{text[:LIMIT]!r}... ({len(text)} characters)")
    return excerpt(message, 5 * LIMIT)


# pydantic's bounds, said as what to write instead.
_BOUNDS = {
    "greater_than": ("gt", "must be greater than {}"),
    "greater_than_equal": ("ge", "must be at least {}"),
    "less_than": ("lt", "must be less than {}"),
    "less_than_equal": ("le", "must be at most {}"),
}


def _fix(item: Any) -> str | None:
    """A bound or a type broken, with the fix: what to write there."""
    key = str(item["loc"][-1]) if item["loc"] else ""
    unit = " seconds, e.g. 5" if key.endswith("_seconds") else ""
    if item["type"] in _BOUNDS:
        name, text = _BOUNDS[item["type"]]
        bound = item.get("ctx", {}).get(name)
        shown = f"{bound:g}" if isinstance(bound, int | float) else str(bound)
        if item["type"] in ("less_than", "less_than_equal") and bound == 1:
            return f"{text.format(shown)}; write a ratio from 0 to 1 (90 % is 0.9)"
        return f"{text.format(shown)}; write a number{' above 0' if bound == 0 else ''}{unit and ' in' + unit}"
    if item["type"] in ("int_parsing", "float_parsing", "int_type", "float_type"):
        return f"must be a number{unit and ' of' + unit}"
    if item["type"] in ("bool_parsing", "bool_type"):
        return "must be true or false"
    ctx = item.get("ctx", {})
    if item["type"] in _SHAPES:
        return _SHAPES[item["type"]].format(**ctx)
    if item["type"] in ("literal_error", "enum") and "expected" in ctx:
        return f"must be one of {ctx['expected']}"
    # Any other of pydantic's phrases, in the same voice as the rest ("must be ...", never "Input should be ...").
    message = str(item["msg"])
    if message.startswith("Input should be "):
        return "must be " + message.removeprefix("Input should be ")
    return None


# pydantic's shapes (a list where a mapping belongs...), said as what to write; keys of the error's ctx fill them.
_SHAPES = {
    "missing": "is required: add it",
    "tuple_type": "must be a list: one '- item' line each, or [a, b]",
    "list_type": "must be a list: one '- item' line each, or [a, b]",
    "set_type": "must be a list: one '- item' line each, or [a, b]",
    "frozen_set_type": "must be a list: one '- item' line each, or [a, b]",
    "iterable_type": "must be a list: one '- item' line each, or [a, b]",
    "dict_type": "must be a mapping: 'key: value' lines indented under it",
    "model_type": "must be a mapping: 'key: value' lines indented under it",
    "model_attributes_type": "must be a mapping: 'key: value' lines indented under it",
    "string_type": "must be text (in quotes where YAML would read a number, true/false or a list)",
    "int_from_float": "must be a whole number",
    "too_short": "needs at least {min_length} item(s)",
    "too_long": "takes at most {max_length} item(s)",
    "string_too_short": "needs at least {min_length} character(s)",
    "string_too_long": "takes at most {max_length} characters",
    "string_pattern_mismatch": "must match the pattern {pattern}",
}


def _got(value: Any, message: str) -> str:
    """What was written, when it fits on a line and the message does not quote it already: never a whole section
    or file (a top-level check's input)."""
    text = repr(value)
    # A string quoted by the message (its repr, quotes included): a number's text would be found in any message
    # that names a number ("greater than 0").
    quoted = isinstance(value, str) and text in message
    return "" if isinstance(value, dict | list) or len(text) > 80 or quoted else f" (got {text})"


def read_text(path: Path, what: str) -> str:
    """The text of a configuration file: a ConfigError naming the file and the fix when it cannot be read,
    or is not UTF-8 (an editor that saved it as Latin-1 or UTF-16)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what}: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}: the {what} is not UTF-8 text: byte {exc.start} (line {line}) is "
            f"0x{data[exc.start : exc.start + 1].hex()} ({exc.reason}); save it as UTF-8"
        ) from None


def read_yaml(path: Path, what: str) -> Any:
    """The YAML document of a configuration file; a ConfigError naming the file when it is not YAML, or when its
    aliases would expand it without bound (bounded_yaml.py), before anything is built of it."""
    text = read_text(path, what)
    try:
        return bounded_yaml.load(text)
    except bounded_yaml.YamlRefused as exc:
        raise ConfigError(f"{path}: the {what} is refused: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {excerpt(str(exc), 5 * LIMIT)}") from None
    except RecursionError:  # PyYAML's parser recurses once per level: [[[[... 500 deep
        raise ConfigError(f"{path}: not valid YAML: nested hundreds of levels deep") from None


def parse_config(
    path: Path | None,
    overrides: dict[str, Any] | None,
    *,
    checks: PartChecks,
    origins: Mapping[str, str] | None = None,
) -> Config:
    """Read `path` (if any), apply `overrides` (dotted keys), validate everything: the shape here, each part's
    section with its check in `checks` (config_loader.load_config gives them all). `origins`: an override's dotted
    key -> the variable or flag that set it, named in its error instead of the key alone."""
    raw: dict[str, Any] = {}
    source = str(path) if path else "configuration"
    if path is not None:
        loaded = read_yaml(path, "configuration file")
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping (keys such as targets:, nvml:)")
        raw = loaded
    for dotted, value in (overrides or {}).items():
        node = raw
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                break  # the file's `web:` is empty or not a mapping: refused below, naming the key
        else:
            node[leaf] = value
    try:
        return Config.model_validate(raw, context=checks)
    except ValidationError as exc:
        raise ConfigError(explain(exc, source, origins=origins)) from None
