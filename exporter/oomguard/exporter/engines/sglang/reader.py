"""SGLang's /metrics (0.4 - 0.5.x; `--enable-metrics`): see docs/engines.md and docs/metrics.md.

Each scheduler writes its own series, labelled with its ranks (`tp_rank`, `pp_rank`,
`moe_ep_rank`, and `dp_rank` with data parallelism). By default only the first rank of
each attention tensor-parallel group writes; with `--enable-metrics-for-all-schedulers`
every rank does, and the ranks of one data-parallel group then repeat the same batch.
So within a data-parallel group the largest value stands for the group (never a sum of
copies), and the groups, which schedule different requests, are summed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import ClassVar

from oomguard.common.promtext import ExpositionError, Sample, finite
from oomguard.exporter.engines.base import FamilyRow
from oomguard.exporter.model import EngineReading, ModelReading

TOKEN_USAGE = "sglang:token_usage"  # 0-1; newest: the fullest of the full, SWA and mamba pools
FULL_TOKEN_USAGE = "sglang:full_token_usage"  # 0.5.10+: the full-attention pool only
KV_USED_TOKENS = "sglang:kv_used_tokens"
MAX_TOTAL_TOKENS = "sglang:max_total_num_tokens"
RUNNING = "sglang:num_running_reqs"
WAITING = "sglang:num_queue_reqs"
RETRACTED = "sglang:num_retracted_requests_total"  # requests pushed back when the KV pool is full
WEIGHT_GB = "sglang:weight_memory_usage_gb"  # GiB, constants set at start
KV_CACHE_GB = "sglang:kv_cache_memory_usage_gb"
GRAPH_GB = "sglang:graph_memory_usage_gb"  # one series per `phase` (prefill, decode)
GIB = 1024**3

# The data-parallel group of a scheduler; its other rank labels (tp_rank, pp_rank, moe_ep_rank) see one batch.
_GROUP_RANK = "dp_rank"


def _totals_only(samples: Iterable[Sample]) -> list[Sample]:
    """With priority scheduling, queue gauges repeat per `priority="N"`; the total is under priority=""."""
    return [s for s in samples if not s.labels.get("priority")]


def _per_group(samples: Iterable[Sample]) -> dict[str, float]:
    """The largest value of each data-parallel group (its ranks repeat one batch)."""
    groups: dict[str, float] = {}
    for s in samples:
        group = s.labels.get(_GROUP_RANK, "")
        groups[group] = max(groups.get(group, s.value), s.value)
    return groups


def summed_over_groups(samples: Iterable[Sample]) -> float | None:
    groups = _per_group(_totals_only(samples))
    return sum(groups.values()) if groups else None


def largest(samples: Iterable[Sample]) -> float | None:
    values = [s.value for s in _totals_only(samples)]
    return max(values) if values else None


def _rank_key(sample: Sample) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(sample.labels.items()))


def _used_over_capacity(used: list[Sample], capacity: list[Sample]) -> float | None:
    """kv_used_tokens / max_total_num_tokens of each rank, the fullest rank's."""
    totals = {_rank_key(s): s.value for s in capacity if s.value > 0}
    ratios = [s.value / totals[_rank_key(s)] for s in used if _rank_key(s) in totals]
    return max(ratios) if ratios else None


class SglangReader:
    metrics_path: ClassVar[str] = "/metrics"
    health_path: ClassVar[str] = "/health"  # 503 while the server starts, 200 once it serves
    families: ClassVar[frozenset[str]] = frozenset(
        {
            TOKEN_USAGE,
            FULL_TOKEN_USAGE,
            KV_USED_TOKENS,
            MAX_TOTAL_TOKENS,
            RUNNING,
            WAITING,
            RETRACTED,
            WEIGHT_GB,
            KV_CACHE_GB,
            GRAPH_GB,
        }
    )
    # The "Engine families read" table of docs/metrics.md: each oomguard metric and the families (or requests)
    # it comes from; every family in `families` is named in it (tests/engines/test_families_documented.py).
    families_table: ClassVar[tuple[FamilyRow, ...]] = (
        FamilyRow(
            "`oomguard_engine_kv_cache_usage_ratio`",
            "`sglang:token_usage`, `sglang:full_token_usage`, "
            "`sglang:kv_used_tokens` / `sglang:max_total_num_tokens` (the fullest rank)",
        ),
        FamilyRow("`oomguard_engine_requests_waiting`", "`sglang:num_queue_reqs` (summed over `dp_rank`)"),
        FamilyRow("`oomguard_engine_requests_running`", "`sglang:num_running_reqs` (summed over `dp_rank`)"),
        FamilyRow(
            "`oomguard_engine_preemptions_total`",
            "`sglang:num_retracted_requests_total` (retractions: requests pushed back when the KV pool is full)",
        ),
        FamilyRow(
            "`oomguard_engine_memory_bytes{component}`",
            "`sglang:weight_memory_usage_gb` (weights), `sglang:kv_cache_memory_usage_gb` (kv_cache), "
            "`sglang:graph_memory_usage_gb` summed over `phase` (cuda_graphs); GiB x 2^30, the largest rank",
        ),
        FamilyRow(
            "`oomguard_engine_gpu_memory_utilization_ratio`",
            "`mem_fraction_static` of `GET /server_info` (`/get_server_info` before), once per engine life",
        ),
    )

    def read(self, samples: dict[str, list[Sample]]) -> EngineReading:
        if not any(name in samples for name in (RUNNING, WAITING, TOKEN_USAGE, FULL_TOKEN_USAGE, KV_USED_TOKENS)):
            raise ExpositionError(
                "no SGLang families (sglang:num_running_reqs, sglang:token_usage) in the body: is this URL an "
                "SGLang server started with --enable-metrics, and is its engine set right in the config?"
            )
        by_model: dict[str, dict[str, list[Sample]]] = defaultdict(lambda: defaultdict(list))
        for name, found in samples.items():
            for sample in found:
                by_model[sample.labels.get("model_name", "")][name].append(sample)

        def kv_usage(family: dict[str, list[Sample]]) -> float | None:
            for name in (TOKEN_USAGE, FULL_TOKEN_USAGE):
                if family.get(name):
                    return largest(family[name])
            return _used_over_capacity(family.get(KV_USED_TOKENS, []), family.get(MAX_TOTAL_TOKENS, []))

        models = tuple(
            ModelReading(
                model_name=model,
                kv_cache_usage_ratio=finite(kv_usage(family)),
                requests_waiting=summed_over_groups(family.get(WAITING, ())),
                requests_running=summed_over_groups(family.get(RUNNING, ())),
                preemptions_total=summed_over_groups(family.get(RETRACTED, ())),
            )
            for model, family in sorted(by_model.items())
            if any(name in family for name in (RUNNING, WAITING, TOKEN_USAGE, FULL_TOKEN_USAGE, KV_USED_TOKENS))
        )
        return EngineReading(models=models, memory_bytes=_memory(samples))


def _memory(samples: dict[str, list[Sample]]) -> tuple[tuple[str, float], ...]:
    """Each component on one GPU: the largest rank's (tensor-parallel shards are alike), in bytes."""

    def per_rank(found: list[Sample], combine: Callable[[list[float]], float]) -> float | None:
        ranks: dict[tuple[tuple[str, str], ...], list[float]] = defaultdict(list)
        for s in found:
            ranks[tuple(sorted((k, v) for k, v in s.labels.items() if k != "phase"))].append(s.value)
        values = [combine(v) for v in ranks.values()]
        return max(values) if values else None

    out = []
    for component, name, combine in (
        ("weights", WEIGHT_GB, max),
        ("kv_cache", KV_CACHE_GB, max),
        ("cuda_graphs", GRAPH_GB, sum),  # one graph pool per phase, all held at once
    ):
        gib = finite(per_rank(samples.get(name, []), combine))
        if gib is not None:
            out.append((component, gib * GIB))
    return tuple(out)
