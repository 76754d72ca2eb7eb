"""A simulated Triton (TensorRT-LLM backend), run as its own process: `python -m oomguard.simulate.engines.triton`.

A real Triton listens on three ports: HTTP (8000, `/v2/health/ready`), gRPC (8001) and metrics (8002,
`/metrics`). The simulation serves one port, the metrics port the exporter is given as the target's URL:
`/metrics` there, and 404 for every other path, `/v2/health/ready` included, as Triton's metrics server
answers (the exporter counts a 404 with a good body as up). Like the real server, which starts its
endpoints only once the model repository is loaded, it listens on nothing while it loads, then writes
its `Started ...Service at` lines. The figures are the scenario's (simulate/scenarios.py), in the
backend's gauge families. When the scenario runs the GPU out of memory it writes TensorRT-LLM's CUDA
error and exits 1 (a real server may go on failing requests rather than exit: the scenario's death is
the simulation's); a start that cannot get its KV cache writes the model load's failure and Triton's
`creating server` error, and exits 1, as with `--exit-on-error` (the default).
"""

from __future__ import annotations

import os
import time

from aiohttp import web

from oomguard.simulate.fake_nvml import FakeGpu
from oomguard.simulate.scenarios import GIB, IDLE_GPU_BYTES, Scenario
from oomguard.simulate.serve import TICK_SECONDS, SimulatedEngine, run_simulator

WEIGHTS_RATIO = 0.2  # the scenarios' weights: a fifth of each GPU
TOKENS_PER_BLOCK = 64  # tokens_per_block, the backend's default
KV_BYTES_PER_TOKEN = 128 * 1024
MAX_BATCH_SIZE = 64  # the "max" request type: the executor's max_batch_size
# The model's name in Triton's repository: the backend's own (all_models/inflight_batcher_llm/tensorrt_llm), which
# its engine_death lines name. --model is left unused: Triton's labels name the repository's model, not the checkpoint.
MODEL = "tensorrt_llm"
# TensorRT-LLM's allocation failure, as the backend reports it (tensorrtllm_backend issues #195, #281).
CUDA_OOM = ("[TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(ptr, n, mCudaStream->get()): "
            "out of memory (/app/tensorrt_llm/cpp/tensorrt_llm/runtime/tllmBuffers.h:112)")  # fmt: skip


def glog(severity: str, source: str, message: str) -> str:
    """A line in Triton's glog format, the message quoted (24.x on): `I1203 16:10:03.123456 42 file.cc:12] "..."`."""
    now = time.time()
    stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1e6):06d}"
    return f'{severity}{stamp} {os.getpid()} {source}] "{message}"'


def kv_blocks(scenario: Scenario, total_bytes: int) -> int:
    """The KV cache pool's blocks: the scenario's utilization stands for kv_cache_free_gpu_mem_fraction, a share of
    what the weights leave free."""
    kv_bytes = scenario.gpu_memory_utilization * (1 - WEIGHTS_RATIO) * total_bytes
    return int(kv_bytes // (TOKENS_PER_BLOCK * KV_BYTES_PER_TOKEN))


def triton_metrics_text(scenario: Scenario, t: float, *, life: int = 0, model: str, total_bytes: int) -> str:
    """A /metrics body in Triton 25.x's names and labels with one TensorRT-LLM model (version 1) on each GPU of the
    scenario. Paused requests (the backend's counterpart of a preemption) are the scenario's preemptions of the
    last tick."""
    f = scenario.engine(t, life)
    paused = f.preemptions - scenario.engine(max(0.0, t - TICK_SECONDS), life).preemptions
    capacity = kv_blocks(scenario, total_bytes)
    used = min(capacity, round(f.kv_cache_usage * capacity))
    labels = f'model="{model}",version="1"'
    requests = {"context": f.running // 4, "scheduled": max(0, f.running - paused), "max": MAX_BATCH_SIZE,
                "active": f.running, "waiting": f.waiting}  # fmt: skip
    blocks = {"max": capacity, "free": capacity - used, "used": used, "tokens_per": TOKENS_PER_BLOCK}
    gpus = [FakeGpu(i).uuid for i in range(scenario.gpus)]
    gpu_used = [int(scenario.gpu_used_ratio(t, life, i) * total_bytes) + IDLE_GPU_BYTES for i in range(scenario.gpus)]
    return "\n".join(
        [
            "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes",
            "# TYPE nv_inference_request_success counter",
            f"nv_inference_request_success{{{labels}}} {f.prefix_queries // 900}",
            "# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting "
            "execution per-model.",
            "# TYPE nv_inference_pending_request_count gauge",
            f"nv_inference_pending_request_count{{{labels}}} {f.waiting}",
            "# HELP nv_trt_llm_request_metrics TRT LLM request metrics",
            "# TYPE nv_trt_llm_request_metrics gauge",
            *(f'nv_trt_llm_request_metrics{{model="{model}",request_type="{kind}",version="1"}} {n}'
              for kind, n in requests.items()),
            "# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics",
            "# TYPE nv_trt_llm_kv_cache_block_metrics gauge",
            *(f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="{kind}",model="{model}",version="1"}} {n}'
              for kind, n in blocks.items()),
            f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="fraction",{labels}}} {used / capacity:.6f}',
            "# HELP nv_trt_llm_inflight_batcher_metrics TRT LLM inflight_batcher-specific metrics",
            "# TYPE nv_trt_llm_inflight_batcher_metrics gauge",
            f'nv_trt_llm_inflight_batcher_metrics{{inflight_batcher_specific_metric="paused_requests",{labels}}} '
            f"{paused}",
            "# HELP nv_gpu_memory_total_bytes GPU total memory, in bytes",
            "# TYPE nv_gpu_memory_total_bytes gauge",
            *(f'nv_gpu_memory_total_bytes{{gpu_uuid="{uuid}"}} {total_bytes}' for uuid in gpus),
            "# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes",
            "# TYPE nv_gpu_memory_used_bytes gauge",
            *(f'nv_gpu_memory_used_bytes{{gpu_uuid="{uuid}"}} {n}' for uuid, n in zip(gpus, gpu_used, strict=True)),
            "",
        ]
    )  # fmt: skip


def kv_cache_lines(scenario: Scenario, total_bytes: int, free_bytes: float) -> str:
    """TensorRT-LLM's lines as it sizes the KV cache pool at the end of the load."""
    return (f"[TensorRT-LLM][INFO] Memory usage when calculating max tokens in paged kv cache: total: "
            f"{total_bytes / GIB:.2f} GiB, available: {free_bytes / GIB:.2f} GiB\n"
            "[TensorRT-LLM][INFO] Number of blocks in KV cache primary pool: "
            f"{kv_blocks(scenario, total_bytes)}")  # fmt: skip


def model_table(model: str, status: str) -> str:
    """The table of the repository's models Triton writes once it has tried to load them all."""
    width, status_width = max(len(model), 5), max(len(status), 6)
    rule = f"+-{'-' * width}-+---------+-{'-' * status_width}-+"
    return "\n".join([rule, f"| {'Model':<{width}} | Version | {'Status':<{status_width}} |", rule,
                      f"| {model:<{width}} | 1       | {status:<{status_width}} |", rule])  # fmt: skip


def startup_failure(scenario: Scenario, *, model: str, total_bytes: int, foreign: float) -> str:
    """A load whose KV cache pool cannot be allocated; Triton then gives up on the whole repository and exits."""
    free = total_bytes * (1 - foreign - WEIGHTS_RATIO) - IDLE_GPU_BYTES
    reason = f"unexpected error when creating modelInstanceState: {CUDA_OOM}"
    return "\n".join(
        [
            kv_cache_lines(scenario, total_bytes, free),
            glog("E", "backend_model.cc:692", f"ERROR: Failed to create instance: {reason}"),
            glog("E", "model_lifecycle.cc:654", f"failed to load '{model}' version 1: Internal: {reason}"),
            model_table(model, f"UNAVAILABLE: Internal: {reason}"),
            "error: creating server: Internal - failed to load all models",
        ]
    )


def ready_lines(scenario: Scenario, *, model: str, port: int, total_bytes: int) -> str:
    """The end of a good load: the pool's size, the model READY, then the endpoints, the gRPC one first (the
    `startup` line of patterns.yaml)."""
    free = total_bytes * (1 - WEIGHTS_RATIO) - IDLE_GPU_BYTES
    return "\n".join(
        [
            kv_cache_lines(scenario, total_bytes, free),
            glog("I", "model_lifecycle.cc:849", f"successfully loaded '{model}'"),
            model_table(model, "READY"),
            glog("I", "grpc_server.cc:2558", "Started GRPCInferenceService at 0.0.0.0:8001"),
            glog("I", "http_server.cc:4704", "Started HTTPService at 0.0.0.0:8000"),
            glog("I", "http_server.cc:362", f"Started Metrics Service at 0.0.0.0:{port}"),
        ]
    )


def oom_line() -> str:
    """The executor's allocation failure while serving: a `cuda_oom` (patterns.yaml), no figures in it."""
    return f"[TensorRT-LLM][ERROR] Encountered an error in forwardAsync function: {CUDA_OOM}"


async def serve(engine: SimulatedEngine) -> int:
    scenario, args = engine.scenario, engine.args
    engine.log(glog("I", "pinned_memory_manager.cc:277",
                    "Pinned memory pool is created at '0x7f2a4c000000' with size 268435456"))  # fmt: skip
    engine.log(glog("I", "cuda_memory_manager.cc:107", "CUDA memory pool is created on device 0 with size 67108864"))
    engine.log(glog("I", "model_lifecycle.cc:473", f"loading: {MODEL}:1"))
    engine.log(glog("I", "backend_model.cc:503", f"TRITONBACKEND_ModelInstanceInitialize: {MODEL}_0_0 (device 0)"))
    if not scenario.starts(args.life):
        # The engine's weights load (80 % of the load time), then the KV cache pool cannot be allocated: exit,
        # never having listened.
        await engine.sleep(scenario.load_seconds * 0.8)
        engine.log(startup_failure(scenario, model=MODEL, total_bytes=args.gpu_total_bytes, foreign=args.foreign))
        return 1
    await engine.sleep(scenario.load_seconds)

    async def metrics(_: web.Request) -> web.Response:
        body = triton_metrics_text(
            scenario, engine.now(), life=args.life, model=MODEL, total_bytes=args.gpu_total_bytes
        )
        return web.Response(text=body, content_type="text/plain")

    # Only /metrics: the metrics port answers 404 to anything else, /v2/health/ready included.
    await engine.listen({"/metrics": metrics})
    engine.log(ready_lines(scenario, model=MODEL, port=args.port, total_bytes=args.gpu_total_bytes))
    return await engine.serve_until_death(oom_line)


def main(argv: list[str] | None = None) -> int:
    return run_simulator(serve, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
