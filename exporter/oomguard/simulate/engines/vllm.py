"""A simulated vLLM server, run as its own process: `python -m oomguard.simulate.engines.vllm`.

Like the real one it refuses connections while it "loads its model", then serves
/health and a vLLM 0.32-format /metrics, and when its scenario runs the GPU out of
memory it writes PyTorch's OOM traceback to stderr and exits 1. Being a real
process on a real port, it exercises the exporter's HTTP, process-finding and
restart paths exactly as a real engine does.
"""

from __future__ import annotations

import os
import time

from aiohttp import web

from oomguard.exporter.engines.vllm import PLUGIN
from oomguard.simulate.scenarios import GIB, IDLE_GPU_BYTES, EngineFigures, Scenario
from oomguard.simulate.serve import SimulatedEngine, run_simulator


def vllm_metrics_text(
    scenario: Scenario, t: float, *, life: int = 0, model: str, start_time: float, total_bytes: int
) -> str:
    """A /metrics body in vLLM 0.32's names and shape (the families oomguard reads, plus noise)."""
    f = scenario.engine(t, life)
    budget = scenario.gpu_memory_utilization * total_bytes
    kv_bytes = int(budget * 0.6)
    block_size = 16
    blocks = kv_bytes // (block_size * 128 * 1024)
    labels = f'engine="0",model_name="{model}"'
    return f"""# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds {start_time:.2f}
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{labels}}} {float(f.running)}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{labels}}} {float(f.waiting)}
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{labels}}} {f.kv_cache_usage}
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{{labels}}} {float(f.prefix_queries)}
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{{labels}}} {float(f.prefix_hits)}
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{{labels}}} {float(f.preemptions)}
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{{{labels},le="1.0"}} {float(f.prefix_queries // 900)}
vllm:e2e_request_latency_seconds_bucket{{{labels},le="+Inf"}} {float(f.prefix_queries // 900)}
vllm:e2e_request_latency_seconds_count{{{labels}}} {float(f.prefix_queries // 900)}
vllm:e2e_request_latency_seconds_sum{{{labels}}} {f.prefix_queries / 1800:.1f}
# HELP vllm:admission_rejections_total Number of admission attempts rejected by a queue limit, by reason.
# TYPE vllm:admission_rejections_total counter
vllm:admission_rejections_total{{model_name="{model}",reason="max_num_queued_reqs"}} 0.0
vllm:admission_rejections_total{{model_name="{model}",reason="max_num_queued_tokens"}} 0.0
{_kv_offload(scenario, f, labels)}# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="{block_size}",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="{scenario.gpu_memory_utilization}",kv_cache_memory_bytes="{kv_bytes}",num_cpu_blocks="None",num_gpu_blocks="{blocks}",num_gpu_blocks_override="None"}} 1.0
"""


def _kv_offload(scenario: Scenario, f: EngineFigures, labels: str) -> str:
    """vLLM 0.32's KV offloading families, where the scenario offloads: 32 KiB stored per prefix-cache query token,
    8 KiB loaded back per hit token, and the older counter by direction beside them, as 0.32 writes it."""
    if not scenario.kv_offload:
        return ""
    stored, loaded = float(f.prefix_queries * 32768), float(f.prefix_hits * 8192)
    return f"""# HELP vllm:kv_offload_total_bytes_total Number of bytes offloaded by KV connector
# TYPE vllm:kv_offload_total_bytes_total counter
vllm:kv_offload_total_bytes_total{{{labels},transfer_type="CPU_to_GPU"}} {loaded}
vllm:kv_offload_total_bytes_total{{{labels},transfer_type="GPU_to_CPU"}} {stored}
# HELP vllm:kv_offload_load_bytes_total Total bytes loaded from offload storage to GPU.
# TYPE vllm:kv_offload_load_bytes_total counter
vllm:kv_offload_load_bytes_total{{{labels}}} {loaded}
# HELP vllm:kv_offload_store_bytes_total Total bytes stored from GPU to offload storage.
# TYPE vllm:kv_offload_store_bytes_total counter
vllm:kv_offload_store_bytes_total{{{labels}}} {stored}
"""


OOM_TRACEBACK = """(EngineCore pid={pid}) ERROR {stamp} [core.py:701] EngineCore encountered a fatal error.
(EngineCore pid={pid}) Traceback (most recent call last):
(EngineCore pid={pid})   File "vllm/v1/engine/core.py", line 701, in run_engine_core
(EngineCore pid={pid})     engine_core.run_busy_loop()
(EngineCore pid={pid})   File "vllm/v1/worker/gpu_model_runner.py", line 2210, in execute_model
(EngineCore pid={pid})     hidden_states = self.model(input_ids, positions)
(EngineCore pid={pid}) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {gpu} has a total capacity of {total:.2f} GiB of which {free:.2f} MiB is free. Process {pid} has {used:.2f} GiB memory in use.
"""

# Tensor parallel: the rank whose allocation fails writes the traceback, then the engine core dies with it.
TP_OOM_TRACEBACK = """(Worker_TP{gpu} pid={pid}) ERROR {stamp} [multiproc_executor.py:671] WorkerProc hit an exception.
(Worker_TP{gpu} pid={pid}) Traceback (most recent call last):
(Worker_TP{gpu} pid={pid})   File "vllm/v1/executor/multiproc_executor.py", line 666, in worker_busy_loop
(Worker_TP{gpu} pid={pid})     output = func(*args, **kwargs)
(Worker_TP{gpu} pid={pid})   File "vllm/v1/worker/gpu_model_runner.py", line 2210, in execute_model
(Worker_TP{gpu} pid={pid})     hidden_states = self.model(input_ids, positions)
(Worker_TP{gpu} pid={pid}) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {gpu} has a total capacity of {total:.2f} GiB of which {free:.2f} MiB is free. Process {pid} has {used:.2f} GiB memory in use.
(EngineCore_DP0 pid={pid}) ERROR {stamp} [core.py:701] EngineCore encountered a fatal error.
"""


# A start that cannot allocate its KV cache (vLLM 0.32's wording): too long a max_model_len for what is left...
MAX_LEN_TRACEBACK = """(EngineCore pid={pid}) ERROR {stamp} [core.py:1510] EngineCore failed to start.
(EngineCore pid={pid}) Traceback (most recent call last):
(EngineCore pid={pid})   File "vllm/v1/core/kv_cache_utils.py", line 686, in check_enough_kv_cache_memory
(EngineCore pid={pid}) ValueError: To serve at least one request with the model's max seq len (32768), (4.00 GiB KV cache is needed, which is larger than the available KV cache memory (1.50 GiB). Based on the available memory, the estimated maximum model length is 12288. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.
(APIServer pid={pid}) Traceback (most recent call last):
(APIServer pid={pid})   File "vllm/v1/engine/core_client.py", line 476, in __init__
(APIServer pid={pid}) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{'EngineCore': 1}}
"""
# ...or less free memory than the reservation, because another process holds it.
FREE_MEMORY_TRACEBACK = """(EngineCore pid={pid}) ERROR {stamp} [core.py:1510] EngineCore failed to start.
(EngineCore pid={pid}) Traceback (most recent call last):
(EngineCore pid={pid})   File "vllm/v1/worker/gpu_worker.py", line 190, in init_device
(EngineCore pid={pid}) ValueError: Free memory on device ({free:.2f}/{total:.2f} GiB) on startup is less than desired GPU memory utilization ({utilization}, {wanted:.2f} GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.
(APIServer pid={pid}) Traceback (most recent call last):
(APIServer pid={pid})   File "vllm/v1/engine/core_client.py", line 476, in __init__
(APIServer pid={pid}) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{'EngineCore': 1}}
"""


def log_stamp() -> str:
    """vLLM's logger's time: "12-02 12:00:00" (month-day), before the source in its record header."""
    return time.strftime("%m-%d %H:%M:%S")


def startup_traceback(scenario: Scenario, *, pid: int, total_bytes: int, foreign: float = 0.0) -> str:
    """What the engine writes when it cannot allocate its memory at start (`foreign`: the share of the GPU another
    process holds meanwhile)."""
    if scenario.foreign_after is None:
        return MAX_LEN_TRACEBACK.format(pid=pid, stamp=log_stamp())
    free = total_bytes * (1 - foreign) - IDLE_GPU_BYTES
    wanted = scenario.gpu_memory_utilization * total_bytes
    return FREE_MEMORY_TRACEBACK.format(pid=pid, stamp=log_stamp(), free=free / GIB, total=total_bytes / GIB,
                                        utilization=scenario.gpu_memory_utilization, wanted=wanted / GIB)  # fmt: skip


def oom_traceback(scenario: Scenario, *, life: int, pid: int, total_bytes: int) -> str:
    """What the engine writes as it dies of CUDA OOM: the figures of its GPU that runs out, at its death."""
    gpu, used, free = scenario.memory_at_death(life, total_bytes)
    template = TP_OOM_TRACEBACK if scenario.gpus > 1 else OOM_TRACEBACK
    return template.format(
        pid=pid, stamp=log_stamp(), gpu=gpu, total=total_bytes / GIB, free=free / 1024**2, used=used / GIB
    )


async def serve(engine: SimulatedEngine) -> int:
    scenario, args = engine.scenario, engine.args
    engine.log(f"(APIServer pid={os.getpid()}) INFO {log_stamp()} [api_server.py:1000] vLLM API server version 0.32.0 "
               "(simulated by oomguard), "
               f"serving model {args.model}")  # fmt: skip
    if not scenario.starts(args.life):
        # The weights load (80 % of the load time), then the KV cache cannot be allocated: exit, never listen.
        await engine.sleep(scenario.load_seconds * 0.8)
        engine.log(startup_traceback(scenario, pid=os.getpid(), total_bytes=args.gpu_total_bytes, foreign=args.foreign))
        return 1
    await engine.sleep(scenario.load_seconds)

    async def metrics(_: web.Request) -> web.Response:
        body = vllm_metrics_text(
            scenario, engine.now(), life=args.life, model=args.model, start_time=engine.launched,
            total_bytes=args.gpu_total_bytes,
        )  # fmt: skip
        return web.Response(text=body, content_type="text/plain")

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    await engine.listen({"/metrics": metrics, "/health": health})
    engine.log(f"(APIServer pid={os.getpid()}) INFO:     Application startup complete.")
    return await engine.serve_until_death(
        lambda: oom_traceback(scenario, life=args.life, pid=os.getpid(), total_bytes=args.gpu_total_bytes)
    )


def main(argv: list[str] | None = None) -> int:
    return run_simulator(serve, __doc__, argv, PLUGIN.knobs.told_flags)


if __name__ == "__main__":
    raise SystemExit(main())
