"""Fuzzing the engines' command-line readers: any argv, version and environment read from /proc gives settings
(finite numbers, a known origin, the engine's own names) or none, never an exception."""

from __future__ import annotations

import math

from hypothesis import example, given
from hypothesis import strategies as st

from oomguard.exporter.engines import ENGINES
from oomguard.exporter.model import SETTING_ORIGINS
from oomguard.exporter.sources.local.cmdline import engine_of

NAMES = {
    "vllm": {"gpu_memory_utilization", "max_num_seqs", "max_model_len", "tensor_parallel_size"},
    "sglang": {"mem_fraction_static", "max_running_requests", "context_length", "tp_size"},
    "tgi": {"cuda_memory_fraction", "max_batch_total_tokens", "max_concurrent_requests"},
    "llamacpp": {"ctx_size", "parallel"},
}
FLAGS = [
    "--gpu-memory-utilization", "--max-num-seqs", "--max-model-len", "-tp", "--mem-fraction-static", "--tp",
    "--cuda-memory-fraction", "-c", "-np", "--ctx-size", "--port", "serve", "-m", "vllm", "python3",
    "text-generation-launcher", "llama-server", "sglang.launch_server", "vllm.entrypoints.openai.api_server",
]  # fmt: skip
VALUES = st.one_of(
    st.sampled_from(["0.9", "1e400", "nan", "-inf", "32k", "32K", "9" * 5000, "", "=", "0x10", "1_000"]),
    st.text(max_size=20),
)
TOKEN = st.one_of(st.sampled_from(FLAGS), VALUES, st.builds(lambda f, v: f"{f}={v}", st.sampled_from(FLAGS), VALUES))
VERSION = st.one_of(st.none(), st.sampled_from(["0.7.3", "0.8.0", "v1", "1" * 5000, "0." + "9" * 5000]), st.text())
ENVIRON = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from(["CUDA_MEMORY_FRACTION", "MAX_CONCURRENT_REQUESTS", "LLAMA_ARG_CTX_SIZE", "X"]), VALUES
    ),
)


@given(argv=st.lists(TOKEN, max_size=12).map(tuple), version=VERSION, environ=ENVIRON)
@example(argv=("vllm", "serve", "--max-model-len", "9" * 5000), version="0." + "9" * 5000, environ=None)
def test_any_command_line_gives_settings_or_none(argv, version, environ) -> None:
    engine_of(argv)  # never raises
    for name, names in NAMES.items():
        parser = ENGINES[name].settings
        assert parser is not None
        for setting, value in parser(argv, version, environ).items():
            assert setting in names
            assert math.isfinite(value.value) and value.origin in SETTING_ORIGINS
