"""The data model: every reading the sources produce, and the snapshot the exposition reads.

Plain frozen data, no behaviour beyond arithmetic on its own fields. This module imports
nothing of oomguard's (no orchestration, no web, no configuration): every other layer
may import it, and it can be built by hand in a test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

# -- fixed vocabularies (label values) -------------------------------------------------------
TARGET_STATES = ("up", "loading", "down")
# tls: the target's certificate or handshake was refused (an unknown CA, a wrong name): a fix of trust, not
# of a down engine, so not "refused".
# limit: over one of the target's limits (promtext.Limits: samples, label value length, labels): dropped whole.
ERROR_KINDS = ("timeout", "refused", "tls", "http_status", "too_large", "limit", "parse", "other")
# Why an engine's value was dropped from its reading (engines/base.py): NaN or infinite, negative, a ratio over 1.
VALUE_REJECT_REASONS = ("non_finite", "negative", "out_of_range")
TREND_STATES = ("steady", "sawtooth", "climbing", "spike", "saturated")
# vLLM's sleep mode: level 1 offloads the weights, level 2 discards them; both free the KV cache.
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
# The parts of an engine's GPU memory it can tell apart (oomguard_engine_memory_bytes{component}).
MEMORY_COMPONENTS = ("weights", "kv_cache", "cuda_graphs")
HOST = ""  # the `target` of host-wide event sources (the kernel log)
# Where GPU memory is read, as oomguard_source_success names it: NVML on this host, or dcgm-exporter (sources/dcgm.py).
GPU_SOURCES = ("nvml", "dcgm")


# -- GPUs (NVML, or dcgm-exporter) ----------------------------------------------------------
# A GPU among all an exporter reads: (its node, its `gpu` label there: its index, or for a MIG instance its parent's
# index and its GPU instance, "0/1"). One node's GPUs in a node agent; many in the cluster mode, where two nodes'
# GPU 0 are two GPUs. The node is "" where the exporter does not know it.
GpuKey = tuple[str, str]


def gpu_label(index: int, gpu_instance: int | None = None) -> str:
    """The `gpu` label: a whole GPU's index, or a MIG instance's parent index and GPU instance id ("0/1"). A MIG
    instance is a GPU of its own (its own memory, which its engine runs out of), told from its parent and its
    siblings in the one label every rule and dashboard already keys on (docs/metrics.md, "MIG instances")."""
    return str(index) if gpu_instance is None else f"{index}/{gpu_instance}"


def gpu_order(key: GpuKey) -> tuple[str, int, int]:
    """A GPU key in the order a reader lists GPUs: by node, index, then instance (not "10" before "2")."""
    parent, _, instance = key[1].partition("/")
    return (key[0], int(parent) if parent.isdigit() else -1, int(instance) if instance.isdigit() else -1)


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG GPU instance read as a GPU: its parent's identity and its place on it."""

    parent_uuid: str
    gpu_instance: int
    compute_instance: int | None = None  # None where the source does not say (dcgm-exporter names the GI only)
    profile: str = ""  # "3g.40gb"


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    name: str
    used_bytes: float | None  # None: NVML could not say (e.g. no permission, some vGPUs)


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int
    up: bool
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""
    total_bytes: float | None = None
    used_bytes: float | None = None
    free_bytes: float | None = None
    reserved_bytes: float | None = None
    utilization_ratio: float | None = None
    # None when the per-process query failed, or the source does not publish it (dcgm-exporter): an empty tuple
    # means "no processes".
    processes: tuple[GpuProcess, ...] | None = None
    error: str = ""
    node: str = ""  # the Kubernetes node it is on ("" outside Kubernetes)
    # The pods using it as dcgm-exporter labels it (namespace, pod): how a pod finds its GPUs without its pids.
    pods: tuple[tuple[str, str], ...] = ()
    mig: MigInstance | None = None  # a MIG instance: `index` is its parent's

    @property
    def label(self) -> str:
        return gpu_label(self.index, self.mig.gpu_instance if self.mig else None)

    @property
    def key(self) -> GpuKey:
        return (self.node, self.label)

    @property
    def measured(self) -> bool:
        """Up, with both used and total known: a GPU whose memory can be judged."""
        return self.up and bool(self.total_bytes) and self.used_bytes is not None


@dataclass(frozen=True, slots=True)
class GpuReadings:
    """What a GPU source read (sources/gpu_source.py): NVML on this host, or dcgm-exporter (sources/dcgm.py) on one
    node or many."""

    up: bool
    driver_version: str = ""
    gpus: tuple[GpuReading, ...] = ()
    error: str = ""
    # dcgm-exporter only: each node's memory families as read, (figure, family, unit): 4.8's MiB or 4.9's bytes.
    dcgm_families: tuple[tuple[str, str, str, str], ...] = ()  # (node, figure, family, unit)


# -- the engine's own view (its /metrics) ----------------------------------------------------
# What engines/base.py holds a figure's value to, besides being a finite number (VALUE_REJECT_REASONS says why one
# was dropped):
AT_LEAST_ZERO = "at_least_zero"  # a count, a size, a time: 0 or more
ZERO_TO_ONE = "zero_to_one"  # a ratio
ABOVE_ZERO_TO_ONE = "above_zero_to_one"  # a share of each GPU: 0 would be no share, a budget of 0 bytes
BOUNDS = (AT_LEAST_ZERO, ZERO_TO_ONE, ABOVE_ZERO_TO_ONE)


@dataclass(frozen=True, slots=True)
class EngineFigure:
    """One number an engine gives of itself, declared once in ENGINE_FIGURES: the reading's field that keeps it,
    the metric that exports it (exposition/engine.py builds its MetricSpec from this and writes it, docs/metrics.md
    lists it), the bounds engines/base.py checks it against, and its name where the alerts read it."""

    field: str  # a `float | None` field of ModelReading (per_model) or of EngineReading
    per_model: bool  # one series per served model (labels target, model_name), or one per target (label target)
    metric: str  # its name without the oomguard_ prefix, and a counter's without _total
    kind: str  # gauge | counter
    unit: str  # "" when none
    help: str
    bounds: str = AT_LEAST_ZERO  # one of BOUNDS
    # Only some engines or versions give it: `drill --check` sees no gap where it is absent.
    conditional: bool = False
    # Its name in oomguard_engine_figure_read{figure} where the alerts read it (FIGURES; each engine's
    # EnginePlugin.figures names those it always gives); "" when no alert reads it.
    figure_read_as: str = ""


_FAMILIES_READ = 'each engine\'s families: docs/metrics.md, "Engine families read"'

# Every number an engine gives of itself, in the order it is exported and documented. A figure per served model
# comes first, then those of the engine as a whole.
ENGINE_FIGURES: tuple[EngineFigure, ...] = (
    EngineFigure(
        field="kv_cache_usage_ratio",
        per_model=True,
        metric="engine_kv_cache_usage_ratio",
        kind="gauge",
        unit="ratio",
        help="Share of the engine's KV cache blocks in use, 0-1, averaged over its data-parallel ranks"
        f" ({_FAMILIES_READ}).",
        bounds=ZERO_TO_ONE,
        figure_read_as="kv_cache_usage",
    ),
    EngineFigure(
        field="requests_waiting",
        per_model=True,
        metric="engine_requests_waiting",
        kind="gauge",
        unit="requests",
        help="Requests queued, not yet scheduled; a queue that stays up means concurrency is over-provisioned.",
        figure_read_as="requests_waiting",
    ),
    EngineFigure(
        field="requests_running",
        per_model=True,
        metric="engine_requests_running",
        kind="gauge",
        unit="requests",
        help="Requests in the running batch.",
        figure_read_as="requests_running",
    ),
    EngineFigure(
        field="preemptions_total",
        per_model=True,
        metric="engine_preemptions",
        kind="counter",
        unit="",
        help="Requests preempted because the KV cache was full (the engine's own counter, summed over engines).",
        conditional=True,
        figure_read_as="preemptions",
    ),
    EngineFigure(
        field="prefix_cache_queries_total",
        per_model=True,
        metric="engine_prefix_cache_queries_tokens",
        kind="counter",
        unit="tokens",
        help="Tokens looked up in the prefix cache.",
        conditional=True,
    ),
    EngineFigure(
        field="prefix_cache_hits_total",
        per_model=True,
        metric="engine_prefix_cache_hits_tokens",
        kind="counter",
        unit="tokens",
        help="Tokens found in the prefix cache.",
        conditional=True,
    ),
    EngineFigure(
        field="admission_rejections_total",
        per_model=True,
        metric="engine_admission_rejections",
        kind="counter",
        unit="",
        help="Requests the engine refused at admission (HTTP 503) because a queue limit was reached, summed over"
        f" its reasons ({_FAMILIES_READ}): a capacity symptom clients see before memory runs out.",
        conditional=True,
    ),
    EngineFigure(
        field="kv_offload_store_bytes_total",
        per_model=True,
        metric="engine_kv_offload_store_bytes",
        kind="counter",
        unit="bytes",
        help="KV cache bytes the engine copied from its GPUs to its offload tier (CPU memory, disk); only with KV"
        f" offloading ({_FAMILIES_READ}).",
        conditional=True,
    ),
    EngineFigure(
        field="kv_offload_load_bytes_total",
        per_model=True,
        metric="engine_kv_offload_load_bytes",
        kind="counter",
        unit="bytes",
        help="KV cache bytes the engine loaded back from its offload tier to its GPUs instead of recomputing them;"
        " while they flow, a full GPU KV cache is not an engine out of KV cache.",
        conditional=True,
    ),
    EngineFigure(
        field="kv_offload_allocation_failures_total",
        per_model=True,
        metric="engine_kv_offload_allocation_failures",
        kind="counter",
        unit="",
        help="Stores to the KV offload tier that found no room: the offload tier is full as well.",
        conditional=True,
    ),
    EngineFigure(
        field="memory_utilization_ratio",
        per_model=False,
        metric="engine_gpu_memory_utilization_ratio",
        kind="gauge",
        unit="ratio",
        help=f"The engine's configured share of each GPU's total memory: its reservation setting ({_FAMILIES_READ}).",
        bounds=ABOVE_ZERO_TO_ONE,
        conditional=True,
        figure_read_as="reservation",  # what it was told, asleep or awake
    ),
    EngineFigure(
        field="kv_cache_blocks",
        per_model=False,
        metric="engine_kv_cache_blocks",
        kind="gauge",
        unit="blocks",
        help=f"KV cache blocks the engine allocated at start ({_FAMILIES_READ}).",
        conditional=True,
    ),
    EngineFigure(
        field="kv_cache_block_size_tokens",
        per_model=False,
        metric="engine_kv_cache_block_size_tokens",
        kind="gauge",
        unit="tokens",
        help="Tokens per KV cache block.",
        conditional=True,
    ),
    EngineFigure(
        field="kv_cache_memory_bytes",
        per_model=False,
        metric="engine_kv_cache_memory_bytes",
        kind="gauge",
        unit="bytes",
        help=f"Memory the engine reserved for its KV cache, where it says ({_FAMILIES_READ}).",
        conditional=True,
    ),
    EngineFigure(
        field="process_start_time_seconds",
        per_model=False,
        metric="engine_process_start_time_seconds",
        kind="gauge",
        unit="seconds",
        help="Start time of the engine's API server process, Unix time; a change is a restart.",
        conditional=True,
    ),
)
# The figures of an engine the alerts read (oomguard_engine_figure_read{figure}); each engine gives some of them.
FIGURES = tuple(figure.figure_read_as for figure in ENGINE_FIGURES if figure.figure_read_as)


@dataclass(frozen=True, slots=True)
class ModelReading:
    """One served model, summed or averaged over the engine's data-parallel ranks."""

    # The values engines/base.py checks: this reading's figures in ENGINE_FIGURES. A number field declared there
    # as none fails engines/base.py's import, and so does a figure that names no field here.
    CHECKED: ClassVar[tuple[str, ...]] = tuple(figure.field for figure in ENGINE_FIGURES if figure.per_model)

    model_name: str
    kv_cache_usage_ratio: float | None = None
    requests_waiting: float | None = None
    requests_running: float | None = None
    preemptions_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    admission_rejections_total: float | None = None
    kv_offload_store_bytes_total: float | None = None
    kv_offload_load_bytes_total: float | None = None
    kv_offload_allocation_failures_total: float | None = None


@dataclass(frozen=True, slots=True)
class EngineReading:
    # The values engines/base.py checks, as ModelReading's: this reading's figures in ENGINE_FIGURES (memory_bytes,
    # a tuple, it checks on its own).
    CHECKED: ClassVar[tuple[str, ...]] = tuple(figure.field for figure in ENGINE_FIGURES if not figure.per_model)

    models: tuple[ModelReading, ...]
    # The share of each GPU's total memory the engine is configured to take.
    memory_utilization_ratio: float | None = None
    kv_cache_blocks: float | None = None
    kv_cache_block_size_tokens: float | None = None
    kv_cache_memory_bytes: float | None = None
    process_start_time_seconds: float | None = None
    sleep_state: str | None = None  # one of SLEEP_STATES; None: the engine does not say
    # (component, bytes) on each of its GPUs, components from MEMORY_COMPONENTS; empty: the engine does not say.
    memory_bytes: tuple[tuple[str, float], ...] = ()

    @property
    def asleep(self) -> bool:
        """In sleep mode: its memory is released, so its reservation does not hold."""
        return self.sleep_state is not None and self.sleep_state != "awake"

    @property
    def reservation_ratio(self) -> float | None:
        """The share of each of its GPUs the engine holds from its start: None when unknown or asleep."""
        return None if self.asleep else self.memory_utilization_ratio


# -- the engine's processes on this host -----------------------------------------------------
@dataclass(frozen=True, slots=True)
class ProcessTree:
    """The engine's processes on this host: the listener and its children."""

    root_pid: int
    pids: frozenset[int]
    resident_bytes: float
    start_time_seconds: float
    cmdline: tuple[str, ...] = ()


# -- a discovered pod -------------------------------------------------------------------------
OOM_EXIT_CODE = 137  # SIGKILL: what an OOM kill leaves where the runtime does not say OOMKilled


@dataclass(frozen=True, slots=True)
class Termination:
    """A pod's engine container's last end (`lastState.terminated`)."""

    container_id: str
    reason: str
    exit_code: int | None
    finished_at: float | None  # Unix time

    @property
    def oom_killed(self) -> bool:
        return self.reason == "OOMKilled" or self.exit_code == OOM_EXIT_CODE

    @property
    def key(self) -> str:
        """Tells one end from the next (a new container ID, or a new finish time)."""
        return f"{self.container_id}@{self.finished_at}"


@dataclass(frozen=True, slots=True)
class PodRef:
    """Which pod a discovered target is, as its series are labelled, and what its probes allow."""

    namespace: str
    name: str
    container: str  # the engine's container
    probe_grace_seconds: float | None = None  # its probes: the time from its start to the first possible kill
    node: str = ""  # the node it runs on (spec.nodeName): which node's GPUs are its
    # An engine spanning pods (a LeaderWorkerSet's, a Ray cluster's): the workers' pods this exporter reads, whose
    # GPUs count for the leader's target (sources/kubernetes/groups.py).
    members: tuple[PodRef, ...] = ()
    # Its leader runs on a node another exporter reads (the node mode, a sharded cluster mode): this one reads only
    # its workers, and leaves the engine's own figures, read from the leader, to that exporter.
    leader_elsewhere: bool = False


# -- a target as the background services see it --------------------------------------------
@dataclass(frozen=True, slots=True)
class TargetView:
    """One target as the target set (sources/target_set.py) last knew it: read by the trend sampler, which
    needs its GPUs and its state, not its scraper."""

    name: str
    gpus: tuple[int, ...]  # configured; empty: found from its processes
    port: int | None  # a target on this host: its port, where the process lookup keeps its processes; else None
    state: str  # loading, up or down
    asleep: bool  # in the engine's sleep mode, as its last reading said
    pod: PodRef | None = None  # a discovered pod: its GPUs by its node and by dcgm-exporter's pod labels
    # Its reservation (join.reservation) as its last scrape said: its GPUs' trend judges the use beyond it.
    reservation: float | None = None


# -- the engine's settings as started (its command line) ------------------------------------
SETTING_ORIGINS = ("flag", "default")


@dataclass(frozen=True, slots=True)
class EngineSetting:
    """One of the engine's memory or concurrency settings, as its process was started."""

    value: float
    origin: str  # one of SETTING_ORIGINS: on its command line (or environment), or the engine's default


# -- one target ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TargetReading:
    name: str
    engine: str
    url: str
    gpus: tuple[int, ...]  # configured; empty: found from the engine's processes
    up: bool
    state: str  # one of TARGET_STATES
    scrape_duration_seconds: float
    health_status: int | None = None  # HTTP status of /health; None when no answer
    health_latency_seconds: float | None = None
    engine_reading: EngineReading | None = None
    error_kind: str = ""
    error: str = ""
    process: ProcessTree | None = None
    errors_total: dict[str, int] = field(default_factory=dict)
    values_rejected_total: dict[str, int] = field(default_factory=dict)  # by VALUE_REJECT_REASONS
    # Each figure its engine gives (EnginePlugin.figures) -> whether this reading has it; empty when not read.
    figures_read: dict[str, bool] = field(default_factory=dict)
    restarts_total: int = 0
    last_restart_at: float | None = None
    startup_seconds: float | None = None  # the last start we watched, launch to first /health 200
    pod: PodRef | None = None  # a target discovered in Kubernetes: its pod; None for a configured target
    # The engine's settings parsed from its local process's command line (engines/<name>/cmdline.py), by name.
    settings: dict[str, EngineSetting] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TargetMemory:
    """A target joined with its GPUs (join.py): computed once, read by the exposition and the trend.

    A target on several GPUs (tensor parallel) is judged by its worst GPU: CUDA runs out of
    memory on one device, and an average of 99 % and 90 % hides the one about to fail.
    """

    gpus: tuple[GpuKey, ...]  # the target's GPUs that NVML (or dcgm-exporter) answers for
    used_bytes: float | None  # all processes on its worst GPU (highest used/total); None when none is measured
    total_bytes: float | None  # that GPU's total
    own_bytes: float | None  # the target's own processes on all its GPUs (local targets whose pids NVML lists)
    budget_bytes: float | None  # gpu_memory_utilization x the worst GPU's total
    over_budget_bytes: float | None  # the largest, over its GPUs, of own (else used) minus budget
    own_by_gpu: dict[GpuKey, float] | None = None  # its own processes' use per GPU, where attributable


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """A GPU joined with the engines that reserve it (join.py); only for a GPU with a known reservation."""

    key: GpuKey
    total_bytes: float
    used_bytes: float
    reserved_bytes: float  # the awake engines' gpu_memory_utilization x total, summed
    # Where every engine on it is attributable (its processes are in NVML's list), else None:
    engine_used_bytes: float | None  # the engines' own processes
    over_reservation_bytes: float | None  # the engines' own use beyond their reservations
    other_used_bytes: float | None  # everything else: other processes, driver contexts
    unreserved_used_bytes: float  # what can still grow: over reservation + other, else used - reserved
    headroom_used_ratio: float  # unreserved used / (total - reserved); above 1: the reservation cannot be honoured


# -- trends ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Trend:
    state: str  # one of TREND_STATES
    level_ratio: float
    slope_short: float | None  # share of capacity per second
    slope_long: float | None
    climb_seconds: float
    seconds_to_full: float | None  # only while climbing or spiking

    def seconds_to(self, ratio: float) -> float | None:
        """Seconds until the level reaches `ratio` at the current pace (0 when already there)."""
        if self.seconds_to_full is None:
            return None
        if self.level_ratio >= ratio:
            return 0.0
        slope = self._pace()
        return (ratio - self.level_ratio) / slope if slope else None

    def _pace(self) -> float | None:
        slope = self.slope_short if self.state == "spike" else self.slope_long
        return slope if slope and slope > 0 else None


@dataclass(frozen=True, slots=True)
class TrendSettings:
    """The trend analysis' thresholds (trend/analysis.py; their meaning in docs/trend.md): the configuration's
    `trend:` section (config.py) takes its defaults from here."""

    interval_seconds: float = 2.0
    short_window_seconds: float = 120.0
    long_window_seconds: float = 1800.0
    # A fall of more than this (share of capacity) ends a climb: normal churn falls back.
    tolerance_ratio: float = 0.02
    climb_min_seconds: float = 300.0
    # A climb whose history began with its engine serving (the load is not in it: what rises is not the load)
    # need not last climb_min_seconds when that is much of the time it leaves: it is called once it has lasted
    # this share of its projected time to full, and at least climb_soonest_seconds (a warm-up step is over by then).
    climb_share_of_time_to_full: float = 1 / 3
    climb_soonest_seconds: float = 150.0
    climb_min_rise_ratio: float = 0.03
    # Slower than this is not a leak but load drifting (a diurnal cycle of +-8 % peaks at 0.035 %/min).
    climb_min_slope_ratio_per_minute: float = 0.0006
    spike_rise_ratio: float = 0.15
    spike_level_ratio: float = 0.90
    saturated_ratio: float = 0.97
    # Saturated: the median of the samples of this last span at saturated_ratio or above.
    saturated_seconds: float = 30.0
    sawtooth_span_ratio: float = 0.04
    # A fall this large within one interval is a restart (memory freed at once), not churn: history restarts.
    restart_drop_ratio: float = 0.5
    # How often each series is analysed; 0: at every sample. The samples are taken every interval all the same;
    # the analysis of the series is spread over the ticks (each tick analyses its share), so one tick holds the
    # GIL for a share of the series, not for all of them (docs/trend.md, "Cost").
    analysis_interval_seconds: float = 0.0
    # The slow climb (docs/trend.md, "A slow climb in what is left"): a leak of tens of MiB an hour into the headroom
    # a reservation leaves, judged over hours on the floor of each period (its lowest reading): a floor that rises
    # steadily and never falls back, on a quiet series.
    creep_period_seconds: float = 300.0
    creep_window_seconds: float = 21600.0
    creep_min_seconds: float = 2700.0
    # Its rise, as a share of what was left (1 - level) where it began.
    creep_min_rise_ratio: float = 0.005
    # A floor that falls this far (share of capacity) below its highest ends the climb.
    creep_tolerance_ratio: float = 0.005
    # Quiet: at least a quarter of the periods wobble less than this (share of capacity) between their lowest and
    # highest readings. A series that moves with its load never is: its slow rises are the load's (a daily cycle).
    creep_quiet_ratio: float = 0.003
    # Slower than filling what is left in this long is no climb worth a ticket.
    creep_horizon_seconds: float = 10 * 86400.0

    @property
    def climb_soonest(self) -> float:
        """The shortest climb ever called one (climb_soonest_seconds, never longer than climb_min_seconds)."""
        return min(self.climb_soonest_seconds, self.climb_min_seconds)

    @property
    def analysis_every(self) -> int:
        """Each series is analysed every this many samples (1: every sample); a spike is judged within a quarter
        of the short window at the latest, whatever the setting."""
        interval = min(self.analysis_interval_seconds, self.short_window_seconds / 4)
        return max(1, int(interval / self.interval_seconds + 1e-9))


@dataclass(frozen=True, slots=True)
class TrendKey:
    """Which memory a series follows: ("gpu", "0", "gpu", node) or ("target", "llama", "gpu"|"host")."""

    kind: str
    name: str
    memory: str
    node: str = ""  # a GPU's node

    @classmethod
    def of_gpu(cls, key: GpuKey) -> TrendKey:
        return cls("gpu", key[1], "gpu", key[0])


# What a trend's level is a share of: the headroom its engines' reservations leave (the use beyond them against it:
# what can still grow and run the GPU out), or, with no reservation known, the whole capacity.
TREND_BASES = ("headroom", "total")


@dataclass(frozen=True, slots=True)
class Observation:
    used_bytes: float
    capacity_bytes: float
    basis: str = "total"  # one of TREND_BASES
    total_bytes: float = 0.0  # on the headroom basis, the GPU's total (the scale of its noise); else the capacity


@dataclass(frozen=True, slots=True)
class TrendReading:
    trend: Trend
    capacity_bytes: float
    basis: str = "total"


# -- events ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Event:
    kind: str
    timestamp: float  # when its first line was read (logs carry no reliable clock)
    count: int = 1
    pid: int | None = None  # a `startup` line's process, or a kernel OOM kill's victim
    cgroup: str | None = None  # a kernel OOM kill's victim's memory cgroup, as the kernel wrote it
    gpu: int | None = None  # a GPU's event (an XID): its index, -1 when NVML named a GPU it did not list
    code: int | None = None  # a GPU's event's number (the XID)


@dataclass
class Counts:
    """Events of one target by kind, and when each kind last happened."""

    total: dict[str, int] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)

    def add(self, kind: str, n: int, at: float) -> None:
        self.total[kind] = self.total.get(kind, 0) + n
        self.last[kind] = max(self.last.get(kind, 0.0), at)

    def copy(self) -> Counts:
        return Counts(dict(self.total), dict(self.last))


@dataclass
class ReadStats:
    """What an event source's reader has done so far; the counters only grow."""

    lines_read: int = 0
    bytes_read: int = 0
    bytes_behind: int = 0  # bytes written to the source and not read yet, after the last poll
    read_errors: int = 0  # failed reads (vanished file, permission, journalctl error)
    lines_truncated: int = 0  # lines longer than the reader's limit, cut
    lines_malformed: int = 0  # lines not in the source's format (a CRI line without its header)
    # Lines let go unread: more came than the poller took (a flood). None: a reader that never lets one go.
    lines_dropped: int | None = None
    last_error: str = ""
    files_followed: int | None = None  # files its pattern matches, after the last poll (None: not a file source)


@dataclass(frozen=True, slots=True)
class EventSourceHealth:
    target: str  # HOST for host-wide sources
    source: str  # e.g. "file:/var/log/vllm/*.log"
    kinds: tuple[str, ...]  # the event kinds this source can report: exported as zeros from the start
    lines_read: int = 0
    bytes_read: int = 0
    bytes_behind: int = 0
    read_errors: int = 0
    lines_truncated: int = 0
    lines_malformed: int = 0
    lines_dropped: int | None = None  # None: its reader never lets a line go (only the API's log readers do)
    files: int | None = None  # the files it follows now (file and pod log sources; None for the others)
    # The name its health is said under once for the exporter (target empty) where its reader is the exporter's,
    # shared by every pod (the API's Events watch: "k8s-api"); "" where the source's health is its own.
    exporter_wide: str = ""


@dataclass(frozen=True, slots=True)
class LogStreams:
    """The cluster mode's log streams through the API against their budget (sources/kubernetes/log_budget.py)."""

    open: int  # streams open now (their slots held)
    limit: int  # the most open at once: the logs' share of the file descriptors
    waiting: int  # followers without a stream, reading their logs by turns of short requests
    refused_total: int  # streams asked for when none was free


# -- one collection --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SourceResult:
    success: bool
    duration_seconds: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    gpus: GpuReadings | None  # what the GPU source read (sources/gpu_source.py); None when no GPU source is on
    targets: tuple[TargetReading, ...]
    sources: dict[str, SourceResult]
    collected_at: float
    memory: dict[str, TargetMemory] = field(default_factory=dict)  # target name -> its GPUs joined
    gpu_memory: dict[GpuKey, GpuMemory] = field(default_factory=dict)  # a GPU -> its engines joined
    trends: dict[TrendKey, TrendReading] = field(default_factory=dict)
    trend_samples_total: int | None = None  # None: trend sampling is off
    trend_errors_total: int = 0
    events: dict[str, Counts] = field(default_factory=dict)  # target (HOST for the host) -> counts
    event_sources: tuple[EventSourceHealth, ...] = ()
    event_state_write_errors: int | None = None  # None: no state_dir
    event_state_read_errors: int | None = None  # None: no state_dir
    xid: dict[tuple[int, int], int] = field(default_factory=dict)  # (gpu, xid code) -> count, on this node
    node: str = ""  # the exporter's own node (its NVML GPUs' and XIDs'): "" outside Kubernetes
    xid_last: dict[int, float] = field(default_factory=dict)
    xid_read_errors: int | None = None  # None: XID events are off
    # (node, namespace, pod, reason) -> times a pod was refused as a node's dcgm-exporter; None: none discovered
    dcgm_refusals: dict[tuple[str, str, str, str], int] | None = None
    # node -> the pods taken as its dcgm-exporter (2 and more: a conflict, the node read from none); None: none found
    dcgm_node_pods: dict[str, int] | None = None
    log_streams: LogStreams | None = None  # None: no log followed through the API (not the cluster mode)
