"""Engine families: what the engine says of itself on its /metrics, per target and served model."""

from __future__ import annotations

from oomguard.exporter.exposition.encoder import Exposition
from oomguard.exporter.exposition.spec import CONDITIONAL, metric
from oomguard.exporter.model import MEMORY_COMPONENTS, SLEEP_STATES, TargetReading

SECTION = "Engine (per target)"
TARGET_INFO = metric(SECTION, "target_info", "info", "", "target engine url", "A configured engine target.")
ENGINE_KV_CACHE_USAGE_RATIO = metric(
    SECTION,
    "engine_kv_cache_usage_ratio",
    "gauge",
    "ratio",
    "target model_name",
    "Share of the engine's KV cache blocks in use, 0-1, averaged over its data-parallel ranks (each engine's families: docs/metrics.md, \"Engine families read\").",
)
ENGINE_REQUESTS_WAITING = metric(
    SECTION,
    "engine_requests_waiting",
    "gauge",
    "requests",
    "target model_name",
    "Requests queued, not yet scheduled; a queue that stays up means concurrency is over-provisioned.",
)
ENGINE_REQUESTS_RUNNING = metric(
    SECTION, "engine_requests_running", "gauge", "requests", "target model_name", "Requests in the running batch."
)
ENGINE_PREEMPTIONS = metric(
    SECTION,
    "engine_preemptions",
    "counter",
    "",
    "target model_name",
    "Requests preempted because the KV cache was full (the engine's own counter, summed over engines).",
    presence=CONDITIONAL,
)
ENGINE_PREFIX_CACHE_QUERIES_TOKENS = metric(
    SECTION,
    "engine_prefix_cache_queries_tokens",
    "counter",
    "tokens",
    "target model_name",
    "Tokens looked up in the prefix cache.",
    presence=CONDITIONAL,
)
ENGINE_PREFIX_CACHE_HITS_TOKENS = metric(
    SECTION,
    "engine_prefix_cache_hits_tokens",
    "counter",
    "tokens",
    "target model_name",
    "Tokens found in the prefix cache.",
    presence=CONDITIONAL,
)
ENGINE_GPU_MEMORY_UTILIZATION_RATIO = metric(
    SECTION,
    "engine_gpu_memory_utilization_ratio",
    "gauge",
    "ratio",
    "target",
    "The engine's configured share of each GPU's total memory: its reservation setting (each engine's families: docs/metrics.md, \"Engine families read\").",
    presence=CONDITIONAL,
)
ENGINE_KV_CACHE_BLOCKS = metric(
    SECTION,
    "engine_kv_cache_blocks",
    "gauge",
    "blocks",
    "target",
    'KV cache blocks the engine allocated at start (each engine\'s families: docs/metrics.md, "Engine families read").',
    presence=CONDITIONAL,
)
ENGINE_KV_CACHE_BLOCK_SIZE_TOKENS = metric(
    SECTION,
    "engine_kv_cache_block_size_tokens",
    "gauge",
    "tokens",
    "target",
    "Tokens per KV cache block.",
    presence=CONDITIONAL,
)
ENGINE_KV_CACHE_MEMORY_BYTES = metric(
    SECTION,
    "engine_kv_cache_memory_bytes",
    "gauge",
    "bytes",
    "target",
    'Memory the engine reserved for its KV cache, where it says (each engine\'s families: docs/metrics.md, "Engine families read").',
    presence=CONDITIONAL,
)
ENGINE_PROCESS_START_TIME_SECONDS = metric(
    SECTION,
    "engine_process_start_time_seconds",
    "gauge",
    "seconds",
    "target",
    "Start time of the engine's API server process, Unix time; a change is a restart.",
    presence=CONDITIONAL,
)
ENGINE_SLEEP_STATE = metric(
    SECTION,
    "engine_sleep_state",
    "gauge",
    "",
    "target state",
    "1 for the engine's sleep state (awake, weights_offloaded, discard_all; each engine's families: docs/metrics.md, \"Engine families read\"), 0 for the others. A sleeping engine has released its memory: memory near zero is then no fault, and its reservation does not count.",
    presence=CONDITIONAL,
)
ENGINE_MEMORY_BYTES = metric(
    SECTION,
    "engine_memory_bytes",
    "gauge",
    "bytes",
    "target component",
    'GPU memory the engine says each part of it holds on each of its GPUs (the largest over its ranks): component weights, kv_cache or cuda_graphs (each engine\'s families: docs/metrics.md, "Engine families read"). Only the parts the engine reports; they need not add up to its whole use.',
    presence=CONDITIONAL,
)
ENGINE_SETTING = metric(
    SECTION,
    "engine_setting",
    "gauge",
    "",
    "target engine setting origin",
    "The engine's setting as started, one series per setting, read from its process's command line (or "
    "environment) on this host, or from a discovered pod's container command, args and env: its memory and "
    "concurrency settings under the engine's own names (each engine's in docs/engines.md, \"Settings as gauges\"). "
    "origin=flag when on its command line, default when the engine's default for its version; a setting neither "
    "given nor of a known default is absent.",
    presence=CONDITIONAL,
)
ENGINE_FIGURE_READ = metric(
    SECTION,
    "engine_figure_read",
    "gauge",
    "",
    "target figure",
    "1 when the target's last reading had the figure, 0 when not, for each figure its engine gives once it serves "
    "(kv_cache_usage, requests_waiting, requests_running, preemptions, reservation: docs/engines.md); only while "
    "its /metrics is read. 0 means a name the reader no longer finds (an engine upgrade renamed it): the alerts "
    "on that figure cannot fire for this target.",
)
METRICS = (
    TARGET_INFO, ENGINE_KV_CACHE_USAGE_RATIO, ENGINE_REQUESTS_WAITING, ENGINE_REQUESTS_RUNNING, ENGINE_PREEMPTIONS,
    ENGINE_PREFIX_CACHE_QUERIES_TOKENS, ENGINE_PREFIX_CACHE_HITS_TOKENS, ENGINE_GPU_MEMORY_UTILIZATION_RATIO,
    ENGINE_KV_CACHE_BLOCKS, ENGINE_KV_CACHE_BLOCK_SIZE_TOKENS, ENGINE_KV_CACHE_MEMORY_BYTES,
    ENGINE_PROCESS_START_TIME_SECONDS, ENGINE_SLEEP_STATE,
    ENGINE_MEMORY_BYTES, ENGINE_SETTING, ENGINE_FIGURE_READ,
)  # fmt: skip


def add(out: Exposition, target: TargetReading) -> None:
    t = target.name
    out.add(TARGET_INFO, (t, target.engine, target.url), 1.0)
    for name, setting in sorted(target.settings.items()):
        out.add(ENGINE_SETTING, (t, target.engine, name, setting.origin), setting.value)
    reading = target.engine_reading
    if reading is None or (target.pod is not None and target.pod.leader_elsewhere):
        return  # the engine's figures are its leader's exporter's (model.PodRef): once in Prometheus, not twice
    for figure, read in target.figures_read.items():
        out.add(ENGINE_FIGURE_READ, (t, figure), float(read))
    for model in reading.models:
        labels = (t, model.model_name)
        out.add(ENGINE_KV_CACHE_USAGE_RATIO, labels, model.kv_cache_usage_ratio)
        out.add(ENGINE_REQUESTS_WAITING, labels, model.requests_waiting)
        out.add(ENGINE_REQUESTS_RUNNING, labels, model.requests_running)
        out.add(ENGINE_PREEMPTIONS, labels, model.preemptions_total)
        out.add(ENGINE_PREFIX_CACHE_QUERIES_TOKENS, labels, model.prefix_cache_queries_total)
        out.add(ENGINE_PREFIX_CACHE_HITS_TOKENS, labels, model.prefix_cache_hits_total)
    out.add(ENGINE_GPU_MEMORY_UTILIZATION_RATIO, (t,), reading.memory_utilization_ratio)
    out.add(ENGINE_KV_CACHE_BLOCKS, (t,), reading.kv_cache_blocks)
    out.add(ENGINE_KV_CACHE_BLOCK_SIZE_TOKENS, (t,), reading.kv_cache_block_size_tokens)
    out.add(ENGINE_KV_CACHE_MEMORY_BYTES, (t,), reading.kv_cache_memory_bytes)
    out.add(ENGINE_PROCESS_START_TIME_SECONDS, (t,), reading.process_start_time_seconds)
    memory = dict(reading.memory_bytes)
    for component in MEMORY_COMPONENTS:
        out.add(ENGINE_MEMORY_BYTES, (t, component), memory.get(component))
    if reading.sleep_state is not None:
        for state in SLEEP_STATES:
            out.add(ENGINE_SLEEP_STATE, (t, state), 1.0 if reading.sleep_state == state else 0.0)
