"""A simulated llama.cpp `llama-server --metrics`, run as its own process: `python -m oomguard.simulate.engines.llamacpp`.

Like the real server it listens from its start: while the model loads, /health answers 503
{"error": {"message": "Loading model", ...}} and so do /metrics and /slots; once it serves, /health
answers 200 {"status": "ok"}. /metrics has the unlabelled `llamacpp:` families of a b11434 server
(tests/fixtures/llamacpp/metrics.prom); /slots has SLOTS slots of N_CTX tokens each (`-c 49152 -np 12`),
the scenario's running requests at work in as many slots, holding the scenario's KV use between them.
A request beyond the slots waits for one (deferred), as do the scenario's waiting requests: llama.cpp has
no preemption, and its slots cap what runs.

Its log is llama-server's: the `loading model '<path>'` line at each start (the startup its patterns.yaml
matches), ggml-cuda's `cudaMalloc failed: out of memory` when a compute buffer cannot grow at its death,
and, for a start that cannot get its memory, the KV cache's allocation failure and `exiting due to model
loading error` (exit 1). The figures are the scenario's (simulate/scenarios.py): the fake NVML reads the
same clock.
"""

from __future__ import annotations

import json

from aiohttp import web

from oomguard.simulate.scenarios import Scenario
from oomguard.simulate.serve import SimulatedEngine, run_simulator

# -np 12: the most slots whose working ones can hold the scenarios' KV use as their batch churns (4 requests
# at 0.31 of the KV cache); the overload's 16 running requests leave 4 deferred.
SLOTS = 12
N_CTX = 4096  # each slot's context: -c 49152 split between the slots
KV_BYTES_PER_TOKEN = 128 * 1024
COMPUTE_BUFFER_MIB = 2048.0  # what the compute buffer asks for when it grows at the death
LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


def processing_deferred(scenario: Scenario, t: float, life: int = 0) -> tuple[int, int]:
    """(requests in a slot, requests waiting for one): the scenario's running and waiting, capped by the slots."""
    f = scenario.engine(t, life)
    return min(SLOTS, f.running), f.waiting + max(0, f.running - SLOTS)


def slot_tokens(scenario: Scenario, t: float, life: int = 0) -> list[int]:
    """The tokens each slot holds at work (0: idle): the scenario's KV use spread over its running requests.
    A slot holds at most its context, so a KV use beyond what the working slots can hold shows them full."""
    f = scenario.engine(t, life)
    working, _ = processing_deferred(scenario, t, life)
    total = round(f.kv_cache_usage * SLOTS * N_CTX)
    share, extra = divmod(total, working) if working else (0, 0)
    return [min(N_CTX, share + (i < extra)) if i < working else 0 for i in range(SLOTS)]


def slots_body(scenario: Scenario, t: float, life: int = 0) -> list[dict[str, object]]:
    """GET /slots: the fields slots.py reads, and a few more of the real body's (tests/fixtures/llamacpp/)."""
    return [
        {
            "id": i,
            "n_ctx": N_CTX,
            "speculative": False,
            "is_processing": held > 0,
            "id_task": 100 + i if held else -1,
            "n_prompt_tokens": held,
            "n_prompt_tokens_processed": held,
            "n_prompt_tokens_cache": 0,
            "next_token": [{"has_next_token": held > 0, "has_new_line": False, "n_remain": -1, "n_decoded": 0}],
        }
        for i, held in enumerate(slot_tokens(scenario, t, life))
    ]


def _family(name: str, kind: str, help_text: str, value: float) -> str:
    shown = value if isinstance(value, int) else round(value, 6)  # counters of tokens stay whole
    return f"# HELP llamacpp:{name} {help_text}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {shown}\n"


def llamacpp_metrics_text(scenario: Scenario, t: float, *, life: int = 0) -> str:
    """A /metrics body in llama-server b11434's names, types and order (no labels), once it serves."""
    f = scenario.engine(t, life)
    held = slot_tokens(scenario, t, life)
    prompt = f.prefix_queries * 16  # tokens of the prompts processed so far
    predicted = f.prefix_queries * 4
    decodes = max(1, f.prefix_queries // 4)
    busy, deferred = processing_deferred(scenario, t, life)
    return "".join(
        (
            _family("prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens",
                    prompt),
            _family("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache", 0),
            _family("prompt_seconds_total", "counter", "Total time spent processing prompts", prompt / 4000),
            _family("tokens_predicted_total", "counter", "Number of generation tokens processed", predicted),
            _family("tokens_predicted_seconds_total", "counter", "Total time spent generating tokens",
                    predicted / 400),
            _family("n_decode_total", "counter", "Total number of llama_decode() calls, excluding speculative "
                    "decoding and multimodal decoding", decodes),
            _family("n_tokens_max", "counter", "Largest observed sequence length (prompt + generation)",
                    max(held, default=0)),
            _family("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s", 4000),
            _family("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s", 400),
            _family("requests_processing", "gauge", "Number of requests processing", busy),
            _family("requests_deferred", "gauge", "Number of requests deferred", deferred),
            _family("n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call",
                    round(busy * 0.9, 5)),
        )
    )  # fmt: skip


def startup_lines(model: str, host: str, port: int) -> str:
    """What llama-server writes as it starts: its listener first, then the model's load (the `startup` line)."""
    return (
        f"main: setting n_parallel = {SLOTS} and kv_unified = false\n"
        "build: 11434 (simulated by oomguard)\n"
        f"main: HTTP server is listening, hostname: {host}, port: {port}, http threads: 15\n"
        "main: loading model\n"
        f"srv    load_model: loading model '{model}'\n"
    )


def ready_lines(host: str, port: int) -> str:
    kv_mib = SLOTS * N_CTX * KV_BYTES_PER_TOKEN / 1024**2
    return (
        f"llama_kv_cache:      CUDA0 KV buffer size = {kv_mib:.2f} MiB\n"
        "main: model loaded\n"
        f"main: server is listening on http://{host}:{port}\n"
        "main: starting the main loop...\n"
        "srv  update_slots: all slots are idle\n"
    )


def oom_lines(scenario: Scenario, *, life: int, total_bytes: int) -> str:
    """The death: a compute buffer cannot grow on the GPU that runs out, and the CUDA backend aborts."""
    gpu, _, _ = scenario.memory_at_death(life, total_bytes)
    size = int(COMPUTE_BUFFER_MIB * 1024**2)
    return (
        f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {COMPUTE_BUFFER_MIB:.2f} MiB on device {gpu}: "
        f"cudaMalloc failed: out of memory\n"
        f"ggml_gallocr_reserve_n: failed to allocate CUDA{gpu} buffer of size {size}\n"
        f"CUDA error: out of memory\n"
        f"  current device: {gpu}, in function alloc at ggml/src/ggml-cuda/ggml-cuda.cu:421\n"
        "ggml/src/ggml-cuda/ggml-cuda.cu:88: CUDA error\n"
    )


def startup_failure(model: str, total_bytes: int) -> str:
    """A start whose KV cache does not fit beside the weights: llama-server gives up on the model and exits.
    (A CUDA build writes ggml-cuda's cudaMalloc line first, which the detector would count as a CUDA OOM; the
    simulator writes the start-time lines alone so that the event is the start's memory failure.)"""
    size = min(SLOTS * N_CTX * KV_BYTES_PER_TOKEN, total_bytes)
    return (
        f"alloc_tensor_range: failed to allocate CUDA0 buffer of size {size}\n"
        "llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache\n"
        f"common_init_from_params: failed to create context with model '{model}'\n"
        f"srv    load_model: failed to load model, '{model}'\n"
        "srv    operator(): operator(): cleaning up before exit...\n"
        "main: exiting due to model loading error\n"
    )


async def serve(engine: SimulatedEngine) -> int:
    scenario, args = engine.scenario, engine.args

    def loading() -> bool:
        return engine.now() < scenario.load_seconds

    def unavailable() -> web.Response:
        return web.json_response(LOADING, status=503)

    async def health(_: web.Request) -> web.Response:
        return unavailable() if loading() else web.json_response({"status": "ok"})

    async def metrics(_: web.Request) -> web.Response:
        if loading():
            return unavailable()
        body = llamacpp_metrics_text(scenario, engine.now(), life=args.life)
        return web.Response(text=body, content_type="text/plain")

    async def slots(_: web.Request) -> web.Response:
        if loading():
            return unavailable()
        return web.Response(
            text=json.dumps(slots_body(scenario, engine.now(), args.life)), content_type="application/json"
        )

    await engine.listen({"/health": health, "/metrics": metrics, "/slots": slots})
    engine.log(startup_lines(args.model, args.host, args.port))
    if not scenario.starts(args.life):
        # The weights load (80 % of the load time), then the KV cache cannot be allocated: exit.
        await engine.sleep(scenario.load_seconds * 0.8)
        engine.log(startup_failure(args.model, args.gpu_total_bytes))
        return 1
    await engine.sleep(scenario.load_seconds - engine.now())
    engine.log(ready_lines(args.host, args.port))
    return await engine.serve_until_death(lambda: oom_lines(scenario, life=args.life, total_bytes=args.gpu_total_bytes))


def main(argv: list[str] | None = None) -> int:
    return run_simulator(serve, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
