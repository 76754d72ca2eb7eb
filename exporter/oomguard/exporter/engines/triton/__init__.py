"""Triton Inference Server with the TensorRT-LLM backend: its /metrics reader, its log lines, its families."""

from oomguard.exporter.engines.base import HEADER_CLOCK, EnginePlugin, LogGrammar
from oomguard.exporter.engines.triton import cmdline
from oomguard.exporter.engines.triton.reader import TritonReader

PLUGIN = EnginePlugin(
    name="triton",
    title="Triton with TensorRT-LLM",
    reader=TritonReader,
    package=__name__,
    log_grammar=LogGrammar(
        headers=(
            # glog: 'E0305 19:29:57.029880 119 backend_model.cc:634] ', the message quoted from 24.x on.
            r"[IWEF](?P<month>\d\d)(?P<day>\d\d) " + HEADER_CLOCK + r' +\d+ (?P<source>[\w.]+):\d+\] "?',
            r"\[TensorRT-LLM\]\[(?:ERROR|WARNING|INFO|DEBUG|VERBOSE)\] ",  # TensorRT-LLM's own logger
        ),
        # --log-verbose: each request's path (with the model's name) and its inputs.
        outside=(r"HTTP request: ", r"Process for \w+", r"New request handler for "),
    ),
    simulator="oomguard.simulate.engines.triton",
    aggregation_note=(
        "Triton's `model` label is the `model_name`; its `version`s are summed (blocks and requests).\n"
        "The reservation, `kv_cache_free_gpu_mem_fraction`, is a share of the memory free after the\n"
        "weights, not of the total, and is not published: it is left unknown, not passed off as one."
    ),
    matches=cmdline.matches,
    port_flags=("--metrics-port",),
    default_port=8002,
    # Not waiting: older TensorRT-LLM backends have no "waiting" request type.
    figures=("kv_cache_usage", "requests_running"),
)
