"""Every engine's own log lines (engines/<name>/patterns.yaml, with the generic allocator lines): what one
incident counts as, which line is a start, and that a start closes an open incident. One table of cases, each
run through the detector a target of that engine gets; every engine has its cases and its start line."""

from __future__ import annotations

import pytest
from support import engine_detector, log_kinds

from oomguard.exporter.engines import ENGINES

# -- vLLM: V1 engine lines (0.9 - 0.32), as its engine core prints them.
VLLM_OOM = [
    "(EngineCore pid=7) ERROR 12-02 12:00:00 [core.py:701] EngineCore encountered a fatal error.",
    "(EngineCore pid=7) ERROR 12-02 12:00:00 [core.py:701] Traceback (most recent call last):",
    "(EngineCore pid=7) ERROR 12-02 12:00:00 [core.py:701] torch.OutOfMemoryError: CUDA out of memory. "
    "Tried to allocate 2.00 GiB.",
]
VLLM_NO_KV = [
    "(EngineCore_DP0 pid=9) ERROR 12-02 12:00:00 [core.py:708] EngineCore failed to start.",
    "(EngineCore_DP0 pid=9) ERROR 12-02 12:00:00 [core.py:708] Traceback (most recent call last):",
    "(EngineCore_DP0 pid=9) ERROR 12-02 12:00:00 [core.py:708] ValueError: No available memory for the cache "
    "blocks. Try increasing `gpu_memory_utilization` when initializing the engine.",
]
# -- SGLang 0.5's wording (python/sglang/srt/model_executor/model_runner.py, scheduler.py) with its log header;
# the traceback frames are illustrative.
SGLANG_NO_MEMORY = """[2026-01-10 09:00:03 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2710, in run_scheduler_process
    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)
  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", line 1420, in init_memory_pool
    raise RuntimeError(
RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.
[2026-01-10 09:00:03] Received sigquit from a child process. It usually means the child failed.""".splitlines()
SGLANG_RETRACTIONS = [
    "[2026-01-10 09:10:00 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3, "
    "#new_token_ratio: 0.6316 -> 1.0000",
    "[2025-03-01 09:10:00 TP0] Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.4000 -> 0.9000",
    "[2026-01-10 09:10:01 TP0] Decode batch. #running-req: 41, #token: 381300, token usage: 0.98, cuda graph: True, "
    "gen throughput (token/s): 2210.44, #queue-req: 7",
]
SGLANG_OOM = """[2026-01-10 09:20:00 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 1020, in event_loop_overlap
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity""".splitlines()
# -- TGI 3's warm-up failure as its launcher prints it (backends/v3 and server/text_generation_server/models).
TGI_WARMUP_OOM = [
    "2025-04-02T10:00:12.812203Z ERROR warmup{max_input_length=Some(8191) max_prefill_tokens=8192 "
    "max_total_tokens=Some(8192) max_batch_size=None}:warmup: text_generation_router_v3::client: "
    "backends/v3/src/client/mod.rs:45: Server error: Not enough memory to handle 8192 prefill tokens. "
    "You need to decrease `--max-batch-prefill-tokens`",
    "2025-04-02T10:00:13.101442Z ERROR text_generation_launcher: Webserver Crashed",
]
# -- Triton with TensorRT-LLM, as reported in triton-inference-server/tensorrtllm_backend issues #195 and #281 (0.7).
TRITON_LOAD_OOM = [
    "E0104 10:00:00.000000 1 backend_model.cc:634] ERROR: Failed to create instance: unexpected error when creating "
    "modelInstanceState: [TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(ptr, n, "
    "mCudaStream->get()): out of memory (/app/tensorrt_llm/cpp/tensorrt_llm/runtime/tllmBuffers.h:112)",
    "E0104 10:00:00.100000 1 model_lifecycle.cc:621] failed to load 'tensorrt_llm' version 1: Internal: "
    "unexpected error when creating modelInstanceState",
]
TRITON_OOM = (
    "[TensorRT-LLM][ERROR] Encountered an error in forwardAsync function: [TensorRT-LLM][ERROR] CUDA runtime "
    "error in ::cudaMallocAsync(ptr, n, mCudaStream->get()): out of memory (/app/tensorrt_llm/cpp/tensorrt_llm/"
    "runtime/tllmBuffers.h:112)"
)
# -- llama.cpp: a CUDA build that cannot place its weights, as ggml-cuda, ggml-alloc and libllama print it (b11434
# sources: ggml/src/ggml-cuda/ggml-cuda.cu, ggml/src/ggml-alloc.c, src/llama-model.cpp, tools/server/server.cpp).
LLAMACPP_WEIGHTS_OOM = [
    "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 15258.79 MiB on device 0: cudaMalloc failed: out of memory",
    "alloc_tensor_range: failed to allocate CUDA0 buffer of size 16000000000",
    "llama_model_load: error loading model: unable to allocate CUDA0 buffer",
    "srv    load_model: failed to load model, '/models/big.gguf'",
    "srv    operator(): exiting due to model loading error",
]
LLAMACPP_NO_CONTEXT = [
    "llama_kv_cache: failed to allocate buffer for kv cache",
    "llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache",
    "srv    operator(): exiting due to model loading error",
]

# (engine, what it is, its lines, the kinds its incidents count as)
CASES: list[tuple[str, str, list[str], list[str]]] = [
    ("vllm", "a runtime OOM is cuda_oom", VLLM_OOM, ["cuda_oom"]),
    ("vllm", "a KV cache that cannot fit is startup_memory", VLLM_NO_KV, ["startup_memory"]),
    ("vllm", "an engine core that fails to start is engine_death",
     ["(EngineCore pid=7) ERROR 12-02 12:00:00 [core.py:701] EngineCore failed to start."], ["engine_death"]),
    ("sglang", "a start without memory is startup_memory", SGLANG_NO_MEMORY, ["startup_memory"]),
    ("sglang", "a full KV pool is not an OOM nor any event", SGLANG_RETRACTIONS, []),
    ("sglang", "a runtime OOM is cuda_oom", SGLANG_OOM, ["cuda_oom"]),
    ("sglang", "a crash without memory is engine_death",
     [SGLANG_NO_MEMORY[0], "ValueError: token_to_kv_pool_allocator memory leak detected!"], ["engine_death"]),
    ("tgi", "a warm-up without memory is startup_memory", TGI_WARMUP_OOM, ["startup_memory"]),
    ("tgi", "a shard that fails to start without a memory line is engine_death",
     ["2025-04-02T10:00:05.000000Z ERROR text_generation_launcher: Shard 0 failed to start"], ["engine_death"]),
    ("triton", "a model load without memory is startup_memory", TRITON_LOAD_OOM, ["startup_memory"]),
    ("triton", "an allocation failure while serving is cuda_oom", [TRITON_OOM], ["cuda_oom"]),
    ("triton", "a load failure without memory is engine_death",
     ["E0104 10:00:00.100000 1 model_lifecycle.cc:621] failed to load 'tensorrt_llm' version 1: Not found"],
     ["engine_death"]),
    ("llamacpp", "a CUDA OOM at load is cuda_oom", LLAMACPP_WEIGHTS_OOM, ["cuda_oom"]),
    ("llamacpp", "a context that does not fit is startup_memory", LLAMACPP_NO_CONTEXT, ["startup_memory"]),
    ("llamacpp", "compute buffers that do not fit are startup_memory",
     ["graph_reserve: failed to allocate compute buffers"], ["startup_memory"]),
    ("llamacpp", "a load error without memory lines is engine_death",
     ["srv    operator(): exiting due to model loading error"], ["engine_death"]),
    ("llamacpp", "ordinary lines are no event",
     ["srv  llama_server: model loaded", "slot update_slots: id  0 | task 3 | prompt done"], []),
]  # fmt: skip

# A line each engine prints when a new life starts.
STARTS = {
    "vllm": "(APIServer pid=1) INFO 12-02 12:00:05 [api_server.py:1000] vLLM API server version 0.32.0",
    "sglang": "[2026-01-10 09:30:00] server_args=ServerArgs(model_path='meta-llama/Llama-3.1-8B', tp_size=1)",
    "tgi": '2025-04-02T09:59:00.000000Z  INFO text_generation_launcher: Args { model_id: "m", sharded: None }',
    "triton": "I0104 10:01:00.000000 1 grpc_server.cc:2463] Started GRPCInferenceService at 0.0.0.0:8001",
    "llamacpp": "0.00.005.189 I srv    load_model: loading model '/models/m.gguf'",
}


@pytest.mark.parametrize(
    ("engine", "lines", "expected"),
    [pytest.param(e, lines, kinds, id=f"{e}: {what}") for e, what, lines, kinds in CASES],
)
def test_an_incident_counts_as_its_most_telling_kind(engine: str, lines: list[str], expected: list[str]) -> None:
    assert log_kinds(engine, lines) == expected


@pytest.mark.parametrize("engine", list(ENGINES))
def test_each_engine_has_its_cases_and_its_start_line(engine: str) -> None:
    assert any(case[0] == engine for case in CASES), f"{engine}: add its log cases to CASES"
    detector = engine_detector(engine)
    detector.feed(STARTS[engine], 1.0)
    assert [e.kind for e in detector.take_starts()] == ["startup"]


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_start_closes_an_open_incident_at_once(engine: str) -> None:
    """The incident of a life that died is counted when the next life starts, not a quiet spell later."""
    first = next(lines for e, _, lines, kinds in CASES if e == engine and kinds)
    detector = engine_detector(engine)
    for line in first:
        detector.feed(line, 0.0)
    closed = detector.feed(STARTS[engine], 1.0)
    assert [e.kind for e in closed] == log_kinds(engine, first)
