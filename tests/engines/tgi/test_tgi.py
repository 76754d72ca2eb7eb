"""TGI: its reader on bodies reproduced from its router (its log lines: tests/engines/test_log_patterns.py)."""

from __future__ import annotations

import pytest
from support import engine_reading, fixture_body

from oomguard.common.promtext import ExpositionError


def test_a_busy_router() -> None:
    reading = engine_reading("tgi", fixture_body("tgi", "tgi-3.x.prom"))
    (model,) = reading.models
    assert model.model_name == ""  # TGI's metrics name no model
    assert (model.requests_waiting, model.requests_running) == (6.0, 14.0)
    assert model.kv_cache_usage_ratio == pytest.approx(98304 / 131072)
    assert model.preemptions_total is None  # TGI has no preemption metric
    # --cuda-memory-fraction is published nowhere: no reservation, so no budget or headroom is made up.
    assert reading.memory_utilization_ratio is None and reading.reservation_ratio is None


def test_without_the_kv_capacity_the_usage_is_unknown() -> None:
    (model,) = engine_reading("tgi", fixture_body("tgi", "tgi-3.x-partial.prom")).models
    assert (model.requests_waiting, model.requests_running) == (0.0, 0.0)
    assert model.kv_cache_usage_ratio is None


def test_a_zero_capacity_is_not_a_division() -> None:
    (model,) = engine_reading(
        "tgi", "tgi_queue_size 1\ntgi_batch_current_max_tokens 10\ntgi_batch_max_total_tokens 0\n"
    ).models
    assert model.kv_cache_usage_ratio is None


@pytest.mark.parametrize("body", ["", "tgi_request_count 5\n", fixture_body("sglang", "sglang-0.5.x-tp1.prom")])
def test_a_body_that_is_not_tgi_is_refused(body: str) -> None:
    with pytest.raises(ExpositionError, match="no TGI families"):
        engine_reading("tgi", body)
