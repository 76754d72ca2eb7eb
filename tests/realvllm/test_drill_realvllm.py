"""The drill's chain with a real vLLM as one target: its queue alert fires under load and resolves after.

Real vLLM (CPU) + simulated GPUs, the exporter, a real Prometheus with the generated rules at 60x, a real
Alertmanager with the example routing, a webhook receiver.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest
import yaml
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support import REPO

from oomguard.bundle.config import load_bundle_config
from oomguard.bundle.generate import ALERTS_FILE, RECORDS_FILE, render
from oomguard.config import load_config
from oomguard.drill.run import drill_alertmanager_config
from oomguard.drill.services import Alertmanager, Prometheus, free_port
from oomguard.drill.webhook import WebhookReceiver
from oomguard.simulate.fake_nvml import GIB, FakeGpu, FakeNvml
from oomguard.sources.nvml import NvmlSource
from oomguard.web import make_app

pytestmark = pytest.mark.realvllm
SCALE = 60


async def test_queue_alert_fires_under_real_load_and_resolves(tiny_model: Path, tmp_path: Path) -> None:
    (tmp_path / "bundle.yaml").write_text(yaml.safe_dump({"time_scale": SCALE}))
    rules = render(load_bundle_config(tmp_path / "bundle.yaml"))
    for name in (ALERTS_FILE, RECORDS_FILE):
        (tmp_path / name).write_text(rules[name])
    webhook = WebhookReceiver()
    hook_runner = web.AppRunner(webhook.app(), access_log=None)
    await hook_runner.setup()
    hook_port = free_port()
    await web.TCPSite(hook_runner, "127.0.0.1", hook_port).start()
    routing = drill_alertmanager_config(REPO / "deploy" / "alertmanager" / "alertmanager.yml", hook_port)
    am = Alertmanager(tmp_path / "am", routing)
    pressure = ("--num-gpu-blocks-override", "8", "--max-num-seqs", "4")
    server = harness.VllmServer(tiny_model, harness.free_port(), pressure, tmp_path / "vllm.log")
    config = load_config(None, {
        "events": {"kernel_log": False, "xid": False}, "trend": {"enabled": False},
        "targets": [{"name": "tiny-vllm", "url": server.url, "gpus": [0]}],
    })  # fmt: skip
    gpus = FakeNvml([FakeGpu(0, used_bytes=40 * GIB)])  # the GPU is simulated: this machine has none
    exporter = web.AppRunner(make_app(config, lambda: NvmlSource(gpus)), access_log=None)
    prometheus = None
    try:
        server.start()
        await asyncio.to_thread(am.start)
        await exporter.setup()
        port = free_port()
        await web.TCPSite(exporter, "127.0.0.1", port).start()
        rule_files = [tmp_path / ALERTS_FILE, tmp_path / RECORDS_FILE]
        prometheus = Prometheus(
            tmp_path / "prom", [f"127.0.0.1:{port}"], rule_files=rule_files, alertmanager=am.address
        )
        await asyncio.to_thread(prometheus.start)
        await asyncio.to_thread(server.wait_healthy, 240)
        load = harness.run_load(server.url, n=160, prompt_tokens=120, max_tokens=380)
        fired = resolved = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and resolved is None:
            fired = fired or webhook.first("OomGuardQueueBacklog", "firing")
            resolved = webhook.first("OomGuardQueueBacklog", "resolved") if fired else None
            await asyncio.sleep(0.5)
        statuses = await asyncio.to_thread(load.wait, 60)
        assert fired is not None, f"QueueBacklog never reached a receiver; notifications: {webhook.notifications}"
        assert fired.receiver == "ticket" and fired.labels["target"] == "tiny-vllm"
        assert resolved is not None and resolved.receiver == "ticket" and resolved.at > fired.at
        assert load.done() and statuses.count(200) == len(statuses)
        print(f"QueueBacklog fired, reached {fired.receiver}, resolved {resolved.at - fired.at:.1f} s later")
    finally:
        if prometheus is not None:
            prometheus.stop()
        am.stop()
        await exporter.cleanup()
        await hook_runner.cleanup()
        await asyncio.to_thread(server.stop)
