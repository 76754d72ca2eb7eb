"""A simulated SGLang server, run as its own process: `python -m oomguard.simulate.engines.sglang`.

Unlike vLLM, SGLang's HTTP server listens from its start: /health answers 503 while the
model loads and 200 once it serves, /metrics has no scheduler series until then, and
/server_info gives its arguments, mem_fraction_static among them. The figures are the
scenario's (simulate/scenarios.py), as the vLLM simulator's are: the fake NVML reads the
same clock. When the scenario runs the GPU out of memory, it writes the scheduler's
traceback with PyTorch's OOM line and exits 1; a start that cannot get its memory writes
SGLang's own line and exits. While the KV pool is full it writes the scheduler's retraction
lines, which are pressure, not an OOM (counted in /metrics, not as events).
"""

from __future__ import annotations

import os
import time

from aiohttp import web

from oomguard.exporter.engines.sglang import PLUGIN
from oomguard.simulate.scenarios import GIB, Scenario
from oomguard.simulate.serve import SimulatedEngine, run_simulator

WEIGHTS_RATIO = 0.2  # the scenarios' weights: a fifth of each GPU
GRAPH_GIB = {"decode": 0.5, "prefill": 0.25}


def log_header(rank: str = " TP0") -> str:
    return time.strftime(f"[%Y-%m-%d %H:%M:%S{rank}] ")


def sglang_metrics_text(scenario: Scenario, t: float, *, life: int = 0, model: str, total_bytes: int) -> str:
    """A /metrics body in SGLang 0.5's names and labels (one scheduler: TP 1, no data parallelism)."""
    if t < scenario.load_seconds:
        return ""  # multiprocess mode: no scheduler series before the scheduler writes any
    f = scenario.engine(t, life)
    labels = f'engine_type="unified",model_name="{model}",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
    kv_bytes = (scenario.gpu_memory_utilization - WEIGHTS_RATIO) * total_bytes
    capacity = int(kv_bytes // (128 * 1024))  # 128 KiB of KV per token
    graphs = "\n".join(
        f'sglang:graph_memory_usage_gb{{{labels},phase="{phase}"}} {gib}' for phase, gib in GRAPH_GIB.items()
    )
    return f"""# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{{labels}}} {float(f.running)}
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{{labels}}} {float(f.waiting)}
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{{labels}}} {round(f.kv_cache_usage, 2)}
# HELP sglang:kv_used_tokens Number of actively used token slots in the KV cache pool.
# TYPE sglang:kv_used_tokens gauge
sglang:kv_used_tokens{{{labels}}} {float(int(f.kv_cache_usage * capacity))}
# HELP sglang:num_retracted_requests_total Total number of retracted requests.
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{{{labels}}} {float(f.preemptions)}
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{{{labels}}} {float(capacity)}
# HELP sglang:weight_memory_usage_gb Memory used by model weights in GB.
# TYPE sglang:weight_memory_usage_gb gauge
sglang:weight_memory_usage_gb{{{labels}}} {WEIGHTS_RATIO * total_bytes / GIB:.2f}
# HELP sglang:kv_cache_memory_usage_gb Memory used by the KV cache pools in GB.
# TYPE sglang:kv_cache_memory_usage_gb gauge
sglang:kv_cache_memory_usage_gb{{{labels}}} {kv_bytes / GIB:.2f}
# HELP sglang:graph_memory_usage_gb Memory used by captured device graphs in GB.
# TYPE sglang:graph_memory_usage_gb gauge
{graphs}
# HELP sglang:queue_time_seconds Histogram of queueing time in seconds.
# TYPE sglang:queue_time_seconds histogram
sglang:queue_time_seconds_bucket{{{labels},le="1.0"}} {float(f.prefix_queries // 900)}
sglang:queue_time_seconds_bucket{{{labels},le="+Inf"}} {float(f.prefix_queries // 900)}
sglang:queue_time_seconds_count{{{labels}}} {float(f.prefix_queries // 900)}
sglang:queue_time_seconds_sum{{{labels}}} {f.prefix_queries / 9000:.1f}
"""


def oom_traceback(scenario: Scenario, *, life: int, pid: int, total_bytes: int) -> str:
    """The scheduler's death of CUDA OOM: the figures of the GPU that runs out, at its death."""
    gpu, used, free = scenario.memory_at_death(life, total_bytes)
    return (
        f"{log_header(f' TP{gpu}')}Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "sglang/srt/managers/scheduler.py", in event_loop_overlap\n'
        '  File "sglang/srt/model_executor/model_runner.py", in forward\n'
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {gpu} has a total capacity "
        f"of {total_bytes / GIB:.2f} GiB of which {free / 1024**2:.2f} MiB is free. Process {pid} has "
        f"{used / GIB:.2f} GiB memory in use.\n"
        f"{log_header('')}Received sigquit from a child process. It usually means the child failed.\n"
    )


def startup_failure() -> str:
    """A start whose KV pool does not fit in what mem_fraction_static leaves after the weights."""
    return (
        f"{log_header()}Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "sglang/srt/model_executor/model_runner.py", in init_memory_pool\n'
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n"
        f"{log_header('')}Received sigquit from a child process. It usually means the child failed.\n"
    )


def retraction_line(retracted: int) -> str:
    """The scheduler's line when the KV pool cannot hold the running batch (0.5's wording): pressure, no OOM.
    The new-token ratio is the scheduler's estimate, raised after a retraction; its figures here are nominal."""
    return (f"{log_header()}KV cache pool is full. Retract requests. #retracted_reqs: {retracted}, "
            "#new_token_ratio: 0.3000 -> 0.7000")  # fmt: skip


async def serve(engine: SimulatedEngine) -> int:
    scenario, args = engine.scenario, engine.args
    info = {
        "model_path": args.model,
        "served_model_name": args.model,
        "mem_fraction_static": scenario.gpu_memory_utilization,
        "tp_size": scenario.gpus,
        "enable_metrics": True,
        "version": "0.5.0 (simulated by oomguard)",
    }

    async def metrics(_: web.Request) -> web.Response:
        body = sglang_metrics_text(
            scenario, engine.now(), life=args.life, model=args.model, total_bytes=args.gpu_total_bytes
        )
        return web.Response(text=body, content_type="text/plain")

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200 if engine.now() >= scenario.load_seconds else 503)

    async def server_info(_: web.Request) -> web.Response:
        return web.json_response(info)

    engine.log(f"{log_header('')}server_args=ServerArgs(model_path='{args.model}', "
               f"mem_fraction_static={scenario.gpu_memory_utilization}, tp_size={scenario.gpus}, enable_metrics=True)")  # fmt: skip
    await engine.listen(
        {"/metrics": metrics, "/health": health, "/server_info": server_info, "/get_server_info": server_info}
    )
    if not scenario.starts(args.life):
        # The weights load (80 % of the load time), then the KV pool cannot be allocated: exit.
        await engine.sleep(scenario.load_seconds * 0.8)
        engine.log(startup_failure())
        return 1
    await engine.sleep(scenario.load_seconds)
    engine.log(f"{log_header('')}The server is fired up and ready to roll!")
    retracted = scenario.engine(engine.now(), args.life).preemptions

    def retract(t: float) -> None:
        # The scheduler writes a line each time it pushes requests back; the counter in /metrics counts them.
        nonlocal retracted
        figures = scenario.engine(t, args.life)
        if figures.preemptions > retracted:
            engine.log(retraction_line(figures.preemptions - retracted))
            retracted = figures.preemptions

    return await engine.serve_until_death(
        lambda: oom_traceback(scenario, life=args.life, pid=os.getpid(), total_bytes=args.gpu_total_bytes), retract
    )


def main(argv: list[str] | None = None) -> int:
    return run_simulator(serve, __doc__, argv, PLUGIN.knobs.told_flags)


if __name__ == "__main__":
    raise SystemExit(main())
