"""`oomguard top`: the status page's view in a terminal, from a local or remote exporter (its /status.json).

Beside `nvidia-smi` (a GPU's memory and processes) and `nvtop` (their history), this shows what neither knows: each
GPU's memory against the engines' reservation, its trend and time to full, each engine's KV cache and queue, its last
OOM and restart, and which pages' conditions hold now. `--once` prints one frame and exits (a script's, a ticket's).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import functools
import ipaddress
import json
import math
import os
import shutil
import ssl
import sys
import time
import types
import typing
import urllib.parse
from pathlib import Path
from typing import Any

from oomguard.common.excerpt import excerpt
from oomguard.common.visible import visible
from oomguard.exporter.status.fetch import FetchError, get, tls_context
from oomguard.exporter.status.page import human_bytes, pct
from oomguard.exporter.status.view import StatusView, duration

# The largest view made (64 GPUs with their 60-point sparklines, 64 targets of Kubernetes' longest names on 16 GPUs
# each, 256 conditions) is 345 KB: more is no exporter's answer, and the bound keeps what parsing holds to tens of MB.
MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_ROWS = 64  # GPUs, targets and conditions shown, each: a frame stays a screen, whatever the answer holds
MAX_WIDTH = 1000  # columns, whatever the terminal (or $COLUMNS) says
SPARKS = "▁▂▃▄▅▆▇█"
CLEAR = "\x1b[H\x1b[2J"


class TopError(Exception):
    """A failure with its fix, said in one line (exit code 2)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", nargs="?", default="http://127.0.0.1:9847",
                        help="the exporter's address (default: http://127.0.0.1:9847)")  # fmt: skip
    parser.add_argument("--once", action="store_true", help="print one frame to stdout and exit")
    parser.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help="refresh period (default 2)")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="for each fetch, connection to last byte (default 10)")  # fmt: skip
    parser.add_argument("--username", help="basic auth user (the exporter's --web.config.file basic_auth_users)")
    parser.add_argument("--password-file", type=Path, metavar="FILE",
                        help="basic auth password, read from this file [$OOMGUARD_TOP_PASSWORD]")  # fmt: skip
    parser.add_argument("--ca-file", type=Path, metavar="FILE", help="CA certificate(s) to verify an https exporter")
    parser.add_argument("--cert-file", type=Path, metavar="FILE", help="client certificate (mutual TLS)")
    parser.add_argument("--key-file", type=Path, metavar="FILE", help="its key")
    parser.add_argument("--insecure-skip-verify", action="store_true", help="do not verify the server certificate")


def main(args: argparse.Namespace) -> int:
    try:
        url, headers = _request(args)
        context = _tls(args)
        if args.once:
            print(frame(fetch(url, headers, context, args.timeout), _columns()))
            return 0
        while True:
            try:
                text = frame(fetch(url, headers, context, args.timeout), _columns())
            except TopError as exc:
                text = f"oomguard top: {_said(exc)} (retrying every {args.interval:g}s; Ctrl-C quits)"
            sys.stdout.write(CLEAR + text + "\n")
            sys.stdout.flush()
            time.sleep(args.interval)
    except TopError as exc:
        print(f"oomguard top: {_said(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


def _said(exc: Exception) -> str:
    """An error's one line: what a server sent in it (a header, a reason) escaped and cut."""
    return visible(excerpt(str(exc), 400))


def _columns() -> int:
    return shutil.get_terminal_size((120, 40)).columns


def _request(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    """The status document's URL and the request's headers; warns (stderr) before a password goes in clear text."""
    base = args.url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise TopError(f"{args.url!r} is not an http(s) URL; write the exporter's address, e.g. http://host:9847")
    url = base.removesuffix("/metrics").removesuffix("/status.json") + "/status.json"
    headers = {"Accept": "application/json"}
    password = os.environ.get("OOMGUARD_TOP_PASSWORD")
    if args.password_file is not None:
        try:
            password = args.password_file.read_text().rstrip("\n")
        except OSError as exc:
            raise TopError(f"cannot read --password-file {args.password_file}: {exc.strerror}") from None
    if args.username is not None:
        token = base64.b64encode(f"{args.username}:{password or ''}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
        if url.startswith("http://") and not _loopback(url):
            print(f"oomguard top: warning: basic auth over plain http: the password goes to {visible(url)} in clear "
                  "text; serve the exporter over TLS (--web.config.file) and give its https:// address",
                  file=sys.stderr)  # fmt: skip
    elif password is not None:
        raise TopError("a password without --username: give the user too")
    return url, headers


def _loopback(url: str) -> bool:
    """Whether `url` names this host (a password sent there crosses no network)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    if not args.url.startswith("https://"):
        return None
    try:
        context = ssl.create_default_context(cafile=str(args.ca_file) if args.ca_file else None)
        if args.cert_file is not None:
            context.load_cert_chain(str(args.cert_file), str(args.key_file) if args.key_file else None)
    except (OSError, ssl.SSLError) as exc:
        raise TopError(f"cannot load the TLS files ({exc}); check --ca-file, --cert-file and --key-file") from None
    if args.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return tls_context(context)


def fetch(url: str, headers: dict[str, str], context: ssl.SSLContext | None, timeout: float) -> dict[str, Any]:
    """The status document at `url`: fetched (fetch.py: one deadline, no redirect, the body capped) and checked to be
    one, field by field; TopError otherwise."""
    try:
        body = get(url, headers, context, timeout, MAX_BODY_BYTES)
    except FetchError as exc:
        raise TopError(str(exc)) from None
    try:
        view = json.loads(body)
        check(view, StatusView)
    except RecursionError:
        raise TopError(f"{url} did not answer oomguard's status JSON (nested too deep); is it oomguard?") from None
    except ValueError as exc:  # JSON's errors, the check's, text that is not UTF-8
        raise TopError(f"{url} did not answer oomguard's status JSON ({exc}); is it oomguard?") from None
    return typing.cast(dict[str, Any], view)


@functools.cache
def _hints(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind)


def check(value: object, kind: Any, where: str = "") -> None:
    """That `value` (JSON) is of `kind`, a type of view.py's (a dataclass, list[...], dict[str, ...], X | None, str,
    float, int, bool): raises ValueError naming the first field that is not, by its path (`targets[3].name`). A
    field with a default may be missing (an older exporter's); an unknown field is passed over (a newer one's)."""
    if dataclasses.is_dataclass(kind):
        _check_fields(value, kind, where)
        return
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return
        (kind,) = [a for a in args if a is not type(None)]
        origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is list or origin is dict:
        _check_items(value, origin, args, where)
    else:
        _check_scalar(value, kind, where)


def _check_fields(value: object, kind: Any, where: str) -> None:
    """A dataclass's object: each field present checked; a field without a default missing is the error."""
    if not isinstance(value, dict):
        raise ValueError(f"{where or 'the document'}: not an object")
    hints = _hints(kind)
    for f in dataclasses.fields(kind):
        path = f"{where}.{f.name}" if where else f.name
        if f.name in value:
            check(value[f.name], hints[f.name], path)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{path}: missing")


def _check_items(value: object, origin: type, args: tuple[Any, ...], where: str) -> None:
    """A list's items, or a dict's values, each of its kind."""
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{where}: not a list")
        for i, item in enumerate(value):
            check(item, args[0], f"{where}[{i}]")
        return
    if not isinstance(value, dict):
        raise ValueError(f"{where}: not an object")
    for key, item in value.items():
        check(item, args[1], f"{where}[{json.dumps(key)[:40]}]")


def _check_scalar(value: object, kind: Any, where: str) -> None:
    if kind is bool or kind is str:
        if not isinstance(value, kind):
            raise ValueError(f"{where}: not a {'string' if kind is str else 'boolean'}")
    elif kind is float or kind is int:
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
            raise ValueError(f"{where}: not {'a number' if kind is float else 'an integer'}")
    else:
        raise TypeError(f"{where}: no check for {kind}")  # a field of a type added to view.py: add it here


def frame(view: dict[str, Any], width: int = 120) -> str:
    """One screen of the view (a status document, `check`ed), `width` columns wide at most, at most MAX_ROWS GPUs,
    targets and conditions with a line for those left out. Every string of the document is shown with its control
    characters escaped (`_text`): a name is never a terminal's command."""
    width = max(60, min(width, MAX_WIDTH))
    now = _finite(view.get("taken_at"), time.time())
    lines = [f"oomguard top  {_clock(now)}  thresholds: {_text(view.get('thresholds', ''), width)}", ""]
    lines += _holding_lines(view, width)
    lines += _gpu_lines(view, width)
    lines += _target_lines(view, now)
    sources = view.get("sources") or {}
    failing = [name for name, ok in sources.items() if not ok]
    lines += ["", "sources: " + ("all ok" if not failing else "FAILING: " + _names(failing, width))]
    return "\n".join(visible(line)[:width] for line in lines)  # visible(): the frame's own text, escaped again


def _holding_lines(view: dict[str, Any], width: int) -> list[str]:
    """The pages' and tickets' conditions that hold now."""
    holding = view.get("holding") or []
    lines = ["HOLDING NOW" if holding else "holding now: none (no memory page, no OOM or restart storm)"]
    for h in holding[:MAX_ROWS]:
        lines.append(f"  {'PAGE  ' if h['severity'] == 'critical' else 'ticket'} {_text(h['alert'], width)}  "
                     f"{_text(h['subject'], width)}: {_text(h['why'], width)}")  # fmt: skip
    return lines + _left_out(len(holding) - MAX_ROWS, "conditions")


def _gpu_lines(view: dict[str, Any], width: int) -> list[str]:
    """A line per GPU (the fullest first), with its targets below it."""
    lines = [
        "",
        "GPU          used                 headroom  trend       full in   bar (R reserved, # beyond, . free)",
    ]
    bar_width = max(10, min(40, width - 80))
    gpus = view.get("gpus") or []
    for g in gpus[:MAX_ROWS]:
        total, used = g.get("total_bytes") or 0.0, g.get("used_bytes")
        name = _text(f"{g['gpu']}@{g['node']}" if g.get("node") else g["gpu"], 12)
        used_text = f"{human_bytes(used)}/{human_bytes(total)}" if total else "-"
        to_full = duration(g["seconds_to_full"]) if g.get("seconds_to_full") is not None else "-"
        lines.append(f"{name:<12} {used_text[:20]:<20} {pct(g.get('headroom_used'))[:8]:>8}  "
                     f"{_text(g.get('trend') or '?', 10):<10}  {to_full[:7]:>7}   {_bar(g, bar_width)} "
                     f"{_spark(g.get('spark') or [])}")  # fmt: skip
        if g.get("targets"):
            lines.append(f"{'':12}   {_names(g['targets'], width)}")
    return lines + _left_out(len(gpus) - MAX_ROWS + (view.get("hidden_gpus") or 0), "GPUs", " (the fullest are shown)")


def _target_lines(view: dict[str, Any], now: float) -> list[str]:
    """A line per target: its state, KV cache, queue, last OOM, restarts and startup against its probe's grace."""
    lines = ["", "TARGET                     state    KV cache  wait/run   last OOM          restarts  startup/grace"]
    targets = view.get("targets") or []
    for t in targets[:MAX_ROWS]:
        at = t.get("last_oom_at")
        oom = f"{_text(t.get('last_oom_kind', ''), 16)} {duration(now - at)} ago" if at else "none"
        startup = duration(t["startup_seconds"]) if t.get("startup_seconds") is not None else "-"
        grace = duration(t["probe_grace_seconds"]) if t.get("probe_grace_seconds") is not None else "-"
        queue = f"{_n(t.get('waiting'))}/{_n(t.get('running'))}"
        lines.append(f"{_text(t['name'], 26):<26} {_text(t.get('state') or '?', 8):<8} {pct(t.get('kv_cache'))[:8]:>8}"
                     f"  {queue[:9]:<9}  {oom[:16]:<16}  {_n(t.get('restarts', 0))[:8]:>8}  "
                     f"{startup[:8]}/{grace[:8]}")  # fmt: skip
    return lines + _left_out(len(targets) - MAX_ROWS + (view.get("hidden_targets") or 0), "targets")


def _text(value: object, width: int) -> str:
    """A string of the document as shown: its control characters escaped, at most `width` columns."""
    return visible(str(value)[:width])[:width]


def _names(names: list[str], width: int) -> str:
    """As many of `names` as a line holds, escaped, and how many more."""
    shown = ", ".join(_text(name, width) for name in names[:MAX_ROWS])
    more = len(names) - MAX_ROWS
    return shown + (f" and {more:,} more" if more > 0 else "")


def _left_out(count: int, what: str, why: str = "") -> list[str]:
    return [f"  ... {count:,} more {what}{why}"] if count > 0 else []


def _finite(value: Any, default: float) -> float:
    return value if isinstance(value, (int, float)) and math.isfinite(value) else default


def _clock(at: float) -> str:
    try:
        return time.strftime("%H:%M:%S", time.localtime(at))
    except (OverflowError, ValueError, OSError):  # a time no clock shows
        return "--:--:--"


def _share(part: Any, whole: float) -> float:
    """part / whole, within 0 and 1 (0 for a figure that is no number)."""
    share = part / whole if isinstance(part, (int, float)) and whole > 0 else 0.0
    return min(1.0, max(0.0, share)) if math.isfinite(share) else 0.0


def _bar(g: dict[str, Any], width: int) -> str:
    total, used = g.get("total_bytes") or 0.0, g.get("used_bytes")
    if not (isinstance(total, (int, float)) and math.isfinite(total) and total > 0) or used is None:
        return "[" + "?" * width + "]"
    reserved = _share(g.get("reserved_bytes") or 0.0, total)
    beyond_bytes = g["beyond_bytes"] if g.get("beyond_bytes") is not None else used - reserved * total
    r = round(width * reserved)
    b = min(width - r, round(width * _share(beyond_bytes, total)))
    return "[" + "R" * r + "#" * b + "." * (width - r - b) + "]"


def _spark(values: list[float]) -> str:
    values = [min(1.0, max(0.0, v)) for v in values if math.isfinite(v)]
    if len(values) < 2:
        return ""
    step = max(1, len(values) // 20)
    low = max(0.0, min(values) - 0.02)  # as the page's: the whole GPU at the top, the window's lowest at the bottom
    span = 1.0 - low or 1.0
    return "".join(SPARKS[min(7, max(0, int((v - low) / span * 8)))] for v in values[::step])


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
