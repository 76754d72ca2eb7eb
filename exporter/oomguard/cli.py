"""Command line: `oomguard serve` (the exporter), `check-config`, `generate` (the rule bundle and dashboards),
`drill`, `diagnose`, `top`, `backtest`, `healthcheck` and `docs`; `oomguard --help` says what each does.

The exporter's flags are spelled as Prometheus exporters spell them; each also reads an
`OOMGUARD_*` environment variable (`_ENVIRONMENT`). Precedence: flag > environment > file > default.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from oomguard import __version__
from oomguard.common.excerpt import excerpt
from oomguard.common.time_scale import factor_argument
from oomguard.common.urls import http_url_argument
from oomguard.drill.scenarios import SCENARIOS as DRILLS
from oomguard.drill.scenarios import find as find_drill
from oomguard.exporter.config import ConfigError, parse_listen_address
from oomguard.simulate.checks import load_config
from oomguard.simulate.scenarios import ALIASES as SIMULATION_ALIASES
from oomguard.simulate.scenarios import NAMES as SIMULATIONS
from oomguard.simulate.scenarios import ON_ENGINE, SIMULATION_ONLY

log = logging.getLogger("oomguard")

# flag dest -> (environment variable, dotted config key or None for CLI-only settings)
_ENVIRONMENT = {
    "config": ("OOMGUARD_CONFIG", None),
    "listen_address": ("OOMGUARD_WEB_LISTEN_ADDRESS", "web.listen_address"),
    "web_config_file": ("OOMGUARD_WEB_CONFIG_FILE", None),
    "simulate": ("OOMGUARD_SIMULATE", "simulation.scenario"),
    "simulate_gpus": ("OOMGUARD_SIMULATE_GPUS", "simulation.gpus"),
    "simulate_time_scale": ("OOMGUARD_SIMULATE_TIME_SCALE", "simulation.time_scale"),
    "simulate_gpu_source": ("OOMGUARD_SIMULATE_GPU_SOURCE", "simulation.gpu_source"),
    "nvml": ("OOMGUARD_COLLECTOR_NVML", "nvml.enabled"),
    "shards": ("OOMGUARD_KUBERNETES_SHARDS", "kubernetes.shards"),
    "shard": ("OOMGUARD_KUBERNETES_SHARD", "kubernetes.shard"),
    "log_level": ("OOMGUARD_LOG_LEVEL", None),
}


class _CommandParser(argparse.ArgumentParser):
    """A command's parser (`oomguard serve`...): a flag it does not know is its own error, with its own usage and
    the flag meant. argparse leaves a command's unknown arguments to the top-level parser, whose usage lists the
    commands and names no flag of any."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._meant(extras)}")
        return namespace, extras

    def _meant(self, extras: list[str]) -> str:
        flags = [flag for action in self._actions for flag in action.option_strings if flag.startswith("--")]
        for arg in extras:
            name = arg.split("=", 1)[0]
            if name.startswith("--") and len(name) <= 100:
                close = difflib.get_close_matches(name, flags, n=1, cutoff=0.7)
                if close:
                    return f"; did you mean {close[0]}?"
        return ""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oomguard", description="GPU memory and inference-engine exporter for Prometheus."
    )
    parser.add_argument("--version", action="version", version=f"oomguard {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_CommandParser)

    serve = commands.add_parser("serve", help="run the exporter")
    serve.add_argument("--config", metavar="FILE", help="YAML configuration [$OOMGUARD_CONFIG]")
    serve.add_argument(
        "--web.listen-address",
        dest="listen_address",
        metavar="HOST:PORT",
        help="address to serve on [$OOMGUARD_WEB_LISTEN_ADDRESS] (default :9847)",
    )
    serve.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help="TLS, client certificates, basic auth and headers, in the Prometheus exporter toolkit's "
        "format; re-read when it changes (docs/security.md) [$OOMGUARD_WEB_CONFIG_FILE]",
    )
    serve.add_argument(
        "--simulate",
        metavar="SCENARIO",
        help="run on a built-in simulation of GPUs and an engine (vLLM unless the name says another): "
        + ", ".join(SIMULATIONS)
        + f" (the drill's names; {', '.join(SIMULATION_ONLY)} is the simulation's alone; "
        + ", ".join(f"{name} on the {engine} simulator" for name, (_, engine) in ON_ENGINE.items())
        + f"; the old {', '.join(SIMULATION_ALIASES)} still work) [$OOMGUARD_SIMULATE]",
    )
    serve.add_argument(
        "--simulate.gpus",
        dest="simulate_gpus",
        type=int,
        metavar="N",
        help="simulated GPUs [$OOMGUARD_SIMULATE_GPUS] (default 1)",
    )
    serve.add_argument(
        "--simulate.time-scale",
        dest="simulate_time_scale",
        type=float,
        metavar="X",
        help="simulated seconds per real second [$OOMGUARD_SIMULATE_TIME_SCALE] (default 1)",
    )
    serve.add_argument(
        "--simulate.gpu-source",
        dest="simulate_gpu_source",
        choices=["nvml", "dcgm"],
        help="the simulated GPUs through a fake NVML, as a node agent reads them, or through a simulated "
        "dcgm-exporter, as the cluster mode does [$OOMGUARD_SIMULATE_GPU_SOURCE] (default nvml)",
    )
    serve.add_argument(
        "--collector.nvml",
        dest="nvml",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="read GPUs through NVML [$OOMGUARD_COLLECTOR_NVML] (default on)",
    )
    serve.add_argument(
        "--kubernetes.shards",
        dest="shards",
        type=int,
        metavar="N",
        help="the cluster mode split over N exporters, each reading the nodes whose name hashes to its shard "
        "[$OOMGUARD_KUBERNETES_SHARDS] (default 1)",
    )
    serve.add_argument(
        "--kubernetes.shard",
        dest="shard",
        type=int,
        metavar="K",
        help="this exporter's shard, 0 to N-1 [$OOMGUARD_KUBERNETES_SHARD] (default: the ordinal ending $POD_NAME)",
    )
    serve.add_argument(
        "--log.level",
        dest="log_level",
        choices=["debug", "info", "warning", "error"],
        help="[$OOMGUARD_LOG_LEVEL] (default info)",
    )

    check = commands.add_parser("check-config", help="validate a configuration file and exit")
    check.add_argument("file", type=Path, help="the YAML configuration to check, as `serve --config FILE` reads it")

    generate = commands.add_parser("generate", help="write the alert and recording rules (and dashboards)")
    generate.add_argument(
        "--config", type=Path, metavar="BUNDLE.yaml", help="bundle configuration overriding the defaults"
    )
    generate.add_argument("--output", type=Path, default=Path("."), metavar="DIR", help="writes DIR/rules/ (default .)")
    generate.add_argument("--print-defaults", action="store_true", help="print the full default bundle configuration")

    drill = commands.add_parser("drill", help="replay a scenario through a real Prometheus and Alertmanager")
    drill.add_argument(
        "--scenario", metavar="SCENARIO", help=", ".join(DRILLS) + " (see --list; serve --simulate's names)"
    )
    drill.add_argument("--list", action="store_true", help="list the scenarios")
    drill.add_argument("--report", type=Path, metavar="FILE", help="also write the report to FILE")
    drill.add_argument("--json", action="store_true", help="report as JSON instead of Markdown")
    drill.add_argument(
        "--diagnosis-report",
        type=Path,
        metavar="FILE",
        help="also write oomguard diagnose's incident report of the drill: FILE.md (PNG beside) or FILE.html",
    )
    drill.add_argument(
        "--time-scale",
        type=factor_argument,
        default=30.0,
        metavar="X",
        help="simulated seconds per real second (default 30)",
    )
    drill.add_argument(
        "--mode",
        choices=["node", "cluster"],
        default="node",
        help="node: the exporter reads the GPUs through NVML, as the DaemonSet does; cluster: through a simulated "
        "dcgm-exporter beside the engine, as the cluster mode does, without per-process memory (default node)",
    )
    drill.add_argument(
        "--alertmanager-config",
        type=Path,
        metavar="FILE",
        help="routing to test (default the example shipped with oomguard: deploy/alertmanager/alertmanager.yml)",
    )
    drill.add_argument(
        "--workdir", type=Path, metavar="DIR", help="keep configs and logs here (default a temporary folder)"
    )
    drill.add_argument(
        "--tls",
        action="store_true",
        help="the exporter and Alertmanager serve https with basic auth (a throwaway CA and password, "
        "--web.config.file), and Prometheus scrapes with tls_config and basic_auth (docs/security.md)",
    )
    drill.add_argument(
        "--check",
        type=http_url_argument,
        metavar="PROMETHEUS_URL",
        help="instead of a scenario: will this deployment page? The bundle's rules loaded, the exporter scraped "
        "under the job they select and up, its targets up, every alert's inputs where they should be (exit 1 on a gap)",
    )
    drill.add_argument(
        "--alertmanager",
        type=http_url_argument,
        metavar="ALERTMANAGER_URL",
        help="with --check: also read this Alertmanager's routing: where each severity goes, and whether critical "
        "reaches a receiver that sends somewhere",
    )

    diagnose = commands.add_parser(
        "diagnose", help="the postmortem's diagnostic order: a verdict, its evidence and the settings to change"
    )
    from oomguard.diagnose.command import add_arguments as diagnose_arguments

    diagnose_arguments(diagnose)

    top = commands.add_parser(
        "top", help="the joined view (memory against the reservation, trend, KV cache, queue, OOMs) in a terminal"
    )
    from oomguard.exporter.status.top import add_arguments as top_arguments

    top_arguments(top)

    backtest = commands.add_parser(
        "backtest", help="would the alerts have paged before past OOMs, how early, how often for nothing (a history)"
    )
    from oomguard.backtest.command import add_arguments as backtest_arguments

    backtest_arguments(backtest)

    health = commands.add_parser(
        "healthcheck", help="exit 0 when the exporter on this host answers /-/healthy (the image's HEALTHCHECK)"
    )
    health.add_argument(
        "--web.listen-address",
        dest="listen_address",
        metavar="HOST:PORT",
        help="[$OOMGUARD_WEB_LISTEN_ADDRESS] (default: the configuration's, else :9847)",
    )
    health.add_argument(
        "--config", metavar="FILE", help="the server's configuration, for its address [$OOMGUARD_CONFIG]"
    )
    health.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help="the server's web configuration, https or not [$OOMGUARD_WEB_CONFIG_FILE] (default: http, then https)",
    )

    docs = commands.add_parser("docs", help="print docs/metrics.md, generated from the metric table")
    docs.add_argument("--output", type=Path, help="write to this file instead of stdout")
    # Each `oomguard COMMAND --help` begins with what the command does: the line `oomguard --help` gives it.
    for action in commands._choices_actions:
        page = commands.choices[action.dest]
        page.description = page.description or action.help
    return parser


def _from_environment(args: argparse.Namespace) -> dict[str, str]:
    """Each setting no flag gave, from its OOMGUARD_* variable; returns dotted key -> `$VARIABLE=value` for those
    it set, so that an error names the variable to fix rather than a key of no file."""
    origins = {}
    for dest, (variable, key) in _ENVIRONMENT.items():
        if getattr(args, dest, None) is None and variable in os.environ:
            value: Any = os.environ[variable]
            if key is not None:
                origins[key] = f"${variable}={excerpt(value)}"
            if dest == "nvml":
                value = value.strip().lower() in ("1", "true", "yes", "on")
            setattr(args, dest, value)
    return origins


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        key: getattr(args, dest)
        for dest, (_, key) in _ENVIRONMENT.items()
        if key is not None and getattr(args, dest, None) is not None
    }


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "docs":
        from oomguard.exporter.docs import metrics_markdown

        text = metrics_markdown()
        if args.output:
            args.output.write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
        return 0
    if args.command == "generate":
        return _generate(args)
    if args.command == "drill":
        return _drill(args)
    if args.command == "diagnose":
        from oomguard.diagnose.command import run as diagnose

        return diagnose(args)
    if args.command == "top":
        from oomguard.exporter.status.top import main as top

        return top(args)
    if args.command == "backtest":
        from oomguard.backtest.command import run as backtest

        return backtest(args)
    if args.command == "healthcheck":
        from oomguard.exporter.healthcheck import main as healthcheck

        return healthcheck(args.listen_address, args.config, args.web_config_file, load=load_config)
    if args.command == "check-config":
        try:
            config = load_config(args.file)
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            return 1
        from oomguard.exporter.describe import describe, warnings

        print(f"{args.file}: valid. It will watch:")
        for line in describe(config):
            print(f"  {line}")
        for line in warnings(config):
            print(line)
        return 0

    origins = _from_environment(args)
    logging.basicConfig(
        level=(args.log_level or "info").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(Path(args.config) if args.config else None, _overrides(args), origins)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    return serve(config, Path(args.web_config_file) if args.web_config_file else None)


def _drill(args: argparse.Namespace) -> int:
    if args.list:
        from oomguard.drill.run import expected_seconds

        for scenario in DRILLS.values():
            took = expected_seconds(scenario, args.time_scale)
            print(f"{scenario.name} ({scenario.minutes:g} simulated minutes, about {took:.0f} s at "
                  f"{args.time_scale:g}x): {scenario.summary}")  # fmt: skip
        return 0
    if args.check:
        from oomguard.bundle.bundle_config import load_bundle_config
        from oomguard.drill.check import CheckError, check_deployment

        try:
            checked = check_deployment(args.check, load_bundle_config(), alertmanager_url=args.alertmanager)
        except CheckError as exc:  # nothing was checked: "could not run", as diagnose says it
            print(f"oomguard drill: {exc}", file=sys.stderr)
            return 2
        sys.stdout.write(checked.text())
        return 0 if checked.ok else 1
    if args.scenario is None:
        print(f"choose a scenario with --scenario: {', '.join(DRILLS)} (or --list, or --check URL)", file=sys.stderr)
        return 2
    try:
        scenario = find_drill(args.scenario)
        if args.alertmanager_config is not None:
            from oomguard.drill.run import read_routing

            read_routing(args.alertmanager_config)  # refused here, in a line, before anything starts
    except ValueError as exc:
        print(f"oomguard drill: {exc}", file=sys.stderr)
        return 2
    import time

    from oomguard.drill.run import run
    from oomguard.drill.services import MissingPrerequisite

    # The drill's targets are refused and die on purpose: only errors are worth a line.
    logging.basicConfig(level="ERROR", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    began = time.monotonic()

    def progress(line: str) -> None:  # on stderr: stdout is the report's, for a pipe or --json
        print(f"[{time.monotonic() - began:4.0f} s] {line}", file=sys.stderr, flush=True)

    try:
        with tempfile.TemporaryDirectory(prefix="oomguard-drill-") as scratch:
            report = run(
                scenario, args.workdir or Path(scratch), time_scale=args.time_scale,
                alertmanager_config=args.alertmanager_config, diagnosis_report=args.diagnosis_report, tls=args.tls,
                mode=args.mode, progress=progress,
            )  # fmt: skip
    except MissingPrerequisite as exc:
        print(f"oomguard drill: {exc}", file=sys.stderr)
        return 1
    text = report.json() if args.json else report.markdown()
    sys.stdout.write(text)
    if args.report:
        args.report.write_text(text)
    return 0 if report.ok else 1


def _generate(args: argparse.Namespace) -> int:
    from oomguard.bundle.bundle_config import defaults_text, load_bundle_config
    from oomguard.bundle.generate import write

    if args.print_defaults:
        sys.stdout.write(defaults_text())
        return 0
    try:
        bundle = load_bundle_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    for path in write(bundle, args.output):
        print(f"wrote {path}")
    return 0


def pages_hint(simulation: str, engine: str = "vllm") -> str:
    """Said once by `serve --simulate`: the exporter shows the figures; the drill shows what pages, and when."""
    drill = next((name for name, d in DRILLS.items() if (d.simulation, d.engine) == (simulation, engine)), None)
    how = f"oomguard drill --scenario {drill}" if drill else "oomguard drill --list"
    return (
        f"this exporter shows the simulation's figures; to see what pages, and when, run `{how}` "
        "(a real Prometheus and Alertmanager with the shipped rules, on the same scenario)"
    )


def serve(config: Any, web_config_file: Path | None = None) -> int:
    from oomguard.bundle.thresholds import default_thresholds
    from oomguard.common import descriptors
    from oomguard.exporter.runtime import Runtime
    from oomguard.exporter.web import make_app
    from oomguard.exporter.web_config import WebConfigState, load_web_config
    from oomguard.exporter.web_config.server import run
    from oomguard.simulate.host import SimulatedHost

    web_config = None
    if web_config_file is not None:
        try:
            web_config = WebConfigState(load_web_config(web_config_file))
        except ConfigError as exc:  # a bad file at start stops here; on reload the last good one stays
            print(exc, file=sys.stderr)
            return 1
        except Exception as exc:  # whatever else the file does: one line, not a traceback
            print(f"{web_config_file}: cannot load the web configuration: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    if (raised := descriptors.raise_soft_limit()) is not None:
        log.info("file descriptors: the soft limit raised from %d to the hard limit, %d", *raised)
    # The composition: the simulation `simulation:` names, if any, and the bundle's thresholds for the status page.
    simulated = SimulatedHost(config) if config.simulation.scenario else None
    runtime = Runtime(config, simulated=simulated, thresholds=default_thresholds())
    host, port = parse_listen_address(config.web.listen_address)
    # "serving ... on HOST:PORT" follows once the port is bound; a port in use is one error line, nothing started.
    log.info("oomguard %s starting on %s:%d, %d target(s)", __version__, host, port, len(runtime.config.targets))
    if simulated is not None:
        log.info("%s", pages_hint(simulated.engine.scenario.name, simulated.engine.engine))
    # One listener for both: the connection limit and the header timeout hold without a web configuration too.
    return run(make_app(runtime, web_config), host, port, web_config)
