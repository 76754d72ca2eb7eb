"""TGI: its reader on bodies reproduced from its router, and its log lines."""

from __future__ import annotations

import pytest
from support import engine_detector, fixture_body, log_kinds

from oomguard.engines.tgi.reader import TgiReader
from oomguard.events.detector import IncidentDetector
from oomguard.model import EngineReading
from oomguard.promtext import ExpositionError, FamilyExtractor


def read_text(body: str) -> EngineReading:
    return TgiReader().read(FamilyExtractor(TgiReader.families).extract(body))


def test_a_busy_router() -> None:
    reading = read_text(fixture_body("tgi", "tgi-3.x.prom"))
    (model,) = reading.models
    assert model.model_name == ""  # TGI's metrics name no model
    assert (model.requests_waiting, model.requests_running) == (6.0, 14.0)
    assert model.kv_cache_usage_ratio == pytest.approx(98304 / 131072)
    assert model.preemptions_total is None  # TGI has no preemption metric
    # --cuda-memory-fraction is published nowhere: no reservation, so no budget or headroom is made up.
    assert reading.memory_utilization_ratio is None and reading.reservation_ratio is None


def test_without_the_kv_capacity_the_usage_is_unknown() -> None:
    (model,) = read_text(fixture_body("tgi", "tgi-3.x-partial.prom")).models
    assert (model.requests_waiting, model.requests_running) == (0.0, 0.0)
    assert model.kv_cache_usage_ratio is None


def test_a_zero_capacity_is_not_a_division() -> None:
    (model,) = read_text("tgi_queue_size 1\ntgi_batch_current_max_tokens 10\ntgi_batch_max_total_tokens 0\n").models
    assert model.kv_cache_usage_ratio is None


@pytest.mark.parametrize("body", ["", "tgi_request_count 5\n", fixture_body("sglang", "sglang-0.5.x-tp1.prom")])
def test_a_body_that_is_not_tgi_is_refused(body: str) -> None:
    with pytest.raises(ExpositionError, match="no TGI families"):
        read_text(body)


def detector() -> IncidentDetector:
    return engine_detector("tgi")


def kinds(lines: list[str]) -> list[str]:
    return log_kinds("tgi", lines)


# TGI 3's warm-up failure as its launcher prints it (backends/v3 and server/text_generation_server/models).
WARMUP_OOM = [
    "2025-04-02T10:00:12.812203Z ERROR warmup{max_input_length=Some(8191) max_prefill_tokens=8192 "
    "max_total_tokens=Some(8192) max_batch_size=None}:warmup: text_generation_router_v3::client: "
    "backends/v3/src/client/mod.rs:45: Server error: Not enough memory to handle 8192 prefill tokens. "
    "You need to decrease `--max-batch-prefill-tokens`",
    "2025-04-02T10:00:13.101442Z ERROR text_generation_launcher: Webserver Crashed",
]


def test_a_warm_up_without_memory_is_startup_memory() -> None:
    assert kinds(WARMUP_OOM) == ["startup_memory"]


def test_a_shard_that_fails_to_start_without_a_memory_line_is_engine_death() -> None:
    assert kinds(["2025-04-02T10:00:05.000000Z ERROR text_generation_launcher: Shard 0 failed to start"]) == [
        "engine_death"
    ]


def test_the_launchers_arguments_line_is_a_start() -> None:
    d = detector()
    d.feed('2025-04-02T09:59:00.000000Z  INFO text_generation_launcher: Args { model_id: "m", sharded: None }', 1.0)
    assert [e.kind for e in d.take_starts()] == ["startup"]
