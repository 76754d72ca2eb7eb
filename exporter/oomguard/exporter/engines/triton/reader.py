"""Triton Inference Server with the TensorRT-LLM backend: its /metrics (metrics port, 8002).

The backend writes two gauge families per model (`model`, `version` labels), each
broken down by a type label: `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type}`
(max, free, used, tokens_per, fraction) and `nv_trt_llm_request_metrics{request_type}`
(active, max, scheduled, context, waiting). See docs/engines.md and docs/metrics.md.
"""

from __future__ import annotations

from collections import defaultdict
from typing import ClassVar

from oomguard.common.promtext import ExpositionError, Sample, finite
from oomguard.exporter.engines.base import FamilyRow
from oomguard.exporter.model import EngineReading, ModelReading

KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
REQUESTS = "nv_trt_llm_request_metrics"


def _by_type(samples: list[Sample], label: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        out[s.labels.get(label, "")].append(s.value)
    return out


def _sum(values: list[float]) -> float | None:
    return finite(sum(values)) if values else None


class TritonReader:
    metrics_path: ClassVar[str] = "/metrics"
    # Served on the HTTP port (8000), not on the metrics port: a 404 there with a good /metrics body counts as up.
    health_path: ClassVar[str] = "/v2/health/ready"
    families: ClassVar[frozenset[str]] = frozenset({KV_BLOCKS, REQUESTS})
    # The "Engine families read" table of docs/metrics.md: each oomguard metric and the families (or requests)
    # it comes from; every family in `families` is named in it (tests/engines/test_families_documented.py).
    families_table: ClassVar[tuple[FamilyRow, ...]] = (
        FamilyRow(
            "`oomguard_engine_kv_cache_usage_ratio`",
            '`nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used"}` / `{...="max"}`; '
            '`{...="fraction"}` where those are missing',
        ),
        FamilyRow("`oomguard_engine_requests_running`", '`nv_trt_llm_request_metrics{request_type="active"}`'),
        FamilyRow("`oomguard_engine_requests_waiting`", '`nv_trt_llm_request_metrics{request_type="waiting"}`'),
        FamilyRow(
            "`oomguard_engine_kv_cache_blocks`, `oomguard_engine_kv_cache_block_size_tokens`",
            '`nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max"}`, `{...="tokens_per"}`',
        ),
    )

    def read(self, samples: dict[str, list[Sample]]) -> EngineReading:
        if KV_BLOCKS not in samples and REQUESTS not in samples:
            raise ExpositionError(
                "no TensorRT-LLM families (nv_trt_llm_request_metrics, nv_trt_llm_kv_cache_block_metrics) in "
                "the body: is this URL Triton's metrics port, with a tensorrt_llm model loaded?"
            )
        per_model: dict[str, dict[str, list[Sample]]] = defaultdict(lambda: defaultdict(list))
        for name in (KV_BLOCKS, REQUESTS):
            for s in samples.get(name, ()):
                per_model[s.labels.get("model", "")][name].append(s)
        models = []
        blocks: list[float] = []
        block_sizes: list[float] = []
        for model, family in sorted(per_model.items()):
            kv = _by_type(family.get(KV_BLOCKS, []), "kv_cache_block_type")
            requests = _by_type(family.get(REQUESTS, []), "request_type")
            models.append(
                ModelReading(
                    model_name=model,
                    kv_cache_usage_ratio=_usage(kv),
                    # "active": the requests the executor holds (context and generation); "waiting": queued.
                    requests_running=_sum(requests.get("active", [])),
                    requests_waiting=_sum(requests.get("waiting", [])),
                )
            )
            blocks += kv.get("max", [])
            block_sizes += kv.get("tokens_per", [])
        return EngineReading(
            models=tuple(models),
            kv_cache_blocks=_sum(blocks),
            kv_cache_block_size_tokens=max(block_sizes) if block_sizes else None,
            # kv_cache_free_gpu_mem_fraction is a share of the memory left free after the weights, not of the
            # total, and neither is published here: the reservation stays unknown (docs/engines.md).
        )


def _usage(kv: dict[str, list[float]]) -> float | None:
    """used / max blocks, summed over versions; the backend's own `fraction` where those are missing."""
    used, capacity = sum(kv.get("used", [])), sum(kv.get("max", []))
    if kv.get("used") and capacity > 0:
        return finite(used / capacity)
    fractions = kv.get("fraction")
    return finite(max(fractions)) if fractions else None
