"""Does a page mean "this GPU runs out within the hour"? The bundle judged on the detection library (bench/detection/).

Every history of the library (healthy fleets, incidents, unforeseeable spikes: bench/detection/library.py) is
generated from the seed, written as a file, and run through `oomguard backtest --json` in its own process, as a user
runs it, with the bundle's defaults (or --bundle-config). From the reports:

- incidents paged >= 5 min ahead: the foreseeable incidents (a first OOM, not a relapse, not unforeseeable) whose
  first page fired at least 5 minutes before it; the median and the worst first-page lead;
- slow leaks ticketed >= 1 h ahead: the foreseeable incidents of a climb slower than 1 GiB/h with a ticket (or a
  page) at least an hour before;
- pages outside incidents per 100 GPU-days: every page that fired outside the hour before and half hour after an OOM
  of its place, an unforeseeable OOM's hour before included (nothing could be seen: a page then came by chance), of
  which flaps (the same alert on the same series firing again within 10 minutes of resolving);
- tickets on healthy GPUs per 100 GPU-days: tickets on GPUs that never ran out, per day of those GPUs.

Run: python bench/bench_detection.py [--seed 1] [--step 30] [--only NAME ...] [--bundle-config FILE] [--keep DIR]
The goals (issue 46): every foreseeable incident paged >= 5 min ahead; slow leaks ticketed >= 1 h ahead; <= 1 page per
100 GPU-days outside incidents; <= 5 tickets per 100 GPU-days on healthy GPUs.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from _common import machine
from detection import Expected, generate

FLAP_SECONDS = 600.0
PAGE_LEAD = 300.0
TICKET_LEAD = 3600.0
DAY = 86400.0


@dataclass
class Tally:
    histories: int = 0
    gpu_days: float = 0.0
    healthy_gpu_days: float = 0.0
    incidents: int = 0
    paged: int = 0
    leads: list[float] = field(default_factory=list)
    slow: int = 0
    slow_ticketed: int = 0
    pages_outside: int = 0
    pages_healthy: int = 0  # of them, on GPUs that never ran out (the rest came hours before an OOM that came)
    flaps: int = 0
    tickets_healthy: int = 0
    misses: list[str] = field(default_factory=list)  # incidents not paged in time, slow ones not ticketed
    noise: dict[str, int] = field(default_factory=dict)  # history -> pages outside incidents
    ticket_noise: dict[str, int] = field(default_factory=dict)
    by_alert: dict[str, int] = field(default_factory=dict)  # alert -> pages outside incidents
    tickets_by_alert: dict[str, int] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)


def backtest(folder: Path, expected: Expected, bundle: Path | None) -> dict | str:
    command = [sys.executable, "-m", "oomguard", "backtest", "--history", str(folder / expected.history),
               "--ooms", str(folder / expected.ooms_file), "--json", "--quiet", "--jobs", "1",
               *(["--bundle-config", str(bundle)] if bundle else [])]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"{expected.name}: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-400:]}"
    return json.loads(done.stdout)


def _place(labels: dict[str, str], gpus: dict[str, list[str]]) -> set[str]:
    """An alert's GPUs as node/gpu (its engine's, where it names a target)."""
    if "gpu" in labels:
        return {f"{labels.get('node', '')}/{labels['gpu']}"}
    return set(gpus.get(labels.get("target", ""), ()))


def _gpu_key(gpu: dict) -> str:
    """As the library names a GPU (its names are the labels the replay gives: indices and MIG instances)."""
    return f"{gpu['node']}/{gpu['gpu']}"


def judge(tally: Tally, expected: Expected, report: dict) -> None:
    """Adds one history's report to the tally."""
    tally.histories += 1
    gpus = report["gpus"]
    by_target: dict[str, list[str]] = {}
    for g in gpus:
        for target in g["targets"]:
            by_target.setdefault(target, []).append(_gpu_key(g))
    unforeseeable = {o["time"] for o in expected.ooms if o["unforeseeable"]}
    oom_gpus = {f"{o['node']}/{o['gpu']}" for o in expected.ooms}
    for g in gpus:
        days = g["judged_seconds"] / DAY
        tally.gpu_days += days
        if _gpu_key(g) not in oom_gpus:
            tally.healthy_gpu_days += days
    pages: list[dict] = []
    for oom in report["ooms"]:
        if oom["relapse_of"] is not None:
            continue
        alerts = oom["alerts"]
        where = f"{expected.name} {oom['time'] - report['start']:.0f}s"
        if oom["time"] in unforeseeable:
            if not oom.get("unforeseeable"):  # a backtest that cannot be told: its leads are pages for nothing
                pages += [a for a in alerts if a["receiver"] == "page"]
        else:
            tally.incidents += 1
            page = oom["first_page"]
            if page is not None and page["lead_seconds"] >= PAGE_LEAD:
                tally.paged += 1
            else:
                tally.misses.append(f"{where}: not paged 5 min ahead ({_lead(page)})")
            if page is not None:
                tally.leads.append(page["lead_seconds"])
        # A slow leak is ticketed ahead even where a burst finished it (its OOM unforeseeable to a page).
        if expected.slow and _grown(expected, oom["time"]):
            tally.slow += 1
            early = max((a["lead_seconds"] for a in alerts if a["receiver"] in ("page", "ticket")), default=None)
            if early is not None and early >= TICKET_LEAD:
                tally.slow_ticketed += 1
            else:
                tally.misses.append(f"{where}: slow, not ticketed an hour ahead ({_lead({'lead_seconds': early})})")
    outside = report["outside_incidents"]["alerts"]
    pages += [e for e in outside if e["receiver"] == "page"]
    tally.pages_outside += len(pages)
    tally.pages_healthy += sum(1 for e in pages if not (_place(e["labels"], by_target) & oom_gpus))
    tally.flaps += flaps(pages)
    if pages:
        tally.noise[expected.name] = len(pages)
    for e in pages:
        tally.by_alert[e["alert"]] = tally.by_alert.get(e["alert"], 0) + 1
    tickets = [e for e in outside if e["receiver"] == "ticket" and not (_place(e["labels"], by_target) & oom_gpus)]
    tally.tickets_healthy += len(tickets)
    if tickets:
        tally.ticket_noise[expected.name] = len(tickets)
    for e in tickets:
        tally.tickets_by_alert[e["alert"]] = tally.tickets_by_alert.get(e["alert"], 0) + 1


def _grown(expected: Expected, t: float) -> bool:
    """Whether the OOM at `t` came of what grew (a leak, fragmentation, a foreign process), not of a spike alone."""
    return any(o["time"] == t and o["cause"] in ("leak", "fragmentation", "foreign") for o in expected.ooms)


def flaps(episodes: list[dict]) -> int:
    """Episodes that fired within FLAP_SECONDS of the same alert's previous episode on the same series resolving."""
    last: dict[tuple, float | None] = {}
    n = 0
    for e in sorted((e for e in episodes if e.get("fired_at") is not None), key=lambda e: e["fired_at"]):
        key = (e["alert"], tuple(sorted(e["labels"].items())))
        if key in last and last[key] is not None and e["fired_at"] - last[key] <= FLAP_SECONDS:  # type: ignore[operator]
            n += 1
        last[key] = e.get("resolved_at")
    return n


def _lead(lead: dict | None) -> str:
    if lead is None or lead.get("lead_seconds") is None:
        return "none"
    return f"{lead['lead_seconds'] / 60:.1f} min"


def line(tally: Tally, seed: int) -> str:
    per100 = 100 / tally.gpu_days if tally.gpu_days else 0.0
    healthy100 = 100 / tally.healthy_gpu_days if tally.healthy_gpu_days else 0.0
    leads = sorted(tally.leads)
    lead = (f"median lead {statistics.median(leads) / 60:.1f} min, worst {leads[0] / 60:.1f} min" if leads
            else "no page")  # fmt: skip
    return (
        f"seed {seed}, {tally.histories} histories, {tally.gpu_days:.1f} GPU-days: "
        f"incidents paged >= 5 min ahead {tally.paged}/{tally.incidents} ({lead}); "
        f"slow leaks ticketed >= 1 h ahead {tally.slow_ticketed}/{tally.slow}; "
        f"pages outside incidents {tally.pages_outside * per100:.1f} per 100 GPU-days ({tally.pages_outside}, "
        f"{tally.flaps} flaps, {tally.pages_healthy} on GPUs that never ran out); tickets on healthy GPUs "
        f"{tally.tickets_healthy * healthy100:.1f} per 100 GPU-days "
        f"({tally.tickets_healthy} in {tally.healthy_gpu_days:.1f} GPU-days)"
    )


def goals(tally: Tally) -> list[str]:
    per100 = tally.pages_outside * 100 / tally.gpu_days if tally.gpu_days else 0.0
    tickets = tally.tickets_healthy * 100 / tally.healthy_gpu_days if tally.healthy_gpu_days else 0.0
    return [
        f"{'met' if tally.paged == tally.incidents else 'MISSED'}: every foreseeable incident paged >= 5 min ahead",
        f"{'met' if tally.slow_ticketed == tally.slow else 'MISSED'}: every slow leak ticketed >= 1 h ahead",
        f"{'met' if per100 <= 1.0 else 'MISSED'}: <= 1 page per 100 GPU-days outside incidents ({per100:.2f})",
        f"{'met' if tickets <= 5.0 else 'MISSED'}: <= 5 tickets per 100 GPU-days on healthy GPUs ({tickets:.2f})",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1, help="the library's seed (1: the one tuned on; try others)")
    parser.add_argument("--step", type=float, default=30.0, help="seconds between readings (a scrape interval)")
    parser.add_argument("--only", nargs="*", help="these histories only (their names)")
    parser.add_argument("--bundle-config", type=Path, help="judge this bundle configuration, not the defaults")
    parser.add_argument("--keep", type=Path, help="write the library there and keep it (reused when there)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="backtests at once")
    parser.add_argument("--details", action="store_true", help="each history's pages, tickets and misses")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-detection-"))
    started = time.perf_counter()
    manifest = folder / "library.json"
    reuse = args.keep is not None and manifest.exists() and (folder / f"seed-{args.seed}-step-{args.step:g}").exists()
    if reuse:
        library = [Expected(**e) for e in json.loads(manifest.read_text())]
        if args.only:
            library = [e for e in library if e.name in args.only]
    else:
        library = generate(folder, args.seed, args.step, args.only)
        if not args.only:
            (folder / f"seed-{args.seed}-step-{args.step:g}").touch()
    generated = time.perf_counter() - started
    tally = Tally()
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        reports = list(pool.map(lambda e: backtest(folder, e, args.bundle_config), library))
    for expected, report in zip(library, reports, strict=True):
        if isinstance(report, str):
            tally.failed.append(report)
            continue
        judge(tally, expected, report)
    print(f"## Detection ({machine()}; library made in {generated:.0f} s, judged in "
          f"{time.perf_counter() - started - generated:.0f} s)")  # fmt: skip
    print()
    print(line(tally, args.seed))
    print()
    for goal in goals(tally):
        print(f"- {goal}")
    if tally.by_alert:
        print(f"- pages outside incidents by alert: {_counts(tally.by_alert)}; by history: {_counts(tally.noise)}")
    if tally.tickets_by_alert:
        print(f"- tickets on healthy GPUs by alert: {_counts(tally.tickets_by_alert)}; by history: "
              f"{_counts(tally.ticket_noise)}")  # fmt: skip
    if args.details or len(tally.misses) <= 12:
        for miss in tally.misses:
            print(f"- miss: {miss}")
    else:
        print(f"- {len(tally.misses)} misses (--details lists them)")
    for failure in tally.failed:
        print(f"- FAILED: {failure}")
    if tally.failed:
        sys.exit(1)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k.removeprefix('OomGuard')} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


if __name__ == "__main__":
    main()
