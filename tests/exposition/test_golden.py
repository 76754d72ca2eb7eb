"""The whole exposition for a fixed simulated state, diffed against a golden file and linted by promtool.

Rewrite the golden file after an intended change with: pytest tests/exposition/test_golden.py --update-golden
"""

from __future__ import annotations

import re

from support import FIXTURES, REPO, promtool_check_metrics
from targets_zoo import Zoo

from oomguard.exporter.config_loader import load_config
from oomguard.exporter.docs import metrics_markdown
from oomguard.exporter.exposition import METRICS
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app
from oomguard.simulate.fake_nvml import GIB, FakeGpu, FakeNvml, FakeProcess

GOLDEN = FIXTURES.parent / "golden" / "exposition.prom"
_VOLATILE = re.compile(
    r"^(oomguard_(?:source_duration|target_scrape_duration|target_health_latency)_seconds\{[^}]*\}) \S+$",
    re.M,
)


def normalise(text: str) -> str:
    """Blank what changes from run to run: durations, versions, the test server's port."""
    text = _VOLATILE.sub(r"\1 <duration>", text)
    text = re.sub(r"^(oomguard_build_info)\{.*\}", r"\1{<version>}", text, flags=re.M)
    return re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)


async def test_golden_exposition(aiohttp_server, aiohttp_client, promtool: str, update_golden: bool) -> None:
    zoo = Zoo()
    server = await aiohttp_server(zoo.app())
    base = f"http://127.0.0.1:{server.port}"
    # Trends depend on how many background samples ran: tests/trend/test_trend_metrics.py covers them.
    config = load_config(
        None,
        {
            "trend": {"enabled": False},
            "events": {"kernel_log": False, "xid": False},
            "targets": [
                {"name": "vllm-0", "url": base, "gpus": [0], "local_process": "no"},
                {"name": "vllm-broken", "url": base, "gpus": [1], "local_process": "no"},
            ],
        },
    )
    config = config.model_copy(
        update={
            "targets": (
                config.targets[0].model_copy(update={"url": f"{base}/good"}),
                config.targets[1].model_copy(update={"url": f"{base}/500"}),
            )
        }
    )
    lib = FakeNvml(
        [
            # pids that exist nowhere: their process_name is empty, as for a pid in another namespace
            FakeGpu(
                0,
                used_bytes=74 * GIB,
                utilization_percent=97,
                processes=[FakeProcess(999_999_901, 73 * GIB), FakeProcess(999_999_902, None)],
            ),
            FakeGpu(1, used_bytes=2 * GIB, unsupported={"nvmlDeviceGetUtilizationRates"}),
            FakeGpu(2, lost=True),
        ]
    )
    client = await aiohttp_client(make_app(Runtime(config, nvml_lib=lib)))
    text = await (await client.get("/metrics")).text()

    assert promtool_check_metrics(promtool, text.encode()) == ""
    got = normalise(text)
    if update_golden:
        GOLDEN.write_text(got)
    assert got == GOLDEN.read_text(), "exposition changed: review, then rerun with --update-golden"


def test_every_metric_is_documented_and_docs_are_current() -> None:
    docs = (REPO / "docs" / "metrics.md").read_text()
    assert docs == metrics_markdown(), "docs/metrics.md is stale: run `oomguard docs --output docs/metrics.md`"
    exported = set(re.findall(r"^# TYPE (\S+)", GOLDEN.read_text(), re.M))
    declared = {m.name + ("_total" if m.kind == "counter" else "") for m in METRICS}
    assert exported <= declared
    for name in declared:
        assert f"`{name}" in docs
