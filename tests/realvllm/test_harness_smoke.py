"""End-to-end check of the real-vLLM harness: a CPU vLLM serving a tiny model.

Needs the vLLM venv (scripts/install-vllm.sh, or OOMGUARD_VLLM_VENV). Without
it these tests skip, unless OOMGUARD_REQUIRE_REALVLLM is set, where they fail.
Each server start costs ~20-35 s of the 2 CPU cores, so servers run one at a
time: no server fixture outlives its test.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

# harness.py sits beside this file; found this way under any pytest import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

pytestmark = pytest.mark.realvllm


def test_too_few_kv_blocks_fails_startup(tiny_model: Path, tmp_path: Path) -> None:
    # 2 blocks of 128 tokens cannot hold one 512-token sequence: vLLM refuses
    # to start, the real "startup OOM" an exporter has to report.
    server = harness.VllmServer(
        tiny_model,
        harness.free_port(),
        extra_args=("--num-gpu-blocks-override", "2"),
        log_path=tmp_path / "vllm.log",
    )
    with server:
        code = server.wait_exit(timeout=180)
        log = server.log_text()
    assert code != 0, log[-3000:]
    assert "larger than the available KV cache memory" in log, log[-3000:]


def test_metrics_and_kv_pressure_under_load(
    tiny_model: Path, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    # 8 blocks x 128 tokens and 4 running sequences: 12 requests of ~360
    # tokens each cannot all fit, so the cache fills and requests queue.
    server = harness.VllmServer(
        tiny_model,
        harness.free_port(),
        extra_args=("--num-gpu-blocks-override", "8", "--max-num-seqs", "4"),
        log_path=tmp_path / "vllm.log",
    )
    with server:
        startup_s = server.wait_healthy(timeout=180)
        record_property("vllm_startup_s", round(startup_s, 2))
        print(f"vLLM healthy {startup_s:.1f} s after launch")
        assert startup_s > 0

        status, text = harness.http_get(server.url + "/metrics")
        assert status == 200
        for name in ("vllm:kv_cache_usage_perc", "vllm:num_requests_waiting"):
            assert harness.metric_values(text, name), f"{name} missing from /metrics"

        load = harness.run_load(server.url, n=12, prompt_tokens=160, max_tokens=200)
        max_kv = max_waiting = 0.0
        deadline = time.monotonic() + 300
        while not load.done() and time.monotonic() < deadline:
            _, text = harness.http_get(server.url + "/metrics", timeout=2.0)
            max_kv = max([max_kv, *harness.metric_values(text, "vllm:kv_cache_usage_perc")])
            max_waiting = max([max_waiting, *harness.metric_values(text, "vllm:num_requests_waiting")])
            time.sleep(0.2)
        statuses = load.wait(timeout=max(1.0, deadline - time.monotonic()))
        _, text = harness.http_get(server.url + "/metrics")
        preemptions = sum(harness.metric_values(text, "vllm:num_preemptions_total"))

    print(f"under load: max kv usage {max_kv}, max waiting {max_waiting}, preemptions {preemptions}")
    record_property("max_kv_cache_usage_perc", max_kv)
    record_property("max_num_requests_waiting", max_waiting)
    assert max_kv >= 0.9 or max_waiting >= 1, (max_kv, max_waiting)
    assert statuses == [200] * 12, statuses
