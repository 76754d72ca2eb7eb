"""The drill's chain with a real vLLM as one target: its queue alert fires under load and resolves after.

Real vLLM (CPU) + simulated GPUs, the exporter, a real Prometheus with the generated rules at 60x, a real
Alertmanager with the example routing, a webhook receiver.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from support import REPO

from oomguard.drill.run import alerting_chain
from oomguard.exporter.config_loader import load_config
from oomguard.exporter.runtime import Runtime
from oomguard.simulate.fake_nvml import GIB, FakeGpu, FakeNvml
from tests.real.vllm import harness

pytestmark = pytest.mark.realvllm
# 20x, scraped every 5 s: under this load vLLM's own /metrics can take seconds to answer, and a
# faster scrape would time out and break the alert's `for:` (5 minutes here are 15 s).
SCALE = 20


async def test_queue_alert_fires_under_real_load_and_resolves(tiny_model: Path, tmp_path: Path) -> None:
    pressure = ("--num-gpu-blocks-override", "8", "--max-num-seqs", "4")
    server = harness.VllmServer(tiny_model, harness.free_port(), pressure, tmp_path / "vllm.log")
    config = load_config(None, {
        "events": {"kernel_log": False, "xid": False}, "trend": {"enabled": False}, "scrape": {"timeout_seconds": 4},
        "targets": [{"name": "tiny-vllm", "url": server.url, "gpus": [0]}],
    })  # fmt: skip
    gpus = FakeNvml([FakeGpu(0, used_bytes=40 * GIB)])  # the GPU is simulated: this machine has none
    routing = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
    try:
        async with alerting_chain(
            tmp_path,
            Runtime(config, nvml_lib=gpus),
            bundle_overrides={"time_scale": SCALE},
            alertmanager_config=routing,
            scrape_interval="5s",
        ) as chain:
            server.start()
            await asyncio.to_thread(server.wait_healthy, 240)
            # 24 requests at a time (4 run, about 20 wait: over the alert's 10) until the alert fires, then none
            # new: the queue drains as those in flight end. (160 at once took two minutes of the cores to drain.)
            load = harness.run_load(server.url, n=160, prompt_tokens=120, max_tokens=380, slots=24)
            fired = resolved = None
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and fired is None:
                fired = chain.webhook.first("OomGuardQueueBacklog", "firing")
                await asyncio.sleep(0.5)
            load.stop()
            # A "resolved" seen while the load runs may be a gap in the series, not the end: the alert must end
            # resolved once the load is done.
            statuses = await asyncio.to_thread(load.wait, 300)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and resolved is None:
                ours = [n for n in chain.webhook.notifications if n.alertname == "OomGuardQueueBacklog"]
                resolved = ours[-1] if ours and ours[-1].status == "resolved" else None
                await asyncio.sleep(0.5)
            notifications = chain.webhook.notifications
        assert fired is not None, f"QueueBacklog never reached a receiver; notifications: {notifications}"
        assert fired.receiver == "ticket" and fired.labels["target"] == "tiny-vllm"
        assert resolved is not None and resolved.receiver == "ticket" and resolved.at > fired.at
        assert load.done() and statuses.count(200) == len(statuses)
        print(f"QueueBacklog fired, reached {fired.receiver}, resolved {resolved.at - fired.at:.1f} s later")
    finally:
        await asyncio.to_thread(server.stop)
