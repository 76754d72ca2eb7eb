"""`oomguard backtest`: arguments in, a report out; exit 0 when it ran, 2 when it could not (the message says why
and what to do), never a traceback for bad input.

SIGTERM (a service manager's stop, `kill`) and SIGINT (^C) stop it the way an error does: raised where it is, so
that the Prometheus and promtool it started are stopped and its temporary folder removed on the way out (SIGTERM's
default action ended the process at once and left them behind); then one line, and 128 + the signal's number.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from oomguard.backtest import BacktestError
from oomguard.backtest.history import parse_duration, parse_time
from oomguard.backtest.regular import MAX_YAML_BYTES, check_regular
from oomguard.common.urls import http_url_argument
from oomguard.exporter.config import ConfigError

DEFAULT_EVALUATION = "30s"
DEFAULT_BEFORE = "60m"
DEFAULT_AFTER = "30m"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--history", type=Path, metavar="FILE",
        help="the history as a file: CSV with a header, or JSON lines (.gz too); docs/backtest.md, \"File\"",
    )  # fmt: skip
    source.add_argument(
        "--prometheus", type=http_url_argument, metavar="URL", help="read the history from this Prometheus (HTTP API)"
    )
    parser.add_argument("--start", metavar="TIME", help="with --prometheus: the window's start (Unix or RFC 3339)")
    parser.add_argument("--end", metavar="TIME", help="with --prometheus: the window's end (default now)")
    parser.add_argument(
        "--step", default="15s", metavar="DURATION",
        help="with --prometheus: the history's resolution, the replay's sample interval (default 15s)",
    )  # fmt: skip
    parser.add_argument(
        "--preset", default="dcgm", choices=("dcgm", "nvidia_gpu_exporter", "oomguard"),
        help="with --prometheus: whose series to read (default dcgm: dcgm-exporter's, with vLLM's own)",
    )  # fmt: skip
    parser.add_argument(
        "--mapping", type=Path, metavar="FILE",
        help="with --prometheus: a YAML file of queries that override the preset's (docs/backtest.md, \"Mapping\")",
    )  # fmt: skip
    parser.add_argument("--timeout", default="30s", metavar="DURATION", help="with --prometheus: per request")
    parser.add_argument(
        "--ooms", type=Path, metavar="FILE",
        help="the OOMs: a time a line (Unix or RFC 3339), optionally gpu=, node=, target=; default with "
        "--prometheus: oomguard's own OOM events where it ran",
    )  # fmt: skip
    parser.add_argument(
        "--bundle-config", type=Path, metavar="BUNDLE.yaml",
        help="the bundle configuration your rules are generated from (oomguard generate --config); default the "
        "bundle's defaults",
    )  # fmt: skip
    parser.add_argument(
        "--config", type=Path, metavar="FILE",
        help="the exporter's configuration, for its trend: section (default the exporter's defaults)",
    )  # fmt: skip
    parser.add_argument(
        "--evaluation-interval", default=DEFAULT_EVALUATION, metavar="DURATION",
        help=f"your Prometheus' evaluation_interval (default {DEFAULT_EVALUATION}); a rule group's own interval wins",
    )  # fmt: skip
    parser.add_argument(
        "--gpu-memory-utilization", type=float, metavar="RATIO",
        help="the reservation of every engine whose history does not give its own (vLLM's default is 0.9)",
    )  # fmt: skip
    parser.add_argument(
        "--incident-before", default=DEFAULT_BEFORE, metavar="DURATION",
        help=f"an incident starts this long before its OOM (default {DEFAULT_BEFORE})",
    )  # fmt: skip
    parser.add_argument(
        "--incident-after", default=DEFAULT_AFTER, metavar="DURATION",
        help=f"and ends this long after it (default {DEFAULT_AFTER})",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--plot", type=Path, metavar="DIR", help="a PNG per OOM in DIR (the report extra)")
    parser.add_argument(
        "--sweep", action="store_true", help="try the memory alerts' thresholds and windows over a small grid"
    )
    parser.add_argument("--keep-tsdb", type=Path, metavar="DIR", help="keep the replayed series' TSDB in DIR/data")
    parser.add_argument(
        "--jobs", type=int, metavar="N",
        help="replay on N processes (default: the CPUs, at most 4, for a long history; 1 for a short one)",
    )  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(BaseException):
    """A stop signal, raised where the command is (a BaseException: no `except Exception` on the way swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, _: FrameType | None) -> None:
    # The way out stops what was started (Prometheus' stop waits 10 s at most, then kills): a second signal does not
    # cut it short and leave them behind.
    for other in STOP_SIGNALS:
        signal.signal(other, signal.SIG_IGN)
    tsdb = sys.modules.get("oomguard.backtest.tsdb")  # imported once the run needs a Prometheus
    if tsdb is not None:
        tsdb.Prometheus.end_all()
    raise Stopped(signum)


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    try:
        held = {signum: signal.signal(signum, _stop) for signum in STOP_SIGNALS}
    except ValueError:  # not the main thread (a test's): signals are not this call's to take
        yield
        return
    try:
        yield
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)


def run(args: argparse.Namespace) -> int:
    with _stopped_by_signals():
        try:
            report = _run(args)
        except (BacktestError, ConfigError) as exc:
            print(f"oomguard backtest: {exc}", file=sys.stderr)
            return 2
        except Stopped as stop:
            name = signal.Signals(stop.signum).name
            print(f"oomguard backtest: stopped by {name}: its Prometheus and promtool stopped, its temporary folder "
                  "removed", file=sys.stderr)  # fmt: skip
            return 128 + stop.signum
        except KeyboardInterrupt:  # SIGINT where its handler was not this command's
            print("oomguard backtest: interrupted (SIGINT)", file=sys.stderr)
            return 130
    sys.stdout.write(report.json() + "\n" if args.json else report.text())
    return 0


def _run(args: argparse.Namespace):  # -> Report
    from oomguard.backtest.ooms import read_ooms
    from oomguard.backtest.report import Window
    from oomguard.backtest.run import Options, backtest, quiet
    from oomguard.bundle.bundle_config import load_bundle_config

    def said(line: str) -> None:
        print(f"backtest: {line}", file=sys.stderr, flush=True)

    progress = quiet if args.quiet else said

    if args.bundle_config is not None:  # a FIFO, /dev/zero or a huge file: refused before it is read
        check_regular(args.bundle_config, "bundle configuration", MAX_YAML_BYTES)
    bundle = load_bundle_config(args.bundle_config)
    utilization = args.gpu_memory_utilization
    if utilization is not None and not (0 < utilization <= 1 and math.isfinite(utilization)):
        raise BacktestError(f"--gpu-memory-utilization {utilization:g}: a share of the GPU, above 0 and at most 1")
    evaluation = parse_duration(args.evaluation_interval, "--evaluation-interval")
    if evaluation < 1:
        raise BacktestError("--evaluation-interval: at least 1s")
    window = Window(_incident(args.incident_before, "--incident-before"),
                    _incident(args.incident_after, "--incident-after"))  # fmt: skip
    options = Options(
        bundle=bundle,
        bundle_name=str(args.bundle_config) if args.bundle_config else "the bundle's defaults",
        trend=_trend(args.config),
        evaluation_interval=evaluation,
        window=window,
        gpu_memory_utilization=utilization,
        sweep=args.sweep,
        plot=args.plot,
        keep=args.keep_tsdb,
        jobs=args.jobs,
    )
    if args.jobs is not None and args.jobs < 1:
        raise BacktestError("--jobs: at least 1")
    ooms = read_ooms(args.ooms) if args.ooms else None
    if args.history is not None:
        from oomguard.backtest.files import FileHistory

        for flag in ("start", "end", "mapping"):
            if getattr(args, flag) is not None:
                raise BacktestError(f"--{flag} is for --prometheus; a history file is read whole")
        history = FileHistory(args.history, evaluation_interval=evaluation)
        return backtest(history, str(args.history), options, ooms=ooms, progress=progress)
    from oomguard.backtest.source import PrometheusHistory, load_mapping

    if args.start is None:
        raise BacktestError("--prometheus needs --start (and --end, default now): the window to backtest")
    start = parse_time(args.start, "--start")
    end = parse_time(args.end, "--end") if args.end is not None else _now()
    step = parse_duration(args.step, "--step")
    mapping = load_mapping(args.preset, args.mapping)
    history = PrometheusHistory(
        args.prometheus, mapping, start=start, end=end, step=step, timeout=parse_duration(args.timeout, "--timeout")
    )
    return backtest(history, history.describe(), options, ooms=ooms, ooms_from=history.ooms, progress=progress)


# An incident is hours around its OOM; --plot reads each one's memory over it (a span of 1e300 s was a loop
# without end).
MAX_INCIDENT_SECONDS = 7 * 86400


def _incident(text: str, flag: str) -> float:
    seconds = parse_duration(text, flag)
    if seconds > MAX_INCIDENT_SECONDS:
        raise BacktestError(f"{flag} {text}: at most 7d (an incident is hours around its OOM; the default is "
                            f"{DEFAULT_BEFORE if flag == '--incident-before' else DEFAULT_AFTER})")  # fmt: skip
    return seconds


def _now() -> float:
    import time

    return time.time()


def _trend(path: Path | None):  # -> TrendSettings

    if path is None:
        from oomguard.exporter.config import TrendConfig

        return TrendConfig().settings()
    from oomguard.simulate.checks import load_config  # serve's reading: a file it refuses is refused here too

    check_regular(path, "configuration", MAX_YAML_BYTES)
    return load_config(path).trend.settings()
