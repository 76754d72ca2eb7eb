"""SGLang's log lines: a start without memory is startup_memory; a full KV pool is pressure, not an OOM."""

from __future__ import annotations

from support import engine_detector, log_kinds

from oomguard.events.detector import IncidentDetector

# SGLang 0.5's wording (python/sglang/srt/model_executor/model_runner.py, scheduler.py) with its log header;
# the traceback frames are illustrative.
STARTUP_FAILURE = """[2026-01-10 09:00:03 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2710, in run_scheduler_process
    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)
  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", line 1420, in init_memory_pool
    raise RuntimeError(
RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.
[2026-01-10 09:00:03] Received sigquit from a child process. It usually means the child failed.""".splitlines()
RETRACTIONS = [
    "[2026-01-10 09:10:00 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3, "
    "#new_token_ratio: 0.6316 -> 1.0000",
    "[2025-03-01 09:10:00 TP0] Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.4000 -> 0.9000",
    "[2026-01-10 09:10:01 TP0] Decode batch. #running-req: 41, #token: 381300, token usage: 0.98, cuda graph: True, "
    "gen throughput (token/s): 2210.44, #queue-req: 7",
]
RUNTIME_OOM = """[2026-01-10 09:20:00 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 1020, in event_loop_overlap
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity""".splitlines()
STARTUP = "[2026-01-10 09:30:00] server_args=ServerArgs(model_path='meta-llama/Llama-3.1-8B', tp_size=1)"


def detector() -> IncidentDetector:
    return engine_detector("sglang")


def kinds(lines: list[str]) -> list[str]:
    return log_kinds("sglang", lines)


def test_a_start_without_memory_is_startup_memory() -> None:
    assert kinds(STARTUP_FAILURE) == ["startup_memory"]


def test_a_full_kv_pool_is_not_an_oom_nor_any_event() -> None:
    d = detector()
    for line in RETRACTIONS:
        d.feed(line, 0.0)
    assert d.open is None and d.tick(60.0) == []


def test_a_runtime_oom_is_cuda_oom() -> None:
    assert kinds(RUNTIME_OOM) == ["cuda_oom"]


def test_a_crash_without_memory_is_engine_death() -> None:
    assert kinds([STARTUP_FAILURE[0], "ValueError: token_to_kv_pool_allocator memory leak detected!"]) == [
        "engine_death"
    ]


def test_the_server_args_line_is_a_start() -> None:
    d = detector()
    d.feed(STARTUP, 5.0)
    assert [e.kind for e in d.take_starts()] == ["startup"]
