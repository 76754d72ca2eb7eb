"""Each engine's command line: which processes are engines, and their settings with their origin."""

from __future__ import annotations

import shlex

import pytest

from oomguard.exporter.engines import ENGINES
from oomguard.exporter.model import EngineSetting
from oomguard.exporter.sources.local.cmdline import engine_of


def argv(text: str) -> tuple[str, ...]:
    return tuple(shlex.split(text))


def settings(engine: str, text: str, version: str | None = None, environ: dict[str, str] | None = None):
    parser = ENGINES[engine].settings
    assert parser is not None
    return parser(argv(text), version, environ)


def flag(value: float) -> EngineSetting:
    return EngineSetting(value, "flag")


def default(value: float) -> EngineSetting:
    return EngineSetting(value, "default")


@pytest.mark.parametrize(
    ("text", "engine"),
    [
        ("/opt/venv/bin/python3 /opt/venv/bin/vllm serve meta-llama/Llama-3.1-8B --port 8001", "vllm"),
        ("vllm serve Qwen/Qwen2.5-7B", "vllm"),
        ("python3 -m vllm.entrypoints.openai.api_server --model facebook/opt-125m", "vllm"),
        ("/usr/bin/python3 -u -m vllm.entrypoints.openai.api_server --model m", "vllm"),
        ("python /src/vllm/vllm/entrypoints/openai/api_server.py --model m", "vllm"),
        ("python3 -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B --port 30000", "sglang"),
        ("/venv/bin/sglang serve --model-path m", "sglang"),
        ("text-generation-launcher --model-id bigscience/bloom-560m", "tgi"),
        ("/usr/local/bin/text-generation-router --port 80 --max-concurrent-requests 128", "tgi"),
        ("/build/bin/llama-server -m model.gguf -c 4096 -np 4 --port 8080", "llamacpp"),
        ("tritonserver --model-repository=/models --metrics-port 8002", "triton"),
        # Not engines: the CLI's other commands, a client, an editor on a file, an engine core child.
        ("vllm bench serve --model m", None),
        ("python3 -m vllm.entrypoints.cli.main chat", None),
        ("vim /src/vllm/serve.py", None),
        ("curl http://127.0.0.1:8000/metrics", None),
        ("python3 -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)", None),
        ("python3 -m pytest tests/sources/local/test_llama-server.py", None),
    ],
)
def test_which_command_lines_are_engines(text: str, engine: str | None) -> None:
    assert engine_of(argv(text)) == engine


def test_vllm_both_flag_forms_and_its_defaults() -> None:
    got = settings(
        "vllm",
        "vllm serve meta-llama/Llama-3.1-8B --gpu-memory-utilization=0.85 --max-num-seqs 64 "
        "--max-model-len 8192 -tp 2 --port 8001",
        "0.10.1",
    )
    assert got == {
        "gpu_memory_utilization": flag(0.85),
        "max_num_seqs": flag(64),
        "max_model_len": flag(8192),
        "tensor_parallel_size": flag(2),
    }


def test_vllm_defaults_by_version() -> None:
    text = "python3 -m vllm.entrypoints.openai.api_server --model facebook/opt-125m"
    v0 = settings("vllm", text, "0.6.3.post1")
    assert v0 == {
        "gpu_memory_utilization": default(0.9),
        "max_num_seqs": default(256),
        "tensor_parallel_size": default(1),
    }
    # V1 (0.8 on) sets max_num_seqs by usage context and GPU; an unknown version gives no default either.
    for version in ("0.8.0", "0.11.2", None, "unknown"):
        assert "max_num_seqs" not in settings("vllm", text, version), version
        assert settings("vllm", text, version)["gpu_memory_utilization"] == default(0.9)


def test_vllm_model_len_in_human_units_and_the_last_flag_wins() -> None:
    assert settings("vllm", "vllm serve m --max-model-len 32k")["max_model_len"] == flag(32000)
    assert settings("vllm", "vllm serve m --max-model-len=32K")["max_model_len"] == flag(32768)
    got = settings("vllm", "vllm serve m --max-num-seqs 8 --max-num-seqs=16")
    assert got["max_num_seqs"] == flag(16)
    assert "max_model_len" not in settings("vllm", "vllm serve m --max-model-len lots")
    # vLLM's parser takes underscores for dashes.
    assert settings("vllm", "vllm serve m --max_num_seqs 12")["max_num_seqs"] == flag(12)


def test_sglang_flags_and_what_it_derives() -> None:
    got = settings(
        "sglang",
        "python3 -m sglang.launch_server --model-path m --mem-fraction-static 0.8 "
        "--max-running-requests=48 --context-length 16384 --tp 4",
    )
    assert got == {
        "mem_fraction_static": flag(0.8),
        "max_running_requests": flag(48),
        "context_length": flag(16384),
        "tp_size": flag(4),
    }
    # Derived from the GPU and the model when absent: only tp_size has a fixed default.
    assert settings("sglang", "python3 -m sglang.launch_server --model-path m") == {"tp_size": default(1)}


def test_tgi_flags_environment_and_defaults() -> None:
    launcher = "text-generation-launcher --model-id m --max-batch-total-tokens 100000"
    assert settings("tgi", launcher + " --cuda-memory-fraction 0.7") == {
        "cuda_memory_fraction": flag(0.7),
        "max_batch_total_tokens": flag(100000),
        "max_concurrent_requests": default(128),
    }
    env = {"CUDA_MEMORY_FRACTION": "0.5", "MAX_CONCURRENT_REQUESTS": "32"}
    got = settings("tgi", launcher, environ=env)
    assert got["cuda_memory_fraction"] == flag(0.5) and got["max_concurrent_requests"] == flag(32)
    # A flag wins over its variable.
    assert settings("tgi", launcher + " --cuda-memory-fraction=0.9", environ=env)["cuda_memory_fraction"] == flag(0.9)
    assert settings("tgi", "text-generation-launcher --model-id m")["cuda_memory_fraction"] == default(1.0)
    # The router takes no memory fraction: no default is claimed for it.
    assert "cuda_memory_fraction" not in settings("tgi", "text-generation-router --port 80")


def test_llamacpp_short_and_long_forms_and_environment() -> None:
    assert settings("llamacpp", "llama-server -m model.gguf -c 4096 -np 4") == {
        "ctx_size": flag(4096),
        "parallel": flag(4),
    }
    assert settings("llamacpp", "/b/llama-server --model m.gguf --ctx-size=8192 --parallel 2") == {
        "ctx_size": flag(8192),
        "parallel": flag(2),
    }
    env = {"LLAMA_ARG_CTX_SIZE": "2048", "LLAMA_ARG_N_PARALLEL": "3"}
    assert settings("llamacpp", "llama-server -m m.gguf", environ=env) == {"ctx_size": flag(2048), "parallel": flag(3)}
    # Defaults moved between builds and the build is unknown: none is claimed.
    assert settings("llamacpp", "llama-server -m m.gguf") == {}


def test_triton_is_discovered_without_settings() -> None:
    assert ENGINES["triton"].matches is not None and ENGINES["triton"].settings is None


def test_proc_cmdline_bytes_to_argv() -> None:
    from oomguard.exporter.sources.local.cmdline import _argv

    assert _argv(b"llama-server\0-c\0" + b"4096\0") == ("llama-server", "-c", "4096")
    assert _argv(b"python3\0/opt/my model/serve.py\0") == ("python3", "/opt/my model/serve.py")  # a space kept
    # A title rewritten into one string (setproctitle) is split on spaces, as psutil does.
    assert _argv(b"vllm serve m --port 8000") == ("vllm", "serve", "m", "--port", "8000")
    assert _argv(b"") == ()  # a kernel thread


def test_the_port_is_the_named_one_never_another_of_its_family() -> None:
    from oomguard.exporter.sources.local.cmdline import EngineProcess, engine_port

    vllm = EngineProcess(10, "vllm", argv("vllm serve m --port 8001"), frozenset({10, 11}))
    # Loading: a worker holds torch.distributed's store on a port of its own; the API port is not up yet.
    assert engine_port(vllm, {11: {29500: "127.0.0.1"}}) is None
    assert engine_port(vllm, {11: {29500: "127.0.0.1"}, 10: {8001: "0.0.0.0"}}) == (8001, "0.0.0.0")
    default = EngineProcess(10, "vllm", argv("vllm serve m"), frozenset({10}))
    assert engine_port(default, {10: {8000: "::"}}) == (8000, "::")
    tgi = EngineProcess(20, "tgi", argv("text-generation-launcher --model-id m"), frozenset({20, 21}))
    assert engine_port(tgi, {21: {80: "0.0.0.0", 3000: "0.0.0.0"}}, {"PORT": "80"}) == (80, "0.0.0.0")
    assert engine_port(tgi, {21: {3000: "0.0.0.0"}}) == (3000, "0.0.0.0")
    triton = EngineProcess(30, "triton", argv("tritonserver --model-repository /m"), frozenset({30}))
    assert engine_port(triton, {30: {8000: "0.0.0.0", 8001: "0.0.0.0", 8002: "0.0.0.0"}}) == (8002, "0.0.0.0")
