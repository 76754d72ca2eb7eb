"""llama.cpp's `llama-server` (`--metrics`): its /metrics reader, its /slots, its log lines, its families."""

from oomguard.exporter.engines.base import EnginePlugin, LogGrammar
from oomguard.exporter.engines.llamacpp import cmdline
from oomguard.exporter.engines.llamacpp.reader import LlamaCppReader
from oomguard.exporter.engines.llamacpp.slots import fetch_kv_usage_ratio

PLUGIN = EnginePlugin(
    name="llamacpp",
    title="llama.cpp",
    reader=LlamaCppReader,
    package=__name__,
    # llama.cpp prints no traceback: a failure is one or a few lines, each "function: message", after the time and
    # level its --log-timestamps/--log-prefix add and the server's module ("srv    ", "slot   ").
    log_grammar=LogGrammar(
        headers=(r"(?:\d+\.\d+\.\d+\.\d+ [DIWE] )?(?:(?:srv|slot|que|res|mtmd) +)?",),
        # The server's request log: "srv  log_server_r: request: GET /v1/... 127.0.0.1 401" (and, verbose, bodies).
        outside=(r"log_server_r: ",),
    ),
    simulator="oomguard.simulate.engines.llamacpp",
    aggregation_note=(
        "llama-server exports unlabelled series: nothing to aggregate, and `model_name` is empty.\n"
        "Its KV cache ratio was removed upstream (read where an older build has it, else from `/slots`); its\n"
        "context is allocated whole at "
        "start, so it has no reservation."
    ),
    kv_usage=fetch_kv_usage_ratio,
    matches=cmdline.matches,
    settings=cmdline.parse_settings,
    port_env="LLAMA_ARG_PORT",
    default_port=8080,
    # The KV use from /slots (on unless --no-slots) where /metrics no longer has it.
    figures=("kv_cache_usage", "requests_waiting", "requests_running"),
)
