"""The drill of every scenario: real Prometheus and Alertmanager, the generated rules, the example routing.

Each scenario runs at 30x (a 40-minute scenario takes 80 s), the hour-long steady ones at 60x: the expected
alerts must reach the expected receivers through Alertmanager, the quiet ones must never fire, where nothing is
expected to be delivered nothing is, and in the incident, the slow leak and the tensor-parallel skew a memory
alert must arrive before the first OOM.

A drill waits on the wall clock (it uses about 15 % of a core), so the selected scenarios run three at a time, each
with its own chain and ports, and each test checks its own report: the first test to ask waits for its scenario,
and the durations pytest prints fall mostly on the first ones.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from support import REPO

from oomguard.cli import main
from oomguard.common.time_scale import TimeScale
from oomguard.drill.run import DrillReport, _report, drill_alertmanager_config, expected_seconds, run
from oomguard.drill.scenarios import NOT_DELIVERED, SCENARIOS
from oomguard.drill.webhook import Notification, WebhookReceiver

ROUTING = REPO / "deploy" / "alertmanager" / "alertmanager.yml"


# Nothing happens in an hour of a steady server: faster, measured stable (docs/drill.md).
TIME_SCALES = {"default-steady": 60.0, "tight-steady": 60.0}
DRILLS_AT_ONCE = 3
# Every scenario as the DaemonSet reads the GPUs (NVML), and the incident as the cluster mode does (a simulated
# dcgm-exporter, no per-process memory): the same alerts, receivers and verdict are expected of both.
DRILLS = [*SCENARIOS, "incident@cluster"]


def _time_scale(name: str) -> float:
    return TIME_SCALES.get(name.partition("@")[0], 30.0)


def _scenario_and_mode(name: str) -> tuple[str, str]:
    scenario, _, mode = name.partition("@")
    return scenario, mode or "node"


@pytest.fixture(scope="module")
def drills(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, tuple[Path, Future[DrillReport]]]]:
    """The scenarios selected in this session, started three at a time, the longest first."""
    selected = [item.callspec.params["name"] for item in request.session.items
                if item.module is request.module and item.originalname == "test_drill"]  # fmt: skip
    longest_first = sorted(
        selected, key=lambda name: -SCENARIOS[_scenario_and_mode(name)[0]].minutes / _time_scale(name)
    )
    pool = ThreadPoolExecutor(max_workers=DRILLS_AT_ONCE, thread_name_prefix="drill")
    started: dict[str, tuple[Path, Future[DrillReport]]] = {}
    for name in longest_first:
        scenario, mode = _scenario_and_mode(name)
        workdir = tmp_path_factory.mktemp(f"drill-{name.replace('@', '-')}")
        diagnosis = workdir / "diagnosis.md" if name == "incident" else None
        started[name] = workdir, pool.submit(
            run, SCENARIOS[scenario], workdir, alertmanager_config=ROUTING, time_scale=_time_scale(name),
            diagnosis_report=diagnosis, mode=mode,
        )  # fmt: skip
    try:
        yield started
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("name", DRILLS)
def test_drill(name: str, drills: dict[str, tuple[Path, Future[DrillReport]]]) -> None:
    scenario_name, mode = _scenario_and_mode(name)
    scenario = SCENARIOS[scenario_name]
    tmp_path, future = drills[name]
    diagnosis = tmp_path / "diagnosis.md" if name == "incident" else None
    report = future.result()
    print(report.markdown())
    assert report.ok, report.markdown()
    assert report.mode == mode
    # `oomguard diagnose` on the drill's Prometheus: one diagnosis, of the scenario's verdict.
    assert report.verdicts == [scenario.verdict], report.diagnosis_text
    assert report.diagnosis_text.startswith(scenario.verdict.upper())
    if diagnosis is not None:  # the incident report, with its plot
        assert "### Timeline" in diagnosis.read_text() and "(diagnosis-1.png)" in diagnosis.read_text()
        png = (tmp_path / "diagnosis-1.png").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 20_000
    assert report.alerts and all(a.ok for a in report.alerts)
    if scenario.memory_alert_before_oom:
        assert report.memory_alert_lead_minutes is not None and report.memory_alert_lead_minutes > 0
    if scenario.engine == "sglang":
        # SGLang's retractions are in its log and counted apart, as preemptions; no OOM event but its CUDA OOMs (a
        # death in the last second may be in the log and not yet in Prometheus).
        log = (tmp_path / "engine.log").read_text()
        assert "KV cache pool is full. Retract requests." in log
        assert int(re.search(r"preemptions: (\d+)", report.diagnosis_text)[1]) > 0, report.diagnosis_text
        ooms = [event for _, event in report.timeline if event.startswith("OOM event")]
        assert 2 <= len(ooms) <= log.count("torch.OutOfMemoryError: CUDA out of memory"), (ooms, report.markdown())
    if all(receiver is NOT_DELIVERED for receiver in scenario.expected.values()):
        # Nothing pages, nothing is ticketed: not only the alerts listed quiet, any alert of the bundle.
        assert not [event for _, event in report.timeline if " reached " in event], report.markdown()


class _Recorded:
    """A Prometheus that answers the report's queries from a list of alerts fired (at t=10), and nothing else."""

    def __init__(self, fired: list[str]) -> None:
        self.fired = fired

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
        if not expr.startswith("ALERTS"):
            return []
        return [{"metric": {"alertname": name}, "values": [[10.0, "1"]]} for name in self.fired]


def _report_of(scenario: str, arrived: dict[str, str]) -> DrillReport:
    """The report of `scenario` where each alert of `arrived` (without the prefix) reached its receiver."""
    webhook = WebhookReceiver([Notification(10.0, receiver, "firing", "OomGuard" + name, {})
                               for name, receiver in arrived.items()])  # fmt: skip
    prometheus = _Recorded(["OomGuard" + name for name in arrived])
    clock = TimeScale(30.0)
    return _report(SCENARIOS[scenario], prometheus, webhook, "OomGuard", 0.0, 60.0, clock)  # type: ignore[arg-type]


def test_an_alert_that_arrived_unasked_is_unexpected_and_fails_the_drill() -> None:
    """An alert the scenario neither expects nor wants quiet reached a receiver: `unexpected`, and the drill fails
    (the report said `ok`); one the scenario allows (a memory page racing the OOM) is `allowed`."""
    report = _report_of("probe-kill", {"RestartsWithoutOom": "ticket", "RestartStorm": "pager", "TargetDown": "pager"})
    [row] = [line for line in report.markdown().splitlines() if line.startswith("| OomGuardTargetDown |")]
    assert row == "| OomGuardTargetDown | not listed | pager | +5.0 | unexpected |"
    assert not report.ok and "FAIL" in report.markdown().splitlines()[0]
    assert {a["alert"]: a["verdict"] for a in json.loads(report.json())["alerts"]}["OomGuardTargetDown"] == "unexpected"
    listed_only = _report_of("probe-kill", {"RestartsWithoutOom": "ticket", "RestartStorm": "pager"})
    assert listed_only.ok, listed_only.markdown()

    assert "GpuMemoryCritical" in SCENARIOS["sglang-incident"].may_arrive
    raced = _report_of("sglang-incident", {"GpuMemoryCritical": "pager"})
    [row] = [line for line in raced.markdown().splitlines() if line.startswith("| OomGuardGpuMemoryCritical |")]
    assert row == "| OomGuardGpuMemoryCritical | not listed (may arrive) | pager | +5.0 | allowed |"
    assert [a.ok for a in raced.alerts if not a.listed] == [True]


def test_drill_routing_rewrites_only_addresses_and_waits(tmp_path: Path) -> None:
    import yaml

    original = yaml.safe_load(ROUTING.read_text())
    drill = drill_alertmanager_config(ROUTING, 5555)
    assert [r["name"] for r in drill["receivers"]] == [r["name"] for r in original["receivers"]]
    for receiver in drill["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            assert hook["url"] == f"http://127.0.0.1:5555/{receiver['name']}"
    assert drill["inhibit_rules"] == original["inhibit_rules"]
    assert drill["route"]["group_wait"] == "1s"


def test_drill_command_list_and_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["drill", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in SCENARIOS)
    # Each scenario with how long it runs, simulated and real, at the time scale asked for.
    for scenario in SCENARIOS.values():
        seconds = expected_seconds(scenario, 30.0)
        assert f"{scenario.name} ({scenario.minutes:g} simulated minutes, about {seconds:.0f} s at 30x)" in out
    assert main(["drill", "--list", "--time-scale", "60"]) == 0
    incident = SCENARIOS["incident"]
    assert f"about {expected_seconds(incident, 60.0):.0f} s at 60x" in capsys.readouterr().out
    assert main(["drill", "--scenario", "nope"]) == 2


@pytest.mark.parametrize("bad", ["0", "-30", "inf", "nan", "fast"])
def test_a_time_scale_that_is_no_clock_is_refused_by_the_command_line(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused as argparse refuses a bad flag (exit 2, one line naming it and what to give), before anything
    starts: not a ZeroDivisionError, nor a drill whose every wait is infinite or NaN."""
    for argv in (["drill", "--list", "--time-scale", bad], ["drill", "--scenario", "probe-kill", "--time-scale", bad]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.splitlines()[-1] == (
            "oomguard drill: error: argument --time-scale: a number above 0 is needed, simulated seconds per real "
            f"second (got {bad!r})"
        )


def test_a_time_scale_that_is_no_clock_is_one_line_from_diagnose(capsys: pytest.CaptureFixture[str]) -> None:
    """diagnose refuses it too, before it reads anything: one line naming the flag, exit 2, no traceback."""
    for bad in ("0", "-30", "inf", "nan"):
        assert main(["diagnose", "--exporter", "http://127.0.0.1:1", "--time-scale", bad]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        [line] = captured.err.splitlines()
        assert line.startswith(f"oomguard diagnose: --time-scale {float(bad)!r}: ") and "a number above 0" in line


@pytest.mark.parametrize("tls", [False, True])
def test_drill_missing_prometheus_is_one_line_not_a_report(
    tls: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no prometheus, no alertmanager
    assert main(["drill", "--scenario", "probe-kill", *(["--tls"] if tls else [])]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # no FAIL report with empty tables
    assert captured.err.splitlines() == [
        "oomguard drill: prometheus not found: install Debian's prometheus package (apt-get install prometheus)"
    ]


def test_drill_tls_without_cryptography_is_one_line_not_a_report(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cryptography.x509", None)  # as if not installed: its import fails
    assert main(["drill", "--scenario", "probe-kill", "--tls"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith("oomguard drill: oomguard drill --tls makes its certificates with the cryptography")
    assert "pip install cryptography" in line


def test_cryptography_is_a_dependency_of_the_plain_install() -> None:
    """drill --tls works from `pip install oomguard` (the README's install, make run's): cryptography is among the
    main dependencies, not only the test extra."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert any(re.match(r"cryptography\b", dependency) for dependency in project["dependencies"])


def test_drill_command_json_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command as a user runs it, on the shortest scenario, from a folder outside the repository (the example
    routing ships with the package), with a JSON report and its exit status."""
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "report.json"
    began = time.monotonic()
    code = main(["drill", "--scenario", "probe-kill", "--json", "--report", str(report),
                 "--workdir", str(tmp_path / "work")])  # fmt: skip
    took = time.monotonic() - began
    data = json.loads(report.read_text())
    assert code == (0 if data["ok"] else 1)
    # stdout is the report alone; the progress, as the drill goes, is on stderr: each phase, each alert as it
    # arrives, and where the simulated time stands.
    captured = capsys.readouterr()
    assert json.loads(captured.out) == data
    progress = captured.err
    scenario = SCENARIOS["probe-kill"]
    assert f"{scenario.minutes:g} simulated minutes at 30x: about {expected_seconds(scenario):.0f} s in all" in progress
    assert "engine launched" in progress and "scenario over" in progress and "oomguard diagnose" in progress
    assert re.search(r"simulated minute [\d.]+ of 15, \d+ s left; alerts so far: \d+ delivered", progress), progress
    # Every arrival in the report was told as it came (or, in flight at the end, before the report).
    for alert in data["alerts"]:
        for receiver in alert["receivers"]:
            assert re.search(rf"simulated minute -?[\d.]+: {alert['alert']} reached {receiver}", progress), progress
    print(f"probe-kill at 30x took {took:.1f} s, expected {expected_seconds(scenario):.0f} s")
    assert data["scenario"] == "probe-kill" and {a["alert"] for a in data["alerts"]} >= {"OomGuardRestartStorm"}
    assert [d["verdict"] for d in data["diagnosis"]] == ["probe_kill"]


def test_the_shipped_routing_is_the_deployed_example() -> None:
    from oomguard.drill.run import DEFAULT_ALERTMANAGER_CONFIG

    assert DEFAULT_ALERTMANAGER_CONFIG.read_text() == ROUTING.read_text()


def test_the_readme_and_docs_name_every_drill_scenario() -> None:
    """`drill --list` and the README's list of scenarios are the same set; docs/drill.md describes each."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## The drill") : readme.index("## Diagnose")]
    assert set(re.findall(r"`([a-z]+(?:-[a-z]+)+|incident)`", section)) >= set(SCENARIOS)
    docs = (REPO / "docs" / "drill.md").read_text()
    assert [name for name in SCENARIOS if f"| `{name}` |" not in docs] == []
