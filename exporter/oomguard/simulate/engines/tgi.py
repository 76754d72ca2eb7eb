"""A simulated TGI (text-generation-inference 3.x), run as its own process: `python -m oomguard.simulate.engines.tgi`.

One process plays the launcher, its shard and its router. As the real one, it writes the launcher's
`Args { ... }` line first, loads its shard and warms it up, and only then starts the router: the port
refuses connections while loading (as vLLM's does), then /health answers 200 and /metrics carries the
router's unlabelled gauges, `tgi_batch_max_total_tokens` (the KV capacity) set by the warm-up. The
figures are the scenario's (simulate/scenarios.py), as the other simulators' are. When the scenario runs
the GPU out of memory, the shard writes PyTorch's OOM traceback, the launcher sees it crash and exits 1;
a start that cannot get its memory fails the warm-up with TGI's own line and exits 1. TGI has no
preemption metric, so the scenario's preemptions are not shown.
"""

from __future__ import annotations

import os
import time

from aiohttp import web

from oomguard.simulate.scenarios import GIB, Scenario
from oomguard.simulate.serve import SimulatedEngine, run_simulator

WEIGHTS_RATIO = 0.2  # the scenarios' weights: a fifth of each GPU
KV_BYTES_PER_TOKEN = 128 * 1024
MAX_PREFILL_TOKENS = 4096  # --max-batch-prefill-tokens' default


def log_header(level: str = "INFO", target: str = "text_generation_launcher") -> str:
    """TGI's text log prefix: "2025-04-02T10:00:12.812203Z  INFO text_generation_launcher: "."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
    return f"{stamp} {level:>5} {target}: "


def max_total_tokens(scenario: Scenario, total_bytes: int) -> int:
    """The KV capacity the warm-up infers: what --cuda-memory-fraction leaves after the weights, in tokens."""
    return int((scenario.gpu_memory_utilization - WEIGHTS_RATIO) * total_bytes // KV_BYTES_PER_TOKEN)


def tgi_metrics_text(scenario: Scenario, t: float, *, life: int = 0, total_bytes: int) -> str:
    """A router /metrics body in TGI 3.x's names (metrics-exporter-prometheus: unlabelled, TYPE lines)."""
    f = scenario.engine(t, life)
    capacity = max_total_tokens(scenario, total_bytes)
    requests = f.prefix_queries // 900  # a request per simulated second of serving
    decodes = f.prefix_queries // 9
    return f"""# TYPE tgi_request_count counter
tgi_request_count {requests + f.running + f.waiting}
# TYPE tgi_request_success counter
tgi_request_success {requests}
# TYPE tgi_batch_inference_count counter
tgi_batch_inference_count{{method="prefill"}} {requests + f.running}
tgi_batch_inference_count{{method="decode"}} {decodes}
# HELP tgi_queue_size Current queue size
# TYPE tgi_queue_size gauge
tgi_queue_size {f.waiting}
# HELP tgi_batch_current_size Current batch size
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size {f.running}
# HELP tgi_batch_current_max_tokens Maximum tokens for the current batch
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens {int(f.kv_cache_usage * capacity)}
# HELP tgi_batch_max_total_tokens Maximum total tokens for the batch
# TYPE tgi_batch_max_total_tokens gauge
tgi_batch_max_total_tokens {capacity}
"""


def args_line(scenario: Scenario, model: str, port: int) -> str:
    """The launcher's first line: its arguments (patterns.yaml's `startup`)."""
    return (f"{log_header()}Args {{ model_id: \"{model}\", sharded: {'Some(true)' if scenario.gpus > 1 else 'None'}, "
            f"num_shard: Some({scenario.gpus}), max_batch_prefill_tokens: None, max_batch_total_tokens: None, "
            f"cuda_memory_fraction: {scenario.gpu_memory_utilization}, port: {port}, prometheus_port: 9000 }}")  # fmt: skip


def warmup_failure() -> str:
    """The warm-up's prefill does not fit in what --cuda-memory-fraction leaves: the router exits, then the launcher."""
    return (
        f"{log_header('ERROR', f'warmup{{max_prefill_tokens={MAX_PREFILL_TOKENS}}}:warmup: text_generation_router_v3::client')}"
        f"backends/v3/src/client/mod.rs:45: Server error: Not enough memory to handle {MAX_PREFILL_TOKENS} prefill "
        "tokens. You need to decrease `--max-batch-prefill-tokens`\n"
        f"{log_header('ERROR')}Webserver Crashed\n"
        f"{log_header()}Shutting down shards\n"
    )


def oom_traceback(scenario: Scenario, *, life: int, pid: int, total_bytes: int) -> str:
    """The shard's death of CUDA OOM in a decode (the figures of its GPU at death), then the launcher's lines."""
    gpu, used, free = scenario.memory_at_death(life, total_bytes)
    return (
        f"{log_header('ERROR')}Method Decode encountered an error.\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/src/server/text_generation_server/interceptor.py", line 24, in intercept\n'
        "    return await response\n"
        '  File "/usr/src/server/text_generation_server/models/flash_causal_lm.py", in generate_token\n'
        "    out, speculative_logits = self.forward(batch, adapter_data)\n"
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {gpu} has a total capacity "
        f"of {total_bytes / GIB:.2f} GiB of which {free / 1024**2:.2f} MiB is free. Process {pid} has "
        f"{used / GIB:.2f} GiB memory in use.\n"
        f"{log_header('ERROR')}Shard {gpu} crashed\n"
        f"{log_header('ERROR')}Webserver Crashed\n"
        f"{log_header()}Shutting down shards\n"
    )


async def serve(engine: SimulatedEngine) -> int:
    scenario, args = engine.scenario, engine.args
    engine.log(args_line(scenario, args.model, args.port))
    for rank in range(scenario.gpus):
        engine.log(f"{log_header()}Starting shard rank={rank}")
    # The weights load (80 % of the load time), then the warm-up sizes the KV cache.
    await engine.sleep(scenario.load_seconds * 0.8)
    for rank in range(scenario.gpus):
        engine.log(f"{log_header()}Shard ready in {scenario.load_seconds * 0.8:.1f}s rank={rank}")
    engine.log(f"{log_header()}Starting Webserver")
    engine.log(f"{log_header('INFO', 'text_generation_router_v3')}backends/v3/src/lib.rs:125: Warming up model")
    if not scenario.starts(args.life):
        engine.log(warmup_failure())
        return 1
    await engine.sleep(scenario.load_seconds - engine.now())

    async def metrics(_: web.Request) -> web.Response:
        body = tgi_metrics_text(scenario, engine.now(), life=args.life, total_bytes=args.gpu_total_bytes)
        return web.Response(text=body, content_type="text/plain")

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200)  # the router checks its shards; they are healthy until the OOM

    engine.log(f"{log_header('INFO', 'text_generation_router_v3')}backends/v3/src/lib.rs:137: Setting max batch "
               f"total tokens to {max_total_tokens(scenario, args.gpu_total_bytes)}")  # fmt: skip
    await engine.listen({"/metrics": metrics, "/health": health})
    engine.log(f"{log_header('INFO', 'text_generation_router::server')}router/src/server.rs:2445: Connected")
    return await engine.serve_until_death(
        lambda: oom_traceback(scenario, life=args.life, pid=os.getpid(), total_bytes=args.gpu_total_bytes)
    )


def main(argv: list[str] | None = None) -> int:
    return run_simulator(serve, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
