"""SGLang: its /metrics reader, its reservation from /server_info, its log lines, its simulator, its families."""

from oomguard.exporter.engines.base import HEADER_CLOCK, EnginePlugin, Knob, Knobs, LogGrammar
from oomguard.exporter.engines.sglang import cmdline
from oomguard.exporter.engines.sglang.reader import SglangReader
from oomguard.exporter.engines.sglang.settings import mem_fraction_static

PLUGIN = EnginePlugin(
    name="sglang",
    title="SGLang",
    reader=SglangReader,
    package=__name__,
    log_grammar=LogGrammar(
        # "[2025-06-01 12:00:00 TP0] " (the ranks where used: DP, PP, EP); a traceback's lines after the first are raw.
        headers=(
            r"\[(?P<year>\d{4})-(?P<month>\d\d)-(?P<day>\d\d) "
            + HEADER_CLOCK
            + r"(?: (?P<source>[A-Z]+\d+(?: [A-Z]+\d+)*))?\] ",
        ),
        outside=(
            r"(?:Receive|Finish): obj=",  # --log-requests: the request object, its text and sampling params
            r'(?:(?:INFO|WARNING|ERROR|DEBUG):\s+)?[^\s"]+ - "',  # uvicorn's access log
            r"The following fields were present in the request but ignored",
        ),
        traceback_lead=r"\w+ hit an exception: ",  # "Scheduler hit an exception: Traceback (most recent call last):"
    ),
    simulator="oomguard.simulate.engines.sglang",
    aggregation_note=(
        "SGLang's rank labels are aggregated away per data-parallel group: the ranks of one `dp_rank`\n"
        "(`tp_rank`, `pp_rank`, `moe_ep_rank`) run one batch, so their largest value stands for the group\n"
        "(by default only one of them writes; with `--enable-metrics-for-all-schedulers` a sum would count\n"
        "each request once per rank); request counts and retractions are summed over the groups, usage\n"
        "ratios and memory are the largest over all ranks (the GPU nearest to full decides). Queue\n"
        'gauges broken down by `priority` are read from their total (`priority=""`).'
    ),
    reservation=mem_fraction_static,
    matches=cmdline.matches,
    settings=cmdline.parse_settings,
    default_port=30000,
    distributions=("sglang",),
    # Not preemptions: 0.4 has no retraction counter. The reservation comes from /server_info.
    figures=("kv_cache_usage", "requests_waiting", "requests_running", "reservation"),
    knobs=Knobs(
        Knob("max_running_requests", "--max-running-requests"),
        Knob("mem_fraction_static", "--mem-fraction-static"),
        tensor_parallel_flag="--tp-size",
    ),
)
