"""Hugging Face TGI's /metrics (v2 - v3, router in Rust): see docs/engines.md and docs/metrics.md.

The router exports one unlabelled series per family (no model, no ranks: one router
drives all its shards), on its own port and on `--prometheus-port`.
"""

from __future__ import annotations

from typing import ClassVar

from oomguard.common.promtext import ExpositionError, Sample, finite
from oomguard.exporter.engines.base import FamilyRow
from oomguard.exporter.model import EngineReading, ModelReading

WAITING = "tgi_queue_size"
RUNNING = "tgi_batch_current_size"
BATCH_MAX_TOKENS = "tgi_batch_current_max_tokens"  # tokens the running batch may reach
MAX_TOTAL_TOKENS = "tgi_batch_max_total_tokens"  # the KV capacity, set once after warm-up


def _value(samples: dict[str, list[Sample]], name: str) -> float | None:
    found = samples.get(name)
    return finite(sum(s.value for s in found)) if found else None


class TgiReader:
    metrics_path: ClassVar[str] = "/metrics"
    health_path: ClassVar[str] = "/health"  # the router listens only after warm-up: refused while loading
    families: ClassVar[frozenset[str]] = frozenset({WAITING, RUNNING, BATCH_MAX_TOKENS, MAX_TOTAL_TOKENS})
    # The "Engine families read" table of docs/metrics.md: each oomguard metric and the families (or requests)
    # it comes from; every family in `families` is named in it (tests/engines/test_families_documented.py).
    families_table: ClassVar[tuple[FamilyRow, ...]] = (
        FamilyRow(
            "`oomguard_engine_kv_cache_usage_ratio`",
            "`tgi_batch_current_max_tokens` / `tgi_batch_max_total_tokens` (a proxy: the tokens the running "
            "batch may reach, out of the KV capacity)",
        ),
        FamilyRow("`oomguard_engine_requests_waiting`", "`tgi_queue_size`"),
        FamilyRow("`oomguard_engine_requests_running`", "`tgi_batch_current_size`"),
    )

    def read(self, samples: dict[str, list[Sample]]) -> EngineReading:
        if WAITING not in samples and RUNNING not in samples:
            raise ExpositionError(
                "no TGI families (tgi_queue_size, tgi_batch_current_size) in the body: is this URL a TGI "
                "router, and is its engine set right in the config?"
            )
        batch_tokens, capacity = _value(samples, BATCH_MAX_TOKENS), _value(samples, MAX_TOTAL_TOKENS)
        # TGI's nearest to a KV cache use: the tokens its running batch may grow to, out of what fits.
        usage = batch_tokens / capacity if batch_tokens is not None and capacity else None
        model = ModelReading(
            model_name="",  # TGI's metrics name no model
            kv_cache_usage_ratio=usage,
            requests_waiting=_value(samples, WAITING),
            requests_running=_value(samples, RUNNING),
        )
        # The reservation (--cuda-memory-fraction) is in neither /metrics nor /info: unknown.
        return EngineReading(models=(model,))
