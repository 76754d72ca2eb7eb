"""`oomguard diagnose`: arguments in, diagnoses out; exit 0 healthy, 1 a finding, 2 could not run."""

from __future__ import annotations

import argparse
import re
import sys
import time
from datetime import datetime
from pathlib import Path

from oomguard.bundle.thresholds import load_thresholds
from oomguard.common.urls import http_url_argument
from oomguard.diagnose import report
from oomguard.diagnose.clock import clock_of
from oomguard.diagnose.core import default_probe_delay, diagnose_data, exit_status
from oomguard.diagnose.query import DiagnoseError, fetch_exporter, fetch_prometheus
from oomguard.exporter.config import ConfigError

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """Prometheus-style durations: 90s, 30m, 1h30m; a bare number is seconds."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise DiagnoseError(f"--window {text!r}: not a duration; write it like 30m, 1h or 3600")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def parse_time(text: str | None) -> float:
    """Unix seconds, RFC 3339 (2024-05-01T12:00:00Z) or 'now'."""
    if text is None or text == "now":
        return time.time()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise DiagnoseError(
            f"--at {text!r}: not a time; give Unix seconds or RFC 3339 (2024-05-01T12:00:00Z)"
        ) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--prometheus", type=http_url_argument, metavar="URL", help="read the history from this Prometheus (HTTP API)"
    )
    source.add_argument(
        "--exporter", type=http_url_argument, metavar="URL", help="read one oomguard's /metrics now (no history)"
    )
    parser.add_argument("--target", metavar="NAME", help="only this target")
    parser.add_argument("--instance", metavar="INSTANCE", help="only this exporter (its Prometheus instance label)")
    parser.add_argument("--at", metavar="TIME", help="end of the window: Unix seconds or RFC 3339 (default now)")
    parser.add_argument("--window", default="1h", metavar="DURATION", help="history to read (default 1h)")
    parser.add_argument("--json", action="store_true", help="print JSON (a top-level diagnoses list)")
    parser.add_argument("--report", metavar="FILE", help="write an incident report: FILE.md (PNG beside) or FILE.html")
    parser.add_argument(
        "--bundle-config",
        type=Path,
        metavar="BUNDLE.yaml",
        help="the bundle configuration your rules were generated from (oomguard generate --config): diagnose judges "
        "on its thresholds (default the bundle's defaults)",
    )
    parser.add_argument(
        "--probe-delay",
        type=float,
        metavar="SECONDS",
        help="the orchestrator's probe grace (initialDelaySeconds or startup probe budget); "
        "default the bundle's startup_slower_than_probe.probe_initial_delay_seconds",
    )
    parser.add_argument("--max-num-seqs", type=int, metavar="N", help="the engine's max_num_seqs, if known")
    parser.add_argument(
        "--time-scale",
        type=float,
        metavar="X",
        help="for a drill's compressed clock: X simulated seconds per real second (default the bundle "
        "configuration's time_scale, 1); durations are judged and reported in simulated time, --probe-delay is in "
        "simulated seconds, --at and --window are not",
    )
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS", help="per request (default 10)")


def run(args: argparse.Namespace) -> int:
    if args.report:
        # Refused before anything is read or printed: not after a whole diagnosis.
        try:
            report.report_format(Path(args.report))
        except ValueError as exc:
            print(f"oomguard diagnose: {exc}", file=sys.stderr)
            return 2
    try:
        thresholds = load_thresholds(args.bundle_config)
    except ConfigError as exc:
        print(f"oomguard diagnose: --bundle-config: {exc}", file=sys.stderr)
        return 2
    try:
        clock = clock_of(thresholds.time_scale if args.time_scale is None else args.time_scale)
        if args.prometheus:
            end = parse_time(args.at)
            window = parse_duration(args.window)
            data = fetch_prometheus(args.prometheus, start=end - window, end=end, instance=args.instance,
                                    timeout=args.timeout, time_scale=clock.factor)  # fmt: skip
        else:
            data = fetch_exporter(args.exporter, timeout=args.timeout)
    except DiagnoseError as exc:
        print(f"oomguard diagnose: {exc}", file=sys.stderr)
        return 2
    if args.probe_delay is not None:
        probe_delay, probe_source = args.probe_delay, "--probe-delay"
    else:
        probe_delay, probe_source = default_probe_delay(thresholds)
    diagnoses = diagnose_data(data, target=args.target, probe_delay=probe_delay, probe_source=probe_source,
                              max_num_seqs=args.max_num_seqs, time_scale=clock.factor,
                              thresholds=thresholds)  # fmt: skip
    if args.json:
        sys.stdout.write(report.to_json(diagnoses, source=data.source, start=data.start, end=data.end))
    else:
        sys.stdout.write(report.text(diagnoses, data.source))
    if args.report:
        try:
            written = report.write_report(Path(args.report), diagnoses, data.source)
        except (ValueError, OSError) as exc:
            print(f"oomguard diagnose: cannot write the report: {exc}", file=sys.stderr)
            return 2
        print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return exit_status(diagnoses)
