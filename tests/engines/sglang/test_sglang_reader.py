"""SGLang reader on bodies reproduced from its metrics collector: figures, rank aggregation, partial bodies."""

from __future__ import annotations

import pytest
from support import engine_reading, fixture_body, promtool_check_metrics, samples, vllm_body

from oomguard.common.promtext import ExpositionError
from oomguard.exporter.exposition import engine
from oomguard.exporter.exposition.encoder import Exposition
from oomguard.exporter.model import EngineReading, TargetReading

GIB = 2**30


def read(name: str) -> EngineReading:
    return engine_reading("sglang", fixture_body("sglang", name))


def without(body: str, *names: str) -> str:
    return "\n".join(line for line in body.splitlines() if not line.startswith(names)) + "\n"


def test_one_scheduler() -> None:
    reading = read("sglang-0.5.x-tp1.prom")
    (model,) = reading.models
    assert model.model_name == "meta-llama/Llama-3.1-8B-Instruct"
    assert model.kv_cache_usage_ratio == 0.82
    assert (model.requests_running, model.requests_waiting, model.preemptions_total) == (5.0, 2.0, 3.0)
    assert model.prefix_cache_queries_total is None  # SGLang counts no prefix cache tokens this way
    assert dict(reading.memory_bytes) == {
        "weights": pytest.approx(14.99 * GIB),
        "kv_cache": pytest.approx(56.76 * GIB),
        "cuda_graphs": pytest.approx(0.75 * GIB),  # decode + prefill graphs, both held
    }
    # Not in /metrics: mem_fraction_static comes from /server_info (test_sglang_settings.py).
    assert reading.memory_utilization_ratio is None and reading.reservation_ratio is None
    assert reading.process_start_time_seconds is None  # multiprocess mode: no process_* series


def test_data_parallel_groups_are_summed_and_their_ranks_not_double_counted() -> None:
    (model,) = read("sglang-0.5.x-dp2-tp2-priority.prom").models
    # dp_rank 0 runs 7 (written by tp_rank 0 and 1), dp_rank 1 runs 9: 16, not 32 nor the per-priority lines.
    assert model.requests_running == 16.0
    assert model.requests_waiting == 5.0
    assert model.preemptions_total == 7.0
    assert model.kv_cache_usage_ratio == 0.91  # the fullest rank


def test_memory_is_per_gpu_the_largest_rank() -> None:
    memory = dict(read("sglang-0.5.x-dp2-tp2-priority.prom").memory_bytes)
    assert memory["weights"] == pytest.approx(30.53 * GIB)
    assert memory["kv_cache"] == pytest.approx(40.0 * GIB)
    assert memory["cuda_graphs"] == pytest.approx(2.0 * GIB)  # dp_rank 1: 1.5 decode + 0.5 prefill


def test_an_older_body_gives_what_it_has() -> None:
    reading = read("sglang-0.4.x-older.prom")
    (model,) = reading.models
    assert (model.kv_cache_usage_ratio, model.requests_running, model.requests_waiting) == (0.47, 12.0, 0.0)
    assert model.preemptions_total is None  # no retraction counter yet
    assert reading.memory_bytes == ()


def test_kv_usage_from_token_counts_when_no_ratio_is_shown() -> None:
    body = without(fixture_body("sglang", "sglang-0.5.x-tp1.prom"), "sglang:token_usage", "sglang:full_token_usage")
    (model,) = engine_reading("sglang", body).models
    assert model.kv_cache_usage_ratio == pytest.approx(381300 / 465000)


def test_full_token_usage_when_token_usage_is_missing() -> None:
    body = without(fixture_body("sglang", "sglang-0.5.x-tp1.prom"), "sglang:token_usage")
    body = body.replace('moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.82', 'moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.8')
    (model,) = engine_reading("sglang", body).models
    assert model.kv_cache_usage_ratio == 0.8


def test_a_body_missing_families_gives_a_partial_reading() -> None:
    (model,) = engine_reading("sglang", 'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 4.0\n').models
    assert model.requests_waiting == 4.0
    assert (model.requests_running, model.kv_cache_usage_ratio, model.preemptions_total) == (None, None, None)


@pytest.mark.parametrize("body", ["", "hello\n", "# HELP foo bar\nfoo 1\n", "sglang:prompt_tokens_total 5\n"])
def test_a_body_that_is_not_sglang_is_refused_with_a_reason(body: str) -> None:
    with pytest.raises(ExpositionError, match="no SGLang families"):
        engine_reading("sglang", body)


def test_a_vllm_body_is_refused() -> None:
    with pytest.raises(ExpositionError, match="no SGLang families"):
        engine_reading("sglang", vllm_body("vllm-0.32.0-cpu-idle.txt"))


def test_the_memory_breakdown_is_exported_in_bytes_and_passes_promtool(promtool: str) -> None:
    reading = read("sglang-0.5.x-tp1.prom")
    target = TargetReading(
        "sglang-0", "sglang", "http://127.0.0.1:30000", (0,), True, "up", 0.01, engine_reading=reading
    )
    out = Exposition(engine.METRICS, frozenset(engine.METRICS))
    engine.add(out, target)
    text = out.render()
    assert promtool_check_metrics(promtool, text) == ""
    got = samples(text.decode())
    key = "oomguard_engine_memory_bytes"
    assert got[(key, (("component", "weights"), ("target", "sglang-0")))] == pytest.approx(14.99 * GIB)
    assert got[(key, (("component", "cuda_graphs"), ("target", "sglang-0")))] == pytest.approx(0.75 * GIB)
    assert "# HELP oomguard_engine_memory_bytes " in text.decode()
