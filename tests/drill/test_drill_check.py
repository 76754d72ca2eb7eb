"""`oomguard drill --check`: right about a correctly wired deployment, and names each gap of a wrong one.

Real parts: two live exporters on their simulation (a steady engine that is up, and one that loads
for two hours), real Prometheus servers with and without the generated rules, under the job the
rules select or another, and real Alertmanagers with the shipped routing or one that sends
critical nowhere. The check runs as a user runs it: `oomguard drill --check URL`.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest
import yaml
from aiohttp import ClientSession, web
from support import FIXTURES, REPO

from oomguard.bundle.bundle_config import load_bundle_config
from oomguard.bundle.generate import ALERTS_FILE, RECORDS_FILE, render
from oomguard.common.ports import free_port
from oomguard.drill.check import ABSENT, ARMED, _judge, _matches, _route, _State
from oomguard.drill.services import Alertmanager, Prometheus
from oomguard.exporter.exposition import METRICS
from oomguard.exporter.exposition.spec import ALWAYS, ENGINE_UP, PER_GPU, PER_TARGET
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import RUNTIME, make_app
from oomguard.simulate.checks import load_config
from oomguard.simulate.host import SimulatedHost

ROUTING = REPO / "deploy" / "alertmanager" / "alertmanager.yml"


async def _exporter(scenario: str | None, gpu_source: str = "nvml", **settings: Any) -> tuple[web.AppRunner, str]:
    """A live exporter on its simulation (`scenario`, its GPUs read through NVML or, as the cluster mode reads them,
    dcgm-exporter), or on the targets of `settings` with no GPU."""
    simulated = (
        {"simulation": {"scenario": scenario, "time_scale": 60, "gpu_source": gpu_source}}
        if scenario
        else {"nvml": {"enabled": False}}
    )
    config = load_config(
        None,
        {**simulated, "events": {"kernel_log": False, "xid": False}, "discovery": {"local": "off"}, **settings},
    )
    runtime = Runtime(config, simulated=SimulatedHost(config)) if scenario else Runtime(config, nvml_lib=None)
    runner = web.AppRunner(make_app(runtime))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"127.0.0.1:{port}"


async def _renamed_engine() -> tuple[web.AppRunner, str]:
    """A vLLM /metrics whose KV family has a name no version of oomguard reads, and a /health that says 200."""
    body = (FIXTURES / "vllm" / "vllm-0.32.0-cpu-under-load.txt").read_text()
    body = body.replace("vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_fraction")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=body)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    runner, address = await _serve({"/metrics": metrics, "/health": health})
    return runner, f"http://{address}"


async def _serve(routes: dict[str, Any]) -> tuple[web.AppRunner, str]:
    """A server of these GET handlers on a free loopback port: its runner and its host:port."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"127.0.0.1:{port}"


async def _posing(exporter_at: str) -> tuple[web.AppRunner, str]:
    """The exporter's /metrics as a cluster-mode exporter that refused a pod posing as a node's dcgm-exporter
    would serve it: the same, and the refusal counted."""
    refused = (
        "# TYPE oomguard_dcgm_pods_refused_total counter\n"
        'oomguard_dcgm_pods_refused_total{node="gpu-a",namespace="tenant",pod="fake-dcgm",reason="owner"} 1.0\n'
    )

    async def metrics(request: web.Request) -> web.Response:
        async with ClientSession() as session, session.get(f"http://{exporter_at}/metrics") as upstream:
            body = (await upstream.read()).decode()
        return web.Response(text=body.replace("# EOF\n", "") + refused)

    return await _serve({"/metrics": metrics})


def _check(url: str, *extra: str) -> tuple[int, str]:
    """`oomguard drill --check URL`, as a user runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "oomguard", "drill", "--check", url, *extra],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def _one_gap(url: str) -> str:
    """The check of `url` fails naming one gap first; its output."""
    code, out = _check(url)
    assert code == 1, out
    assert out.splitlines()[0].startswith(f"{url}: FAIL, 1 gap"), out
    return out


@pytest.fixture(scope="module")
def deployments(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Prometheus servers over a steady exporter (its engine up) and a loading one, each wired its own way."""
    tmp = tmp_path_factory.mktemp("check")
    bundle = load_bundle_config()
    for name, text in render(bundle).items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    both = [tmp / ALERTS_FILE, tmp / RECORDS_FILE]
    loop = asyncio.new_event_loop()
    steady, steady_at = loop.run_until_complete(_exporter("steady"))
    loading, loading_at = loop.run_until_complete(_exporter("loading"))
    cluster, cluster_at = loop.run_until_complete(_exporter("steady", gpu_source="dcgm"))
    # The steady engine again, under a target whose logs: has a typo.
    simulation = steady.app[RUNTIME].simulated
    assert isinstance(simulation, SimulatedHost)
    typo_target = {
        "name": "typo", "url": simulation.engine.url, "local_process": "no", "logs": [str(tmp / "vlm" / "*.log")]
    }  # fmt: skip
    typo, typo_at = loop.run_until_complete(_exporter(None, targets=[typo_target]))
    # A vLLM whose KV family was renamed by an upgrade: up, read, and its KV alerts blind.
    engine, engine_url = loop.run_until_complete(_renamed_engine())
    renamed, renamed_at = loop.run_until_complete(
        _exporter(None, targets=[{"name": "renamed", "url": engine_url, "local_process": "no"}])
    )
    posing, posing_at = loop.run_until_complete(_posing(steady_at))
    # The exporters serve from this loop, run in a thread while the Prometheus servers scrape them.
    import threading

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servers = {
        "up": Prometheus(tmp / "up", [steady_at], rule_files=both),
        "loading": Prometheus(tmp / "loading", [loading_at], rule_files=both),
        "no-rules": Prometheus(tmp / "no-rules", [steady_at]),
        "no-records": Prometheus(tmp / "no-records", [steady_at], rule_files=[tmp / ALERTS_FILE]),
        "wrong-job": Prometheus(tmp / "wrong-job", [steady_at], rule_files=both, job="gpu-exporter"),
        "typo": Prometheus(tmp / "typo", [typo_at], rule_files=both),
        "renamed": Prometheus(tmp / "renamed", [renamed_at], rule_files=both),
        "cluster": Prometheus(tmp / "cluster", [cluster_at], rule_files=both),
        "posing": Prometheus(tmp / "posing", [posing_at], rule_files=both),
    }
    routing = yaml.safe_load(ROUTING.read_text())
    nowhere = {
        "route": {"receiver": "team", "routes": [{"matchers": ['severity="critical"'], "receiver": "void"}]},
        "receivers": [{"name": "team", "webhook_configs": [{"url": "http://127.0.0.1:9/hook"}]}, {"name": "void"}],
    }
    managers = {"shipped": Alertmanager(tmp / "am-shipped", routing), "void": Alertmanager(tmp / "am-void", nowhere)}
    try:
        for service in [*servers.values(), *managers.values()]:
            service.start()
        for name, server in servers.items():
            job = "gpu-exporter" if name == "wrong-job" else "oomguard"
            state = "loading" if name == "loading" else "up"
            # The engine's state as the exporter says it, and (up) its figures read: what the check judges.
            server.wait_for(f'oomguard_target_state{{job="{job}",state="{state}"}} == 1', 60)
            if state == "up":
                server.wait_for(f'oomguard_engine_requests_running{{job="{job}"}}', 60)
        servers["typo"].wait_for('oomguard_event_source_files{job="oomguard"} == 0', 60)
        servers["renamed"].wait_for('oomguard_engine_figure_read{job="oomguard"} == 0', 60)
        servers["posing"].wait_for('oomguard_dcgm_pods_refused_total{job="oomguard"}', 60)
        yield servers, managers
    finally:
        for service in [*servers.values(), *managers.values()]:
            service.stop()
        for runner in (posing, steady, loading, cluster, typo, renamed, engine):
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_a_correct_deployment_with_its_engine_up_and_no_event_yet_passes(deployments: Any) -> None:
    servers, _ = deployments
    code, out = _check(servers["up"].url)
    assert code == 0, out
    first = out.splitlines()[0]
    assert first.startswith(f"{servers['up'].url}: OK, the bundle is loaded and fed"), out
    assert "Gaps" not in out
    # Born with their first event: armed, not missing.
    # (The alerts judge events on the counters alone: the last-event timestamps are no input of theirs.)
    assert "oomguard_gpu_events_total: armed: appears with its first event" in out, out
    # There only while memory climbs, and gone when it stops: no event arms it.
    assert "oomguard_gpu_memory_seconds_to_full: only while climbing or spiking" in out, out
    present = out.split("Present:\n", 1)[1].replace("\n  ", " ")
    assert "oomguard_engine_kv_cache_usage_ratio," in present and "oomguard_gpu_memory_used_ratio," in present
    assert "the bundle's" in out and "alerts and" in out and "recording rules are loaded" in out
    assert "sends alerts to no Alertmanager" in out  # said, not a gap


def test_a_correct_cluster_mode_deployment_passes(deployments: Any) -> None:
    """GPUs read as the cluster mode reads them (dcgm-exporter: no per-process memory): nothing the alerts need is
    missing, so no gap; what it lacks by design is no alert's input."""
    servers, _ = deployments
    code, out = _check(servers["cluster"].url)
    assert code == 0, out
    assert out.splitlines()[0].startswith(f"{servers['cluster'].url}: OK, the bundle is loaded and fed"), out
    assert "Gaps" not in out
    # Which naming its dcgm-exporter uses (the simulated one writes 4.8's families, in MiB).
    assert "dcgm-exporter on 1 node(s) (" in out and "GPU memory from DCGM_FI_DEV_FB_FREE (MiB)" in out, out


def test_an_engine_that_loads_reads_as_loading_not_as_a_gap(deployments: Any) -> None:
    servers, _ = deployments
    code, out = _check(servers["loading"].url)
    assert code == 0, out
    assert "is loading: its engine's figures appear when it answers" in out
    assert "oomguard_engine_kv_cache_usage_ratio: loading: appears when the engine answers" in out
    assert "oomguard_engine_requests_waiting: loading" in out


def test_rules_missing_is_a_gap_in_one_line_after_the_summary(deployments: Any) -> None:
    servers, _ = deployments
    code, out = _check(servers["no-rules"].url)
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith(f"{servers['no-rules'].url}: FAIL, 2 gaps"), out
    assert "none of its" in out and "alerts loaded" in out and "rules/oomguard-alerts.yaml" in out
    assert "recording rules not loaded" in out
    assert len(lines) < 60, f"{len(lines)} lines"


def test_recording_rules_missing_names_what_the_dashboards_lose(deployments: Any) -> None:
    servers, _ = deployments
    out = _one_gap(servers["no-records"].url)
    assert "the dashboards read instance_" in out and "No data" in out


def test_a_job_the_rules_do_not_select_is_a_gap(deployments: Any) -> None:
    servers, _ = deployments
    code, out = _check(servers["wrong-job"].url)
    assert code == 1
    assert 'the exporter is scraped as job="gpu-exporter", but the rules select {job="oomguard"}' in out, out


def test_a_log_pattern_that_follows_no_file_while_the_engine_is_up_is_a_gap(deployments: Any) -> None:
    servers, _ = deployments
    out = _one_gap(servers["typo"].url)
    assert "/vlm/*.log of target typo on 127.0.0.1:" in out and "follows no file while its engine is up" in out


def test_an_up_engine_without_a_figure_it_gives_is_a_gap(deployments: Any) -> None:
    servers, _ = deployments
    out = _one_gap(servers["renamed"].url)
    assert "target renamed on 127.0.0.1:" in out and "answers without its kv_cache_usage" in out


def test_a_pod_refused_as_dcgm_exporter_is_a_gap(deployments: Any) -> None:
    servers, _ = deployments
    out = _one_gap(servers["posing"].url)
    assert "pod tenant/fake-dcgm refused as the dcgm-exporter of node gpu-a" in out
    assert "something poses as dcgm-exporter" in out and "#oomguarddcgmpodrefused" in out


def test_nothing_to_ask_could_not_run_in_one_line() -> None:
    """No Prometheus there: no deployment was checked, so no gap of one (exit 1) but "could not run" (exit 2), as
    oomguard diagnose says it (tests/test_cli_errors.py has the line itself)."""
    url = f"http://127.0.0.1:{free_port()}"
    code, out = _check(url)
    assert code == 2, out
    assert out.splitlines() == [out.strip()] and f"cannot reach Prometheus at {url}: Connection refused" in out, out


def test_the_routing_of_each_severity(deployments: Any) -> None:
    servers, managers = deployments
    code, out = _check(servers["up"].url, "--alertmanager", managers["shipped"].url)
    assert code == 0, out
    assert "severity critical (" in out and "severity warning (" in out
    code, out = _check(servers["up"].url, "--alertmanager", managers["void"].url)
    assert code == 1
    assert "critical alerts (" in out and "go to receiver 'void', which sends nowhere: nobody is paged" in out
    assert "severity warning (" in out and "goes to receiver 'team' (webhook)" in out


def test_time_to_full_is_judged_by_what_makes_it_exist() -> None:
    """A time to full exists while memory climbs or spikes and goes when it stops: its absence is the trend's
    state, not an event still to come ("armed"); the check says the condition, from the metric's help."""
    by_name = {spec.sample_name: spec for spec in METRICS}
    nothing_yet = _State(gpus=1, targets=1, up=1, loading=0)
    for name in ("oomguard_gpu_memory_seconds_to_full", "oomguard_target_memory_seconds_to_full",
                 "oomguard_target_memory_seconds_to_budget"):  # fmt: skip
        level, why = _judge(by_name[name], nothing_yet)
        assert (level, why) == (ABSENT, "only while climbing or spiking"), (name, level, why)
    level, why = _judge(by_name["oomguard_gpu_events_total"], nothing_yet)
    assert (level, why) == (ARMED, "armed: appears with its first event")


def test_route_matching_follows_alertmanager() -> None:
    tree = {
        "receiver": "default",
        "routes": [
            {"match": {"team": "db"}, "receiver": "db"},
            {"matchers": ['severity=~"crit.*"', 'alertname!="Quiet"'], "receiver": "pager",
             "routes": [{"match_re": {"gpu": "[0-3]"}, "receiver": "pager-low"}]},
        ],
    }  # fmt: skip
    assert _route(tree, {"severity": "critical", "alertname": "A"}, "") == "pager"
    assert _route(tree, {"severity": "critical", "alertname": "A", "gpu": "2"}, "") == "pager-low"
    assert _route(tree, {"severity": "critical", "alertname": "Quiet"}, "") == "default"
    assert _route(tree, {"severity": "warning", "team": "db"}, "") == "db"
    assert not _matches({"matchers": ["severity = critical"]}, {"severity": "warning"})


@pytest.mark.parametrize("gpu_source", ["nvml", "dcgm"])
async def test_each_declared_presence_holds_on_a_live_exporter(aiohttp_client, gpu_source: str) -> None:
    """What the check relies on: a metric declared always there, per GPU, per target or while the engine is up
    is there, on a live exporter whose engine is up, its GPUs read through NVML or dcgm-exporter."""
    config = load_config(
        None,
        {
            "simulation": {"scenario": "steady", "time_scale": 60, "gpu_source": gpu_source},
            "events": {"kernel_log": False, "xid": False},
            "discovery": {"local": "off"},
        },
    )
    client = await aiohttp_client(make_app(Runtime(config, simulated=SimulatedHost(config))))
    expected = {m.sample_name for m in METRICS if m.presence in (ALWAYS, PER_GPU, PER_TARGET, ENGINE_UP)}
    found: set[str] = set()
    for _ in range(200):  # until the engine is up and read (a deadline of 20 s)
        text = await (await client.get("/metrics")).text()
        found = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and line[0] != "#"}
        if "oomguard_target_up{" in text and "oomguard_engine_requests_running{" in text:
            break
        await asyncio.sleep(0.1)
    assert expected - found == set()
