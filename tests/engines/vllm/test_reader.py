"""vLLM reader on real bodies (0.32 CPU, 0.10 GPU) and on bodies in the older names."""

from __future__ import annotations

import pytest
from support import vllm_body

from oomguard.common.promtext import ExpositionError, FamilyExtractor
from oomguard.exporter.engines.vllm.reader import VllmReader


def read(name: str):
    return VllmReader().read(FamilyExtractor(VllmReader.families).extract(vllm_body(name)))


def test_vllm_032_under_load() -> None:
    reading = read("vllm-0.32.0-cpu-under-load.txt")
    (model,) = reading.models
    assert model.model_name == "tiny"
    assert model.kv_cache_usage_ratio == pytest.approx(0.7142857142857143)
    assert (model.requests_waiting, model.requests_running, model.preemptions_total) == (1.0, 4.0, 5.0)
    assert (model.prefix_cache_queries_total, model.prefix_cache_hits_total) == (3703.0, 2816.0)
    assert reading.memory_utilization_ratio == 0.92
    assert reading.kv_cache_blocks == 8
    assert reading.kv_cache_block_size_tokens == 128
    assert reading.kv_cache_memory_bytes == 1073741824
    assert reading.process_start_time_seconds == pytest.approx(1.79622794708e09)


def test_vllm_032_idle() -> None:
    (model,) = read("vllm-0.32.0-cpu-idle.txt").models
    assert model.kv_cache_usage_ratio == 0.0
    assert model.requests_waiting == 0.0


def test_vllm_010_gpu_prefers_new_names_when_both_are_shown() -> None:
    reading = read("vllm-0.10.x-gpu-ngc.txt")
    (model,) = reading.models
    assert model.model_name == "Qwen/Qwen3-4B-Instruct-2507-FP8"
    assert model.kv_cache_usage_ratio == pytest.approx(0.0011764705882353343)
    assert (model.prefix_cache_queries_total, model.prefix_cache_hits_total) == (246.0, 80.0)
    assert reading.memory_utilization_ratio == 0.9
    assert reading.kv_cache_blocks == 850
    assert reading.kv_cache_block_size_tokens == 16
    assert reading.kv_cache_memory_bytes is None  # not in this version's cache_config_info
    assert reading.process_start_time_seconds == pytest.approx(1.77104238234e09)


def test_v0_names_and_several_models() -> None:
    reading = read("vllm-v0-two-models.txt")
    by_name = {m.model_name: m for m in reading.models}
    assert set(by_name) == {"llama-3-8b", "qwen-7b"}
    assert by_name["llama-3-8b"].kv_cache_usage_ratio == 0.93
    assert by_name["llama-3-8b"].requests_waiting == 17.0
    assert by_name["llama-3-8b"].preemptions_total == 41.0
    assert by_name["qwen-7b"].kv_cache_usage_ratio == 0.12
    assert by_name["llama-3-8b"].prefix_cache_queries_total is None
    assert reading.kv_cache_blocks == 27000


def test_data_parallel_engines_are_aggregated() -> None:
    reading = read("vllm-v1-data-parallel.txt")
    (model,) = reading.models
    assert model.requests_waiting == 8.0
    assert model.requests_running == 22.0
    assert model.preemptions_total == 10.0
    assert model.kv_cache_usage_ratio == pytest.approx(0.6)  # mean of the new name, old name ignored
    assert reading.kv_cache_blocks == 2000
    assert reading.memory_utilization_ratio == 0.85


@pytest.mark.parametrize("body", ["", "hello world\n", "# HELP foo bar\nfoo 1\n", '{"error": "not found"}'])
def test_a_body_that_is_not_vllm_is_refused_with_a_reason(body: str) -> None:
    with pytest.raises(ExpositionError, match="no vLLM families"):
        VllmReader().read(FamilyExtractor(VllmReader.families).extract(body))


def test_sleep_state_on_a_real_body_is_awake() -> None:
    reading = read("vllm-0.32.0-cpu-idle.txt")
    assert reading.sleep_state == "awake" and not reading.asleep
    assert reading.reservation_ratio == reading.memory_utilization_ratio
    assert read("vllm-v0-two-models.txt").sleep_state is None  # versions before sleep mode say nothing


def _with_sleep(states: dict[str, str]) -> str:
    """The real idle body with its sleep state replaced: one current state per data-parallel engine."""
    lines = [line for line in vllm_body("vllm-0.32.0-cpu-idle.txt").splitlines() if "engine_sleep_state{" not in line]
    for engine, current in states.items():
        for state in ("awake", "weights_offloaded", "discard_all"):
            value = "1.0" if state == current else "0.0"
            lines.append(
                f'vllm:engine_sleep_state{{engine="{engine}",model_name="tiny",sleep_state="{state}"}} {value}'
            )
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ({"0": "weights_offloaded"}, "weights_offloaded"),
        ({"0": "discard_all"}, "discard_all"),
        ({"0": "awake", "1": "weights_offloaded"}, "weights_offloaded"),  # one rank asleep: not awake
        ({"0": "weights_offloaded", "1": "discard_all"}, "discard_all"),  # the deepest sleep
    ],
)
def test_a_sleeping_engine_reserves_nothing(states: dict[str, str], expected: str) -> None:
    body = _with_sleep(states)
    reading = VllmReader().read(FamilyExtractor(VllmReader.families).extract(body))
    assert reading.sleep_state == expected
    assert reading.asleep and reading.reservation_ratio is None
    assert reading.memory_utilization_ratio == 0.92  # the configuration is still known
