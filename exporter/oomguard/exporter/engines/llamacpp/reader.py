"""llama.cpp's `llama-server --metrics`: see docs/engines.md and docs/metrics.md.

The server writes one unlabelled series per family under the `llamacpp:` prefix
(tools/server/server-task.cpp). Its KV cache ratio (`llamacpp:kv_cache_usage_ratio`) was
removed upstream: read where an older build still writes it, else from `/slots` (slots.py).
"""

from __future__ import annotations

from typing import ClassVar

from oomguard.common.promtext import ExpositionError, Sample, finite
from oomguard.exporter.engines.base import FamilyRow
from oomguard.exporter.model import EngineReading, ModelReading

RUNNING = "llamacpp:requests_processing"  # slots working on a request
WAITING = "llamacpp:requests_deferred"  # requests waiting for a free slot
KV_USAGE_OLD = "llamacpp:kv_cache_usage_ratio"  # removed upstream in 2025; older builds still write it


def _value(samples: dict[str, list[Sample]], name: str) -> float | None:
    found = samples.get(name)
    return finite(sum(s.value for s in found)) if found else None


class LlamaCppReader:
    metrics_path: ClassVar[str] = "/metrics"
    # 503 {"error": {"message": "Loading model"}} while it loads, then 200: never up yet reads "loading".
    health_path: ClassVar[str] = "/health"
    families: ClassVar[frozenset[str]] = frozenset({RUNNING, WAITING, KV_USAGE_OLD})
    # The "Engine families read" table of docs/metrics.md: each oomguard metric and the families (or requests)
    # it comes from; every family in `families` is named in it (tests/engines/test_families_documented.py).
    families_table: ClassVar[tuple[FamilyRow, ...]] = (
        FamilyRow(
            "`oomguard_engine_kv_cache_usage_ratio`",
            "`llamacpp:kv_cache_usage_ratio` where an older build still writes it; else `GET /slots` on each "
            "scrape: the tokens of the slots at work (`n_prompt_tokens`) over all slots' `n_ctx`; absent with "
            "`--no-slots` (501)",
        ),
        FamilyRow("`oomguard_engine_requests_waiting`", "`llamacpp:requests_deferred`"),
        FamilyRow("`oomguard_engine_requests_running`", "`llamacpp:requests_processing`"),
    )

    def read(self, samples: dict[str, list[Sample]]) -> EngineReading:
        if RUNNING not in samples and WAITING not in samples:
            raise ExpositionError(
                "no llama.cpp families (llamacpp:requests_processing, llamacpp:requests_deferred) in the body: "
                "is this URL a llama-server started with --metrics, and is its engine set right in the config?"
            )
        model = ModelReading(
            model_name="",  # its metrics name no model
            kv_cache_usage_ratio=_value(samples, KV_USAGE_OLD),  # else /slots (slots.py), as in current builds
            requests_waiting=_value(samples, WAITING),
            requests_running=_value(samples, RUNNING),
        )
        # No reservation: the context (-c, -np) is allocated whole at start, and published as no share.
        return EngineReading(models=(model,))
