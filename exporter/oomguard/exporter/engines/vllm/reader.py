"""vLLM's /metrics: V0 and V1 metric names (see docs/metrics.md, "Engine families read")."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import ClassVar

from oomguard.common.promtext import ExpositionError, Sample, finite
from oomguard.exporter.engines.base import FamilyRow, mean, total
from oomguard.exporter.model import SLEEP_STATES, EngineReading, ModelReading

KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"  # before 0.9; hidden from 0.11
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_QUERIES_OLD = "vllm:gpu_prefix_cache_queries_total"  # 0.7.3 - 0.8.5
PREFIX_HITS_OLD = "vllm:gpu_prefix_cache_hits_total"
CACHE_CONFIG = "vllm:cache_config_info"
START_TIME = "process_start_time_seconds"
SLEEP_STATE = "vllm:engine_sleep_state"  # 0.11+: 1 on the current one of awake, weights_offloaded, discard_all
# Requests refused with 503 at admission because a queue limit is reached (0.32: reason max_num_queued_reqs or
# max_num_queued_tokens, both written from the start, labels model_name and reason only).
ADMISSION_REJECTIONS = "vllm:admission_rejections_total"
# KV offloading (an offloading KV connector only; labels model_name, engine). 0.32 writes the flat names, each at
# its first transfer or failure, and still the older counter by transfer_type ("GPU_to_CPU" a store, "CPU_to_GPU"
# a load) for its CPU tier; releases before the flat names write only that one.
OFFLOAD_STORE_BYTES = "vllm:kv_offload_store_bytes_total"
OFFLOAD_LOAD_BYTES = "vllm:kv_offload_load_bytes_total"
OFFLOAD_BYTES_BY_DIRECTION = "vllm:kv_offload_total_bytes_total"
OFFLOAD_ALLOCATION_FAILURES = "vllm:kv_offload_allocation_failure_total"


def _number(text: str | None) -> float | None:
    """cache_config_info label values are strings, "None" included."""
    if text is None:
        return None
    try:
        return finite(float(text))
    except ValueError:
        return None


class VllmReader:
    metrics_path: ClassVar[str] = "/metrics"
    health_path: ClassVar[str] = "/health"
    families: ClassVar[frozenset[str]] = frozenset(
        {
            KV_USAGE,
            KV_USAGE_OLD,
            WAITING,
            RUNNING,
            PREEMPTIONS,
            PREFIX_QUERIES,
            PREFIX_HITS,
            PREFIX_QUERIES_OLD,
            PREFIX_HITS_OLD,
            CACHE_CONFIG,
            START_TIME,
            SLEEP_STATE,
            ADMISSION_REJECTIONS,
            OFFLOAD_STORE_BYTES,
            OFFLOAD_LOAD_BYTES,
            OFFLOAD_BYTES_BY_DIRECTION,
            OFFLOAD_ALLOCATION_FAILURES,
        }
    )
    # The "Engine families read" table of docs/metrics.md: each oomguard metric and the families (or requests)
    # it comes from; every family in `families` is named in it (tests/engines/test_families_documented.py).
    families_table: ClassVar[tuple[FamilyRow, ...]] = (
        FamilyRow(
            "`oomguard_engine_kv_cache_usage_ratio`",
            "`vllm:kv_cache_usage_perc` (0.9+), `vllm:gpu_cache_usage_perc` (before)",
        ),
        FamilyRow("`oomguard_engine_requests_waiting`", "`vllm:num_requests_waiting`"),
        FamilyRow("`oomguard_engine_requests_running`", "`vllm:num_requests_running`"),
        FamilyRow("`oomguard_engine_preemptions_total`", "`vllm:num_preemptions_total`"),
        FamilyRow(
            "`oomguard_engine_prefix_cache_queries_tokens_total`",
            "`vllm:prefix_cache_queries_total`, `vllm:gpu_prefix_cache_queries_total`",
        ),
        FamilyRow(
            "`oomguard_engine_prefix_cache_hits_tokens_total`",
            "`vllm:prefix_cache_hits_total`, `vllm:gpu_prefix_cache_hits_total`",
        ),
        FamilyRow(
            "`oomguard_engine_gpu_memory_utilization_ratio`, `..._kv_cache_blocks`, "
            "`..._kv_cache_block_size_tokens`, `..._kv_cache_memory_bytes`",
            "labels `gpu_memory_utilization`, `num_gpu_blocks`, `block_size`, `kv_cache_memory_bytes` "
            "of `vllm:cache_config_info`",
        ),
        FamilyRow("`oomguard_engine_process_start_time_seconds`", "`process_start_time_seconds` (API server process)"),
        FamilyRow("`oomguard_engine_sleep_state`", "`vllm:engine_sleep_state` (0.11+; sleep mode)"),
        FamilyRow(
            "`oomguard_engine_admission_rejections_total`",
            "`vllm:admission_rejections_total` (0.32+), its `reason`s (`max_num_queued_reqs`, "
            "`max_num_queued_tokens`) summed",
        ),
        FamilyRow(
            "`oomguard_engine_kv_offload_store_bytes_total`, `..._kv_offload_load_bytes_total`",
            "`vllm:kv_offload_store_bytes_total`, `vllm:kv_offload_load_bytes_total` (0.32); before them "
            '`vllm:kv_offload_total_bytes_total{transfer_type="GPU_to_CPU"}` (a store) and `..._to_GPU` (a load). '
            "KV offloading only",
        ),
        FamilyRow(
            "`oomguard_engine_kv_offload_allocation_failures_total`",
            "`vllm:kv_offload_allocation_failure_total` (0.32; KV offloading only, from its first failure)",
        ),
    )

    def read(self, samples: dict[str, list[Sample]]) -> EngineReading:
        if not any(name in samples for name in (WAITING, RUNNING, KV_USAGE, KV_USAGE_OLD)):
            raise ExpositionError(
                "no vLLM families (vllm:num_requests_waiting, vllm:kv_cache_usage_perc) in the "
                "body: is this URL a vLLM server, and is its engine set right in the config?"
            )
        by_model: dict[str, dict[str, list[Sample]]] = defaultdict(lambda: defaultdict(list))
        for name, found in samples.items():
            for sample in found:
                if "model_name" in sample.labels:
                    by_model[sample.labels["model_name"]][name].append(sample)

        def pick(
            family: dict[str, list[Sample]], new: str, old: str, how: Callable[[Iterable[Sample]], float | None]
        ) -> float | None:
            # Where both names are shown (0.9, 0.10) they carry the same value: prefer the new.
            return how(family[new]) if family.get(new) else how(family.get(old, ()))

        models = tuple(
            ModelReading(
                model_name=model,
                kv_cache_usage_ratio=pick(family, KV_USAGE, KV_USAGE_OLD, mean),
                requests_waiting=total(family.get(WAITING, ())),
                requests_running=total(family.get(RUNNING, ())),
                preemptions_total=total(family.get(PREEMPTIONS, ())),
                prefix_cache_queries_total=pick(family, PREFIX_QUERIES, PREFIX_QUERIES_OLD, total),
                prefix_cache_hits_total=pick(family, PREFIX_HITS, PREFIX_HITS_OLD, total),
                admission_rejections_total=total(family.get(ADMISSION_REJECTIONS, ())),
                kv_offload_store_bytes_total=_offloaded(family, OFFLOAD_STORE_BYTES, store=True),
                kv_offload_load_bytes_total=_offloaded(family, OFFLOAD_LOAD_BYTES, store=False),
                kv_offload_allocation_failures_total=total(family.get(OFFLOAD_ALLOCATION_FAILURES, ())),
            )
            for model, family in sorted(by_model.items())
        )
        config = samples.get(CACHE_CONFIG, [])

        def config_value(label: str, combine: Callable[[list[float]], float]) -> float | None:
            values = [v for s in config if (v := _number(s.labels.get(label))) is not None]
            return combine(values) if values else None

        start = samples.get(START_TIME)
        return EngineReading(
            models=models,
            memory_utilization_ratio=config_value("gpu_memory_utilization", max),
            kv_cache_blocks=config_value("num_gpu_blocks", sum),
            kv_cache_block_size_tokens=config_value("block_size", max),
            kv_cache_memory_bytes=config_value("kv_cache_memory_bytes", sum),
            process_start_time_seconds=finite(start[0].value) if start else None,
            sleep_state=_sleep_state(samples.get(SLEEP_STATE, [])),
        )


def _offloaded(family: dict[str, list[Sample]], flat: str, *, store: bool) -> float | None:
    """Bytes stored to (or loaded from) the offload tier: the flat name where written, else the older counter's
    series of that direction (a store leaves the GPU, a load comes to it; the medium's case varies by release)."""
    if family.get(flat):
        return total(family[flat])
    directions = [s for s in family.get(OFFLOAD_BYTES_BY_DIRECTION, ()) if _is_store(s) is store]
    return total(directions)


def _is_store(sample: Sample) -> bool | None:
    direction = sample.labels.get("transfer_type", "").lower()
    if direction.startswith("gpu_to_"):
        return True
    return False if direction.endswith("_to_gpu") else None


def _sleep_state(samples: list[Sample]) -> str | None:
    """Awake only when every engine (data-parallel rank) is; else the deepest sleep among them."""
    current = {s.labels.get("engine", ""): s.labels.get("sleep_state") for s in samples if s.value == 1}
    states = [state for state in current.values() if state in SLEEP_STATES]
    if not states:
        return None
    return max(states, key=SLEEP_STATES.index)
