"""`oomguard drill`: the exporter on a simulated scenario, a real Prometheus with the generated rules, a real
Alertmanager with the routing, and a webhook receiver; then a timeline of which alerts arrived where, when.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import os
import stat
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from oomguard.bundle.bundle_config import load_bundle_config
from oomguard.bundle.generate import ALERTS_FILE, RECORDS_FILE, render
from oomguard.bundle.thresholds import default_thresholds
from oomguard.common import bounded_yaml
from oomguard.common.excerpt import excerpt
from oomguard.common.kinds import LOG_OOM_KINDS, kind_matcher
from oomguard.common.ports import free_port
from oomguard.common.time_scale import TimeScale
from oomguard.diagnose import DiagnoseError, diagnose_prometheus
from oomguard.diagnose import report as diagnose_report
from oomguard.drill.scenarios import MEMORY_ALERTS, DrillScenario
from oomguard.drill.services import (
    Alertmanager,
    MissingPrerequisite,
    Prometheus,
    ServiceError,
    alertmanager_binary,
    prometheus_binary,
)
from oomguard.drill.tls import DrillTls, check_chain, make_drill_tls, require_cryptography
from oomguard.drill.webhook import Notification, WebhookReceiver
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app
from oomguard.exporter.web_config import WebConfigState, load_web_config
from oomguard.exporter.web_config.server import Server
from oomguard.simulate.checks import load_config
from oomguard.simulate.host import SimulatedHost

log = logging.getLogger(__name__)
# The example routing (deploy/alertmanager/alertmanager.yml links to it), shipped with the package so that a drill
# runs from any folder.
DEFAULT_ALERTMANAGER_CONFIG = Path(__file__).parent.parent / "bundle" / "alertmanager.yml"
# 30x: a 40-minute scenario in 80 s. Faster, and the fixed costs of a real process (a second of
# imports, a scrape interval) weigh more than the scenario's own times.
DEFAULT_TIME_SCALE = 30.0
# What a drill costs beyond its scenario's own time: starting Prometheus and Alertmanager, the 3 s for the last
# notifications, the report and `oomguard diagnose` (probe-kill at 30x: 34.3 s for its 30 s, on two shared cores).
FIXED_SECONDS = 5.0
# A line of progress at least this often (real seconds), and one at once for each alert that arrives.
PROGRESS_EVERY = 10.0

Progress = Callable[[str], None]


def _quiet(_line: str) -> None:
    pass


def expected_seconds(scenario: DrillScenario, time_scale: float = DEFAULT_TIME_SCALE) -> float:
    """The drill's expected wall-clock time: its simulated minutes at `time_scale`, and the fixed costs."""
    return TimeScale(time_scale).real(scenario.minutes * 60) + FIXED_SECONDS


def prerequisites(*, tls: bool = False) -> None:
    """Raises MissingPrerequisite (one line: what to install) before anything starts."""
    prometheus_binary()
    alertmanager_binary()
    if tls:
        require_cryptography()


@dataclass
class AlertResult:
    alert: str
    # None: fires in Prometheus but reaches no receiver (info, or inhibited); "ticket?": ticket or inhibited.
    expected_receiver: str | None
    quiet: bool
    receivers: list[str]  # where its firing notifications arrived
    first_firing: float | None  # simulated minutes, relative to the reference (first OOM, else start)
    ok: bool
    listed: bool = True  # False: arrived at a receiver, though the scenario neither expects it nor wants it quiet
    # ok or FAIL for a listed alert; for one not listed, `allowed` (the scenario's may_arrive) or `unexpected`.
    verdict: str = ""

    def __post_init__(self) -> None:
        if not self.verdict:
            self.verdict = ("ok" if self.ok else "FAIL") if self.listed else ("allowed" if self.ok else "unexpected")


@dataclass
class DrillReport:
    scenario: str
    summary: str
    time_scale: float
    reference: str  # what the times are relative to
    timeline: list[tuple[float, str]]  # (simulated minutes, event)
    alerts: list[AlertResult]
    memory_alert_lead_minutes: float | None
    problems: list[str] = field(default_factory=list)
    # `oomguard diagnose` on the drill's Prometheus afterwards: the verdict expected, and what it said.
    expected_verdict: str | None = None
    diagnosis: list[dict[str, Any]] = field(default_factory=list)  # Diagnosis.json() of each target
    diagnosis_text: str = ""
    tls: list[str] = field(default_factory=list)  # under --tls: the checks of the https chain that held
    mode: str = "node"  # node: GPUs through NVML; cluster: through a simulated dcgm-exporter

    @property
    def verdicts(self) -> list[str]:
        return [d["verdict"] for d in self.diagnosis]

    @property
    def verdict_ok(self) -> bool:
        return self.expected_verdict is None or self.verdicts == [self.expected_verdict]

    @property
    def ok(self) -> bool:
        return not self.problems and all(a.ok for a in self.alerts) and self.verdict_ok

    def markdown(self) -> str:
        lines = [
            f"# Drill `{self.scenario}`: {'PASS' if self.ok else 'FAIL'}",
            "",
            self.summary,
            "",
            f"Times in simulated minutes relative to {self.reference} (time scale {self.time_scale:g}x)"
            + (
                ", in the cluster mode: GPU memory from a simulated dcgm-exporter, no per-process memory."
                if self.mode == "cluster"
                else "."
            ),
            "",
            "## Timeline",
            "",
            *[f"- {t:+.1f} min: {event}" for t, event in self.timeline],
            "",
            "## Alerts",
            "",
            "| alert | expected | arrived at | first firing (min) | verdict |",
            "|---|---|---|---|---|",
        ]
        for a in self.alerts:
            expected = "quiet" if a.quiet else (a.expected_receiver or "fires, not delivered (info or inhibited)")
            expected = expected if a.listed else "not listed" + (" (may arrive)" if a.ok else "")
            first = "-" if a.first_firing is None else f"{a.first_firing:+.1f}"
            lines.append(f"| {a.alert} | {expected} | {', '.join(a.receivers) or '-'} | {first} | {a.verdict} |")
        if self.memory_alert_lead_minutes is not None:
            lines += [
                "",
                f"A memory alert arrived {self.memory_alert_lead_minutes:.1f} simulated minutes before the first OOM.",
            ]
        if self.expected_verdict is not None:
            said = ", ".join(self.verdicts) or "nothing"
            lines += [
                "",
                "## Diagnosis (`oomguard diagnose` on the drill's Prometheus)",
                "",
                f"Expected verdict `{self.expected_verdict}`, got `{said}`: {'ok' if self.verdict_ok else 'FAIL'}.",
                "",
                "```",
                self.diagnosis_text.rstrip(),
                "```",
            ]
        if self.tls:
            lines += ["", "## TLS and basic auth (--tls)", "", *[f"- {line}" for line in self.tls]]
        if self.problems:
            lines += ["", "## Problems", "", *[f"- {p}" for p in self.problems]]
        return "\n".join(lines) + "\n"

    def json(self) -> str:
        return json.dumps(asdict(self) | {"ok": self.ok}, indent=2)


# An Alertmanager configuration: far above any a hand writes (the web configuration's and the mapping's bound).
MAX_ROUTING_BYTES = 1024**2


def read_routing(path: Path) -> dict[str, Any]:
    """The user's Alertmanager configuration: a regular file within MAX_ROUTING_BYTES, YAML with its aliases bounded
    (common/bounded_yaml.py), a mapping with a `route`; else a ValueError naming the file and the fix, read before a
    byte of a FIFO or a device is waited for."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the Alertmanager configuration: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(
            f"{path}: the Alertmanager configuration is not a regular file (a FIFO, a device, a folder?); give a file"
        )
    if st.st_size > MAX_ROUTING_BYTES:
        raise ValueError(
            f"{path}: {st.st_size:,} bytes, over the limit of an Alertmanager configuration ({MAX_ROUTING_BYTES:,}); "
            "is it the right file?"
        )
    try:
        with open(path, "rb") as handle:
            text = handle.read(MAX_ROUTING_BYTES + 1).decode("utf-8")
        config = bounded_yaml.load(text)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the Alertmanager configuration: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: the Alertmanager configuration is not UTF-8 text; save it as UTF-8") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise ValueError(f"{path}: not YAML Alertmanager reads: {excerpt(str(exc), 300)}") from None
    if not isinstance(config, dict) or not isinstance(config.get("route"), dict):
        raise ValueError(f"{path}: no `route:` mapping: is it an Alertmanager configuration (--alertmanager-config)?")
    return config


def drill_alertmanager_config(path: Path, webhook_port: int) -> dict[str, Any]:
    """The user's routing, with every webhook sent to the drill's receiver and the waits cut to seconds."""
    config = copy.deepcopy(read_routing(path))
    for receiver in config.get("receivers", []):
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"http://127.0.0.1:{webhook_port}/{receiver['name']}"
            hook["send_resolved"] = True

    def shorten(route: dict[str, Any]) -> None:
        for key, value in (("group_wait", "1s"), ("group_interval", "2s"), ("repeat_interval", "1h")):
            if key in route or route is config["route"]:
                route[key] = value
        for child in route.get("routes", []):
            shorten(child)

    shorten(config["route"])
    return config


@dataclass
class Chain:
    """The running chain: exporter -> Prometheus (generated rules) -> Alertmanager (routing) -> webhook."""

    prometheus: Prometheus
    alertmanager: Alertmanager
    webhook: WebhookReceiver
    prefix: str
    exporter_url: str = ""
    tls: DrillTls | None = None
    told: int = 0  # the webhook's notifications told as progress


@contextlib.asynccontextmanager
async def alerting_chain(
    workdir: Path,
    runtime: Runtime,
    *,
    bundle_overrides: dict[str, Any],
    alertmanager_config: Path | None = None,
    scrape_interval: str = "1s",
    tls: DrillTls | None = None,
) -> AsyncIterator[Chain]:
    """Starts the chain around an exporter's runtime, stops everything on the way out.

    `tls`: the exporter and Alertmanager serve https with basic auth, and Prometheus reaches them so.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "bundle.yaml").write_text(yaml.safe_dump(bundle_overrides))
    bundle = load_bundle_config(workdir / "bundle.yaml")
    rules = render(bundle)
    for name in (ALERTS_FILE, RECORDS_FILE):
        (workdir / name).write_text(rules[name])
    webhook = WebhookReceiver()
    webhook_runner = web.AppRunner(webhook.app(), access_log=None)
    await webhook_runner.setup()
    webhook_port = free_port()
    await web.TCPSite(webhook_runner, "127.0.0.1", webhook_port).start()
    routing = drill_alertmanager_config(alertmanager_config or DEFAULT_ALERTMANAGER_CONFIG, webhook_port)
    secured = {} if tls is None else {"web_config": tls.web_config, "ready_context": tls.ssl_context(),
                                      "ready_headers": {"Authorization": tls.authorization()}}  # fmt: skip
    am = Alertmanager(workdir / "alertmanager", routing, **secured)
    exporter: web.AppRunner | Server
    if tls is None:
        exporter = web.AppRunner(make_app(runtime), access_log=None)
    else:
        state = WebConfigState(await asyncio.to_thread(load_web_config, tls.web_config))
        exporter = Server(make_app(runtime, state), "127.0.0.1", 0, state)  # 0: the port it binds
    prometheus: Prometheus | None = None
    try:
        await asyncio.to_thread(am.start)
        if isinstance(exporter, Server):
            await exporter.start()
            exporter_port = exporter.port
        else:
            await exporter.setup()
            exporter_port = free_port()
            await web.TCPSite(exporter, "127.0.0.1", exporter_port).start()
        prometheus = Prometheus(
            workdir / "prometheus", [f"127.0.0.1:{exporter_port}"],
            rule_files=[workdir / ALERTS_FILE, workdir / RECORDS_FILE], alertmanager=am.address,
            scrape_interval=scrape_interval, client=tls.client_settings() if tls else None,
        )  # fmt: skip
        await asyncio.to_thread(prometheus.start)
        scheme = "http" if tls is None else "https"
        yield Chain(prometheus, am, webhook, bundle.prefix, f"{scheme}://127.0.0.1:{exporter_port}", tls)
    finally:
        if prometheus is not None:
            prometheus.stop()
        am.stop()
        await (exporter.stop() if isinstance(exporter, Server) else exporter.cleanup())
        await webhook_runner.cleanup()


async def run_drill(
    scenario: DrillScenario,
    workdir: Path,
    *,
    time_scale: float = DEFAULT_TIME_SCALE,
    alertmanager_config: Path | None = None,
    diagnosis_report: Path | None = None,
    tls: bool = False,
    mode: str = "node",
    progress: Progress = _quiet,
) -> DrillReport:
    """`diagnosis_report`: also write `oomguard diagnose --report` of the drill's Prometheus there (.md or .html).

    `mode`: node, the GPUs through NVML as the DaemonSet reads them; cluster, through a simulated dcgm-exporter
    beside the engine, as the cluster mode reads them (no per-process memory).

    `tls`: the chain under a throwaway CA and password (drill/tls.py), checked at the end.
    `progress`: called with a line at each phase, each arriving alert and every PROGRESS_EVERY seconds.
    """
    clock = TimeScale(time_scale)  # the scenario's: what the drill waits, tells and reports runs on it
    progress(
        f"starting Prometheus, Alertmanager and the exporter{' (https, basic auth)' if tls else ''}"
        f"{' (the cluster mode: GPUs from a simulated dcgm-exporter)' if mode == 'cluster' else ''}; "
        f"{scenario.minutes:g} simulated minutes at {clock.factor:g}x: "
        f"about {expected_seconds(scenario, clock.factor):.0f} s in all"
    )
    # The runtime puts the trend and the events on the scenario's clock (simulate/clock.py), as `serve --simulate`.
    config = load_config(None, {
        "state_dir": str(workdir / "state"),
        "simulation": {
            "scenario": scenario.simulation, "time_scale": clock.factor, "engine": scenario.engine,
            "gpu_source": "dcgm" if mode == "cluster" else "nvml",
        },
        "events": {"kernel_log": False},
    })  # fmt: skip
    simulated = SimulatedHost(config, log_path=workdir / "engine.log", start_engine=False)
    runtime = Runtime(config, simulated=simulated, thresholds=default_thresholds())
    overrides = {"time_scale": clock.factor, **scenario.bundle}
    secure = await asyncio.to_thread(make_drill_tls, workdir / "tls") if tls else None
    try:
        async with alerting_chain(
            workdir, runtime, bundle_overrides=overrides, alertmanager_config=alertmanager_config, tls=secure
        ) as chain:
            # The engine starts once Prometheus scrapes: the exporter sees its whole load, as in production.
            await simulated.engine.start()
            started = time.time()
            # A drill may play another drill's simulation on its engine (sglang-incident plays incident-quick).
            played = "" if scenario.simulation == scenario.name else f", playing the simulation {scenario.simulation!r}"
            progress(f"engine launched ({scenario.engine}{played}): the drill {scenario.name!r} runs")
            await _run_scenario(scenario, chain, started, clock, progress)
            await asyncio.sleep(3)  # the last notifications in flight (group_wait 1s, evaluation 1s)
            end = time.time()
            progress("scenario over: reading the timeline and the alerts from Prometheus")
            report = await asyncio.to_thread(
                _report, scenario, chain.prometheus, chain.webhook, chain.prefix, started, end, clock
            )
            _tell_arrivals(chain, started, clock, progress)  # the last ones, in flight at the end: all told
            progress("oomguard diagnose on the drill's Prometheus")
            await asyncio.to_thread(
                _diagnose, report, scenario, chain.prometheus.url, started, end, clock, diagnosis_report
            )
            if secure is not None:
                progress("checking the https chain: passwords, certificates, what Prometheus reached")
                held, problems = await asyncio.to_thread(check_chain, secure, chain.exporter_url, chain.prometheus)
                report.tls, report.problems = held, report.problems + problems
            report.mode = mode
            return report
    finally:
        await simulated.engine.stop()


async def _run_scenario(
    scenario: DrillScenario, chain: Chain, started: float, clock: TimeScale, progress: Progress
) -> None:
    """Waits out the scenario's simulated minutes, telling each alert that arrives, and where the drill stands
    every PROGRESS_EVERY seconds: a user watches an 80-second drill, not a silent terminal."""
    end = started + clock.real(scenario.minutes * 60)
    next_beat = time.monotonic() + PROGRESS_EVERY
    while (left := end - time.time()) > 0:
        await asyncio.sleep(min(1.0, left))
        _tell_arrivals(chain, started, clock, progress)
        if time.monotonic() >= next_beat:
            next_beat += PROGRESS_EVERY
            minute = clock.simulated(time.time() - started) / 60
            firing = await asyncio.to_thread(_firing, chain.prometheus)
            delivered = sorted({n.alertname for n in chain.webhook.notifications if n.status == "firing"})
            progress(
                f"simulated minute {minute:.1f} of {scenario.minutes:g}, {max(0.0, end - time.time()):.0f} s left; "
                f"alerts so far: {len(delivered)} delivered, firing now: {', '.join(firing) or 'none'}"
            )


def _tell_arrivals(chain: Chain, started: float, clock: TimeScale, progress: Progress) -> None:
    """A line for each firing notification not told yet (chain.told counts those told)."""
    arrived = chain.webhook.notifications[chain.told :]
    chain.told += len(arrived)
    for note in arrived:
        if note.status == "firing":
            minute = clock.simulated(note.at - started) / 60
            progress(f"simulated minute {minute:.1f}: {note.alertname} reached {note.receiver}")


def _firing(prometheus: Prometheus) -> list[str]:
    """The alerts firing now in the drill's Prometheus (for the progress line; none where it does not answer)."""
    try:
        return sorted({s["metric"]["alertname"] for s in prometheus.query('ALERTS{alertstate="firing"}')})
    except (ServiceError, OSError, ValueError, KeyError):
        return []


def _diagnose(
    report: DrillReport, scenario: DrillScenario, prometheus_url: str, start: float, end: float, clock: TimeScale,
    report_path: Path | None = None,
) -> None:  # fmt: skip
    """What `oomguard diagnose --prometheus URL --time-scale X` says of the drill, into its report."""
    probe = scenario.bundle.get("alerts", {}).get("startup_slower_than_probe", {}).get("probe_initial_delay_seconds")
    source = "the drill's probe_initial_delay_seconds" if probe is not None else None
    try:
        # From a little before the engine's launch: its load is part of the story.
        diagnoses = diagnose_prometheus(prometheus_url, at=end, window=end - start + 10, time_scale=clock.factor,
                                        probe_delay=probe, probe_source=source)  # fmt: skip
    except DiagnoseError as exc:
        report.problems.append(f"oomguard diagnose could not run: {exc}")
        return
    report.expected_verdict = scenario.verdict
    report.diagnosis = [d.json() for d in diagnoses]
    report.diagnosis_text = diagnose_report.text(diagnoses, prometheus_url)
    if report_path is not None:
        try:
            diagnose_report.write_report(report_path, diagnoses, prometheus_url)
        except (ValueError, OSError) as exc:
            report.problems.append(f"cannot write the diagnosis report {report_path}: {exc}")


def _first_time(prometheus: Prometheus, expr: str, start: float, end: float) -> float | None:
    times = [float(t) for series in prometheus.query_range(expr, start, end, 0.5) for t, _ in series["values"]]
    return min(times) if times else None


def _report(
    scenario: DrillScenario, prometheus: Prometheus, webhook: WebhookReceiver, prefix: str,
    start: float, end: float, clock: TimeScale,
) -> DrillReport:  # fmt: skip
    sel = '{job="oomguard"}'
    oom_times = _values_seen(
        prometheus,
        f'oomguard_target_last_event_timestamp_seconds{{job="oomguard",{kind_matcher(LOG_OOM_KINDS)}}}',
        start,
        end,
    )
    restart_times = _values_seen(prometheus, f"oomguard_target_last_restart_timestamp_seconds{sel}", start, end)
    crossing = _first_time(prometheus, f"oomguard_gpu_memory_used_ratio{sel} > 0.9", start, end)
    reference = oom_times[0] if oom_times else start

    def minutes(t: float) -> float:
        return clock.simulated(t - reference) / 60

    timeline = [(minutes(start), "drill starts")]
    if crossing is not None:
        timeline.append((minutes(crossing), "GPU memory crosses 90 %"))
    timeline += [(minutes(t), "OOM event (first line in the engine's log)") for t in oom_times]
    timeline += [(minutes(t), "engine restarted (new process start)") for t in restart_times]
    fired = _first_fired(prometheus, start, end)
    for note in _arrived(webhook):
        timeline.append((minutes(note.at), f"{note.alertname} reached {note.receiver}"))
    timeline.sort()

    results = [
        _expected_result(prefix + short, receiver, short in scenario.quiet, _arrived(webhook, prefix + short), fired,
                         minutes)
        for short, receiver in [*scenario.expected.items(), *((q, "") for q in scenario.quiet)]
    ]  # fmt: skip
    results += _unlisted_results(scenario, webhook, prefix, {r.alert for r in results}, minutes)
    lead, problems = _memory_lead(scenario, webhook, prefix, oom_times, clock)
    return DrillReport(
        scenario.name, scenario.summary, clock.factor, "the first OOM event" if oom_times else "the start of the drill",
        timeline, results, lead, problems,
    )  # fmt: skip


def _values_seen(prometheus: Prometheus, expr: str, start: float, end: float) -> list[float]:
    """Every value a timestamp series took over the drill, each once, in order."""
    return sorted({float(v) for s in prometheus.query_range(expr, start, end, 0.5) for _, v in s["values"]})


def _first_fired(prometheus: Prometheus, start: float, end: float) -> dict[str, float]:
    """Each alert that fired in Prometheus, with the first time it did."""
    fired: dict[str, float] = {}
    for series in prometheus.query_range('ALERTS{alertstate="firing"}', start, end, 0.5):
        name = series["metric"]["alertname"]
        first = float(series["values"][0][0])
        fired[name] = min(first, fired.get(name, first))
    return fired


def _arrived(webhook: WebhookReceiver, alertname: str | None = None) -> list[Notification]:
    """The firing notifications the webhook received (of one alert where named)."""
    return [n for n in webhook.notifications if n.status == "firing" and alertname in (None, n.alertname)]


def _expected_result(
    name: str, receiver: str | None, quiet: bool, arrivals: list[Notification], fired: dict[str, float],
    minutes: Callable[[float], float],
) -> AlertResult:  # fmt: skip
    """One alert the scenario lists: expected at a receiver, firing but routed nowhere (None), delivered or inhibited
    (a receiver ending in ?), or quiet."""
    receivers = sorted({n.receiver for n in arrivals})
    first = min([n.at for n in arrivals] + ([fired[name]] if receiver is None and name in fired else []), default=None)
    if quiet:
        ok = not arrivals and name not in fired
    elif receiver is None:
        ok = name in fired and not arrivals
    elif receiver.endswith("?"):  # delivered there, or inhibited
        ok = name in fired and set(receivers) <= {receiver.rstrip("?")}
    else:
        ok = receivers == [receiver]
    at = None if first is None else minutes(first)
    return AlertResult(name, None if quiet else receiver, quiet, receivers, at, ok)


def _unlisted_results(
    scenario: DrillScenario, webhook: WebhookReceiver, prefix: str, listed: set[str],
    minutes: Callable[[float], float],
) -> list[AlertResult]:  # fmt: skip
    """Every alert that reached a receiver is in the table, listed in the scenario or not: one not listed is
    unexpected, and fails the drill, unless the scenario allows it (a true alarm racing the ones it expects)."""
    results = []
    for name in sorted({n.alertname for n in _arrived(webhook)} - listed):
        arrivals = _arrived(webhook, name)
        allowed = name.removeprefix(prefix) in scenario.may_arrive
        results.append(AlertResult(name, None, False, sorted({n.receiver for n in arrivals}),
                                   minutes(min(n.at for n in arrivals)), allowed, listed=False))  # fmt: skip
    return results


def _memory_lead(
    scenario: DrillScenario, webhook: WebhookReceiver, prefix: str, oom_times: list[float], clock: TimeScale
) -> tuple[float | None, list[str]]:
    """Where the scenario wants a memory alert before its OOM: the lead in simulated minutes, or the problem."""
    if not scenario.memory_alert_before_oom:
        return None, []
    memory = [n.at for n in _arrived(webhook) if n.alertname.removeprefix(prefix) in MEMORY_ALERTS]
    if not oom_times:
        return None, ["no OOM event happened: the scenario did not reach its OOM"]
    if not memory or min(memory) >= oom_times[0]:
        return None, ["no memory alert arrived before the first OOM event"]
    return clock.simulated(oom_times[0] - min(memory)) / 60, []


def run(scenario: DrillScenario, workdir: Path, **kwargs: Any) -> DrillReport:
    """The drill's report; raises MissingPrerequisite, before anything starts, where something is to install."""
    prerequisites(tls=kwargs.get("tls", False))
    try:
        return asyncio.run(run_drill(scenario, workdir, **kwargs))
    except MissingPrerequisite:
        raise
    except ServiceError as exc:
        report = DrillReport(
            scenario.name, scenario.summary, kwargs.get("time_scale", DEFAULT_TIME_SCALE), "-", [], [], None, [str(exc)]
        )
        return report
