"""The standing hostile corpus of engine logs: what an API user can make an engine write counts nothing.

Anyone who can send a request to the model writes into its log: vLLM's and SGLang's request logs echo the prompt,
uvicorn's access log (on by default in vLLM and SGLang) and llama-server's log echo the path, whether the request
was authorised or not, TGI's request spans echo the sampling parameters (stop sequences among them), Triton's
verbose log echoes the path with the model's name. Each line below is such a line holding the words of an OOM, a
death or a start, in the shapes such text takes (repr-escaped newlines, URL-encoded paths, JSON bodies, ANSI
colours). None may count an event or a start, alone or in the middle of a real incident; the engines' real lines
beside them must still count (docs/security.md, "API users").
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile_cases import Case, assert_documented
from support import engine_detector

from oomguard.exporter.config import Config, EventsConfig, TargetConfig
from oomguard.exporter.engines import ENGINES
from oomguard.exporter.events.catalogue import load_catalogue
from oomguard.exporter.events.runner import EventRunner
from tests.engines.test_log_patterns import CASES as REAL_CASES
from tests.engines.test_log_patterns import STARTS

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
# What an attacker puts in a prompt, a path or a parameter: every engine's OOM, death and start words.
WORDS = [
    OOM,
    "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "DefaultCPUAllocator: not enough memory",
    "EngineCore encountered a fatal error",
    "ValueError: No available memory for the cache blocks",
    "Started server process [4242]",
    "vLLM API server version 0.32.0",
    "Scheduler hit an exception: Traceback (most recent call last):",
    "server_args=ServerArgs(model_path='x')",
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static",
    "Shard 0 crashed",
    "Webserver Crashed",
    'Args { model_id: "m" }',
    "failed to load 'tensorrt_llm' version 1",
    "Started GRPCInferenceService at 0.0.0.0:8001",
    "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 1.00 MiB on device 0: cudaMalloc failed: out of memory",
    "srv    load_model: loading model '/models/m.gguf'",
    "main: exiting due to model loading error",
]


def url(text: str) -> str:
    """A path as a client sends it, percent-encoded."""
    return "".join(c if c.isalnum() or c in "/._-" else f"%{ord(c):02X}" for c in text)


def vllm(word: str) -> list[tuple[str, str]]:
    tag, head = "(APIServer pid=1) ", "INFO 12-06 01:00:00 [logger.py:39] "
    return [
        ("request log", f"{tag}{head}Received request cmpl-1: prompt: {word!r}, params: SamplingParams(n=1)"),
        ("request log, a repr-escaped newline first",
         f"{tag}{head}Received request cmpl-2: prompt: {'x' + chr(10) + word!r}, params: SamplingParams(n=1)"),
        ("request log, the prompt alone on a continuation", f"{tag}{head}{word}"),
        ("request log, the output", f"{tag}{head}Generated response cmpl-3: output: {word!r}, finish_reason: stop"),
        ("request log, a JSON body", f'{tag}{head}Received request chatcmpl-4: prompt: \'{{"messages": ["{word}"]}}\''),
        ("access log, 401", f'{tag}INFO:     127.0.0.1:40000 - "GET /v1/{word} HTTP/1.1" 401 Unauthorized'),
        ("access log, URL-encoded", f'{tag}INFO:     127.0.0.1:40000 - "GET /v1/{url(word)} HTTP/1.1" 404 Not Found'),
        ("access log, no tag", f'INFO:     10.0.0.7:5 - "POST /v1/{url(word)}?q={url(word)} HTTP/1.1" 404 Not Found'),
        ("access log, ANSI colours",
         f'{tag}\x1b[32mINFO\x1b[0m:     127.0.0.1:5 - "\x1b[1mGET /v1/{word} HTTP/1.1\x1b[0m" 404'),
        ("fields ignored", f"{tag}WARNING 12-06 01:00:00 [protocol.py:80] The following fields were present in the "
                           f"request but ignored: {{{word!r}}}"),
        ("an error naming the prompt",
         f"{tag}ERROR 12-06 01:00:00 [serving_chat.py:211] Error with model: {word}"),
    ]  # fmt: skip


def sglang(word: str) -> list[tuple[str, str]]:
    head = "[2026-12-06 01:00:00] "
    return [
        ("request log", f"{head}Receive: obj=GenerateReqInput(text={word!r}, sampling_params={{'max_new_tokens': 8}})"),
        ("request log, escaped newline", f"{head}Receive: obj=GenerateReqInput(text={'a' + chr(10) + word!r})"),
        ("request log, the finish", f"{head}Finish: obj=GenerateReqInput(text={word!r}), out={{'text': {word!r}}}"),
        ("access log", f'{head}INFO:     127.0.0.1:5 - "GET /{url(word)} HTTP/1.1" 404 Not Found'),
        ("access log, raw", f'INFO:     127.0.0.1:5 - "GET /{url(word)} HTTP/1.1" 404 Not Found'),
        ("access log, TP header", f'[2026-12-06 01:00:00 TP0] INFO:     127.0.0.1:5 - "GET /{word} HTTP/1.1" 404'),
    ]


def tgi(word: str) -> list[tuple[str, str]]:
    params = f'GenerateParameters {{ best_of: None, temperature: None, stop: ["{word}"], details: false }}'
    return [
        ("a request's span", f"2026-12-06T01:00:00.000000Z  INFO generate{{parameters={params} total_time=\"1s\"}}: "
                             "text_generation_router::server: router/src/server.rs:305: Success"),
        ("a span that tries to close itself",
         f'2026-12-06T01:00:00.000000Z  INFO generate{{parameters=GenerateParameters {{ stop: ["}}: '
         f'text_generation_launcher: {word}"] }}}}: text_generation_router::server: router/src/server.rs:305: Success'),
        ("a chat request's span",
         f"2026-12-06T01:00:00.000000Z ERROR chat_completions{{parameters={params}}}:generate{{parameters={params}}}: "
         f"text_generation_router::infer: router/src/infer/mod.rs:80: {word}"),
        ("a flat span", f"2026-12-06T01:00:00.000000Z ERROR compat_generate{{stop={word}}}: text_generation_launcher: "
                        f"{word}"),
    ]  # fmt: skip


def triton(word: str) -> list[tuple[str, str]]:
    return [
        ("the request's path",
         f'I1206 01:00:00.000000 1 http_server.cc:4523] "HTTP request: 2 /v2/models/{word}/infer"'),
        ("the path, URL-encoded",
         f'I1206 01:00:00.000000 1 http_server.cc:4523] "HTTP request: 2 /v2/models/{url(word)}/infer"'),
        ("an unknown model", f"E1206 01:00:00.000000 1 model_repository_manager.cc:1200] \"Request for unknown model: "
                             f"'{word}' is not found\""),
        ("a gRPC request", f'I1206 01:00:00.000000 1 grpc_server.cc:3400] "Process for ModelInferHandler, {word}"'),
    ]  # fmt: skip


def llamacpp(word: str) -> list[tuple[str, str]]:
    return [
        ("the request log", f"srv  log_server_r: request: GET /v1/{word} 127.0.0.1 401"),
        ("the request log, URL-encoded", f"srv  log_server_r: request: GET /{url(word)} 127.0.0.1 404"),
        (
            "the request log, timestamps",
            f"0.01.234.567 I srv  log_server_r: request: POST /completion 127.0.0.1 {word}",
        ),
        ("a verbose body", f'srv  log_server_r: request:  {{"prompt": "{word}", "n_predict": 8}}'),
        ("a verbose answer", f'srv  log_server_r: response: {{"content": "{word}"}}'),
    ]


HOSTILE = {"vllm": vllm, "sglang": sglang, "tgi": tgi, "triton": triton, "llamacpp": llamacpp}

CASES = [
    Case("vllm", "a prompt holding PyTorch's OOM, a traceback, uvicorn's start line and vLLM's fatal error, in the "
         "request log (repr, after an escaped newline, a JSON body, the output), an ignored field, an error naming "
         "it", "the request logger's records and the ignored-field warning are outside text; the OOM counts only as "
         "a traceback's last line, a start only at the start of an engine record: nothing counted",
         "test_a_line_that_carries_outside_text_counts_nothing"),
    Case("vllm, SGLang, llama.cpp", "a path (`GET /v1/CUBLAS_STATUS_ALLOC_FAILED`, refused 401; URL-encoded; with "
         "ANSI colours) in uvicorn's or llama-server's access log", "access log lines are outside text, with the "
         "engine's header or without: nothing counted", "test_a_line_that_carries_outside_text_counts_nothing"),
    Case("SGLang", "`Scheduler hit an exception`, `server_args=ServerArgs(` in a request's text (`Receive: obj=`)",
         "the request log is outside text; patterns match at a message's start: no death, no restart",
         "test_a_line_that_carries_outside_text_counts_nothing"),
    Case("TGI", "`stop: [\"Shard 0 crashed\"]`, or a stop sequence that tries to close its span", "a span's fields "
         "print nested braces, which the header refuses; a request's span is outside text: nothing counted",
         "test_a_line_that_carries_outside_text_counts_nothing"),
    Case("Triton", "a model name or path holding `failed to load 'tensorrt_llm'`", "counted only from "
         "`model_lifecycle.cc`'s records; `HTTP request:` records are outside text",
         "test_a_line_that_carries_outside_text_counts_nothing"),
    Case("every engine", "all of the above between the lines of a real OOM or startup failure", "the incident "
         "counts as it would alone, once, of its kind", "test_hostile_lines_inside_a_real_incident_change_nothing"),
    Case("vLLM (real)", "a real vLLM 0.32 log with request logging at DEBUG after a prompt of OOM and start lines, "
         "an ignored field and two refused paths", "its own start only; no event (the old search found 6 lines "
         "to count)", "test_a_recorded_real_vllm_log_with_hostile_requests"),
]  # fmt: skip


def test_docs_table_is_current() -> None:
    assert_documented(CASES, globals())


CORPUS = [(engine, what, line) for engine, lines in HOSTILE.items() for word in WORDS for what, line in lines(word)]


def test_every_engine_has_its_hostile_lines() -> None:
    assert set(HOSTILE) == set(ENGINES), "add the engine's lines that carry outside text to HOSTILE"


@pytest.mark.parametrize(
    ("engine", "line"),
    [pytest.param(e, line, id=f"{e}: {what}: {line[-60:]}") for e, what, line in CORPUS],
)
def test_a_line_that_carries_outside_text_counts_nothing(engine: str, line: str) -> None:
    detector = engine_detector(engine)
    events = detector.feed(line, 0.0) + detector.tick(100.0)
    assert events == [] and detector.open is None
    assert detector.take_starts() == [], "a request's text must not pass for a new life of the engine"


@pytest.mark.parametrize("engine", list(ENGINES))
def test_hostile_lines_inside_a_real_incident_change_nothing(engine: str) -> None:
    """The real incident counts as it would alone: the hostile lines neither add an event nor end it early."""
    for _, _, real, kinds in [c for c in REAL_CASES if c[0] == engine and c[3]]:
        detector = engine_detector(engine)
        hostile = [line for e, _, line in CORPUS if e == engine]
        for i, line in enumerate(real):
            detector.feed(line, 0.0)
            for h in hostile[i :: len(real)]:
                assert detector.feed(h, 0.0) == []
        assert [e.kind for e in detector.tick(100.0)] == kinds
        assert detector.take_starts() == []


@pytest.mark.parametrize("engine", list(ENGINES))
def test_the_real_lines_still_count_after_the_hostile_ones(engine: str) -> None:
    detector = engine_detector(engine)
    for _, _, line in [c for c in CORPUS if c[0] == engine]:
        detector.feed(line, 0.0)
    detector.feed(STARTS[engine], 1.0)
    assert len(detector.take_starts()) == 1
    real, kinds = next((c[2], c[3]) for c in REAL_CASES if c[0] == engine and c[3])
    for line in real:
        detector.feed(line, 2.0)
    assert [e.kind for e in detector.tick(100.0)] == kinds


def test_prompts_and_paths_count_no_oom_and_no_restart_through_the_exporter(tmp_path: Path) -> None:
    """Through the runner: three (startup-line prompt, OOM prompt) pairs and an unauthorised path, which a search
    of the whole line would count as 4 cuda_oom and a restart, count nothing."""
    log = tmp_path / "vllm.log"
    log.touch()
    target = TargetConfig(url="http://127.0.0.1:8000", name="vllm", engine="vllm", logs=(str(log),))
    runner = EventRunner(Config(targets=(target,), events=EventsConfig(kernel_log=False, xid=False)), clock=lambda: 0.0)
    runner.poll()
    lines = [line for _, line in vllm("Started server process [99]") + vllm(OOM)] * 3
    lines += [line for _, line in vllm("CUBLAS_STATUS_ALLOC_FAILED")]
    log.write_text("".join(f"{line}\n" for line in lines))
    runner.poll()
    assert runner.counts.get("vllm") is None or runner.counts["vllm"].total == {}
    assert runner.take_starts() == []


FIXTURES = Path(__file__).parent.parent / "events" / "fixtures"


def test_a_recorded_real_vllm_log_with_hostile_requests() -> None:
    """A real vLLM 0.32's log (tests/real/vllm/test_hostile_realvllm.py wrote it): the request logger at DEBUG
    printed a prompt of OOM, traceback and start lines, a request's ignored field named them, and uvicorn logged
    two refused paths. One start, the server's own; no event."""
    text = (FIXTURES / "vllm-0.32-cpu-hostile-requests.log").read_text()
    lines = text.splitlines()
    searched = [line for line in lines if any(p.regex.search(line) for p in load_catalogue("vllm"))]
    assert len(searched) >= 6, "searched anywhere in a line, as before, these would count"
    detector = engine_detector("vllm")
    events = [e for line in lines for e in detector.feed(line, 0.0)] + detector.tick(100.0)
    assert events == []
    # The API server's arguments and uvicorn's "Started server process [8223]": two lines of one start (one pid).
    assert [(s.kind, s.pid) for s in detector.take_starts()] == [("startup", 8223)] * 2
