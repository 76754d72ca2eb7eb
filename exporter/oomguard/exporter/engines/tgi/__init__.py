"""Hugging Face TGI (in maintenance mode upstream): its /metrics reader, its log lines, its families."""

from oomguard.exporter.engines.base import HEADER_CLOCK, EnginePlugin, Knob, Knobs, LogGrammar
from oomguard.exporter.engines.tgi import cmdline
from oomguard.exporter.engines.tgi.reader import TgiReader

PLUGIN = EnginePlugin(
    name="tgi",
    title="TGI",
    reader=TgiReader,
    package=__name__,
    log_grammar=LogGrammar(
        # tracing's text format: "2025-01-01T12:00:00.000000Z ERROR [spans: ]target: [file.rs:N: ]". A span's
        # fields print nested braces ("generate{parameters=GenerateParameters { ... }}"), which the header
        # refuses: a request's line is no record of the engine's own.
        headers=(
            r"(?P<year>\d{4})-(?P<month>\d\d)-(?P<day>\d\d)T" + HEADER_CLOCK + r"Z +(?:TRACE|DEBUG|INFO|WARN|ERROR) "
            r"(?P<source>(?:[\w-]+(?:\{[^{}]*\})?: ?)*[a-z_][\w]*(?:::\w+)*): (?:[\w./-]+\.rs:\d+: )?",
        ),
        # The spans of a request (generate, chat_completions, ...): their fields hold the user's parameters.
        outside_sources=(r"(?!warmup\{)[\w-]+\{",),
    ),
    simulator="oomguard.simulate.engines.tgi",
    aggregation_note=(
        "TGI's router exports unlabelled series: nothing to aggregate, and `model_name` is empty.\n"
        "Its reservation, `--cuda-memory-fraction` (`CUDA_MEMORY_FRACTION`), is published nowhere: unknown."
    ),
    matches=cmdline.matches,
    settings=cmdline.parse_settings,
    port_env="PORT",
    default_port=3000,
    # Not the KV use: tgi_batch_max_total_tokens is set by the v3 backend's warm-up only.
    figures=("requests_waiting", "requests_running"),
    knobs=Knobs(concurrency=Knob("max_concurrent_requests", "--max-concurrent-requests")),
)
