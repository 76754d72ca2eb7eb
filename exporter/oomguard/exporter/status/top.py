"""`oomguard top`: the status page's view in a terminal, from a local or remote exporter (its /status.json).

Beside `nvidia-smi` (a GPU's memory and processes) and `nvtop` (their history), this shows what neither knows: each
GPU's memory against the engines' reservation, its trend and time to full, each engine's KV cache and queue, its last
OOM and restart, and which pages' conditions hold now. `--once` prints one frame and exits (a script's, a ticket's).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import ssl
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from oomguard.exporter.status.page import human_bytes, pct
from oomguard.exporter.status.view import duration

MAX_BODY_BYTES = 32 * 1024 * 1024  # a cluster's view is tens of kilobytes: more is not an exporter's answer
SPARKS = "▁▂▃▄▅▆▇█"
CLEAR = "\x1b[H\x1b[2J"


class TopError(Exception):
    """A failure with its fix, said in one line (exit code 2)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", nargs="?", default="http://127.0.0.1:9847",
                        help="the exporter's address (default: http://127.0.0.1:9847)")  # fmt: skip
    parser.add_argument("--once", action="store_true", help="print one frame to stdout and exit")
    parser.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help="refresh period (default 2)")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS", help="per request (default 10)")
    parser.add_argument("--username", help="basic auth user (the exporter's --web.config.file basic_auth_users)")
    parser.add_argument("--password-file", type=Path, metavar="FILE",
                        help="basic auth password, read from this file [$OOMGUARD_TOP_PASSWORD]")  # fmt: skip
    parser.add_argument("--ca-file", type=Path, metavar="FILE", help="CA certificate(s) to verify an https exporter")
    parser.add_argument("--cert-file", type=Path, metavar="FILE", help="client certificate (mutual TLS)")
    parser.add_argument("--key-file", type=Path, metavar="FILE", help="its key")
    parser.add_argument("--insecure-skip-verify", action="store_true", help="do not verify the server certificate")


def main(args: argparse.Namespace) -> int:
    try:
        request = _request(args)
        context = _tls(args)
        if args.once:
            print(frame(fetch(request, context, args.timeout), shutil.get_terminal_size((120, 40)).columns))
            return 0
        while True:
            try:
                text = frame(fetch(request, context, args.timeout), shutil.get_terminal_size((120, 40)).columns)
            except TopError as exc:
                text = f"oomguard top: {exc} (retrying every {args.interval:g}s; Ctrl-C quits)"
            sys.stdout.write(CLEAR + text + "\n")
            sys.stdout.flush()
            time.sleep(args.interval)
    except TopError as exc:
        print(f"oomguard top: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


def _request(args: argparse.Namespace) -> urllib.request.Request:
    base = args.url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise TopError(f"{args.url!r} is not an http(s) URL; write the exporter's address, e.g. http://host:9847")
    url = base.removesuffix("/metrics").removesuffix("/status.json") + "/status.json"
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    password = os.environ.get("OOMGUARD_TOP_PASSWORD")
    if args.password_file is not None:
        try:
            password = args.password_file.read_text().rstrip("\n")
        except OSError as exc:
            raise TopError(f"cannot read --password-file {args.password_file}: {exc.strerror}") from None
    if args.username is not None:
        token = base64.b64encode(f"{args.username}:{password or ''}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    elif password is not None:
        raise TopError("a password without --username: give the user too")
    return request


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
    return context


def fetch(request: urllib.request.Request, context: ssl.SSLContext | None, timeout: float) -> dict[str, Any]:
    url = request.full_url
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            body = response.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as exc:
        fix = {401: "give --username and --password-file", 404: "is it oomguard 0.1 or later?"}.get(exc.code, "")
        raise TopError(f"{url} answered HTTP {exc.code}" + (f": {fix}" if fix else "")) from None
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TopError(f"cannot read {url}: {reason}; is `oomguard serve` running there?") from None
    if len(body) > MAX_BODY_BYTES:
        raise TopError(f"{url} answered more than {MAX_BODY_BYTES // 2**20} MiB: not an exporter's status")
    try:
        view = json.loads(body)
        if not isinstance(view, dict) or not isinstance(view.get("gpus"), list):
            raise ValueError("no gpus list")
        return view
    except ValueError as exc:
        raise TopError(f"{url} did not answer oomguard's status JSON ({exc}); is it oomguard?") from None


def frame(view: dict[str, Any], width: int = 120) -> str:
    """One screen of the view, `width` columns wide at most."""
    width = max(60, width)
    taken = time.strftime("%H:%M:%S", time.localtime(view.get("taken_at") or time.time()))
    lines = [f"oomguard top  {taken}  thresholds: {view.get('thresholds', '')}", ""]
    holding = view.get("holding") or []
    lines.append("HOLDING NOW" if holding else "holding now: none (no memory page, no OOM or restart storm)")
    for h in holding:
        lines.append(
            f"  {'PAGE  ' if h['severity'] == 'critical' else 'ticket'} {h['alert']}  {h['subject']}: {h['why']}"
        )
    lines += [
        "",
        "GPU          used                 headroom  trend       full in   bar (R reserved, # beyond, . free)",
    ]
    bar_width = max(10, min(40, width - 80))
    for g in view.get("gpus") or []:
        total, used = g.get("total_bytes") or 0.0, g.get("used_bytes")
        name = f"{g['gpu']}@{g['node']}" if g.get("node") else str(g.get("gpu"))
        used_text = f"{human_bytes(used)}/{human_bytes(total)}" if total else "-"
        to_full = duration(g["seconds_to_full"]) if g.get("seconds_to_full") is not None else "-"
        lines.append(f"{name[:12]:<12} {used_text:<20} {pct(g.get('headroom_used')):>8}  {g.get('trend') or '?':<10}  "
                     f"{to_full:>7}   {_bar(g, bar_width)} {_spark(g.get('spark') or [])}")  # fmt: skip
        if g.get("targets"):
            lines.append(f"{'':12}   {', '.join(g['targets'])}")
    if view.get("hidden_gpus"):
        lines.append(f"  ... {view['hidden_gpus']} more GPUs (the fullest are shown)")
    lines += ["", "TARGET                     state    KV cache  wait/run   last OOM          restarts  startup/grace"]
    now = view.get("taken_at") or time.time()
    for t in view.get("targets") or []:
        oom = f"{t['last_oom_kind']} {duration(now - t['last_oom_at'])} ago" if t.get("last_oom_at") else "none"
        startup = duration(t["startup_seconds"]) if t.get("startup_seconds") is not None else "-"
        grace = duration(t["probe_grace_seconds"]) if t.get("probe_grace_seconds") is not None else "-"
        queue = f"{_n(t.get('waiting'))}/{_n(t.get('running'))}"
        lines.append(f"{t['name'][:26]:<26} {t.get('state') or '?':<8} {pct(t.get('kv_cache')):>8}  {queue:<9}  "
                     f"{oom[:16]:<16}  {t.get('restarts', 0):>8.0f}  {startup}/{grace}")  # fmt: skip
    sources = view.get("sources") or {}
    failing = [name for name, ok in sources.items() if not ok]
    lines += ["", "sources: " + ("all ok" if not failing else "FAILING: " + ", ".join(failing))]
    return "\n".join(line[:width] for line in lines)


def _bar(g: dict[str, Any], width: int) -> str:
    total, used = g.get("total_bytes") or 0.0, g.get("used_bytes")
    if not total or used is None:
        return "[" + "?" * width + "]"
    reserved = min(g.get("reserved_bytes") or 0.0, total)
    beyond = g["beyond_bytes"] if g.get("beyond_bytes") is not None else max(0.0, used - reserved)
    r = round(width * reserved / total)
    b = min(width - r, round(width * beyond / total))
    return "[" + "R" * r + "#" * b + "." * (width - r - b) + "]"


def _spark(values: list[float]) -> str:
    if len(values) < 2:
        return ""
    step = max(1, len(values) // 20)
    low = max(0.0, min(values) - 0.02)  # as the page's: the whole GPU at the top, the window's lowest at the bottom
    span = 1.0 - low or 1.0
    return "".join(SPARKS[min(7, max(0, int((min(v, 1.0) - low) / span * 8)))] for v in values[::step])


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
