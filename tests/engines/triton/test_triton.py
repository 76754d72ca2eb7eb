"""Triton with the TensorRT-LLM backend: its reader on reproduced bodies (its log lines:
tests/engines/test_log_patterns.py)."""

from __future__ import annotations

import pytest
from support import engine_reading, fixture_body

from oomguard.common.promtext import ExpositionError


def test_blocks_and_requests() -> None:
    reading = engine_reading("triton", fixture_body("triton", "triton-trtllm-25.x.prom"))
    (model,) = reading.models  # only the tensorrt_llm model writes these families, not the ensemble
    assert model.model_name == "tensorrt_llm"
    assert model.kv_cache_usage_ratio == pytest.approx(2400 / 6239)
    assert (model.requests_running, model.requests_waiting) == (12.0, 3.0)
    assert (reading.kv_cache_blocks, reading.kv_cache_block_size_tokens) == (6239.0, 64.0)
    # kv_cache_free_gpu_mem_fraction is a share of the free memory after the weights: not a reservation.
    assert reading.memory_utilization_ratio is None and reading.reservation_ratio is None


def test_an_older_backend_without_waiting_gives_a_partial_reading() -> None:
    (model,) = engine_reading("triton", fixture_body("triton", "triton-trtllm-older.prom")).models
    assert model.model_name == "llama"
    assert model.requests_running == 4.0
    assert model.requests_waiting is None
    assert model.kv_cache_usage_ratio == pytest.approx(0.1)


def test_the_backends_fraction_when_used_blocks_are_missing() -> None:
    body = 'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="m",version="1"} 0.25\n'
    (model,) = engine_reading("triton", body).models
    assert model.kv_cache_usage_ratio == 0.25
    assert model.requests_running is None


def test_versions_of_one_model_are_summed() -> None:
    body = "".join(
        f'nv_trt_llm_request_metrics{{model="m",request_type="active",version="{v}"}} {n}\n'
        f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="used",model="m",version="{v}"}} {n}\n'
        f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="max",model="m",version="{v}"}} 100\n'
        for v, n in (("1", 10), ("2", 30))
    )
    reading = engine_reading("triton", body)
    (model,) = reading.models
    assert model.requests_running == 40.0
    assert model.kv_cache_usage_ratio == pytest.approx(0.2)
    assert reading.kv_cache_blocks == 200.0


@pytest.mark.parametrize("body", ["", 'nv_inference_request_success{model="m",version="1"} 3\n'])
def test_a_body_without_tensorrt_llm_is_refused(body: str) -> None:
    with pytest.raises(ExpositionError, match="no TensorRT-LLM families"):
        engine_reading("triton", body)
