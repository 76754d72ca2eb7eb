"""`oomguard backtest` end to end on a week of 8 GPUs every 15 s (a synthetic CSV): wall time and peak memory.

The history: 8 vLLM engines at gpu_memory_utilization 0.9, one per GPU, with their engine figures (KV cache, queue,
preemptions); steady around their reservation with a little noise, but for two incidents: GPU 3 leaks beyond its
reservation for 40 minutes on day 3, GPU 5 spikes over 8 minutes on day 5, each to its OOM (the OOM list has
both). 40,320 readings, 322,560 rows, 36 MB of CSV. The command runs in its own process, as a user runs it
(Python's start, the replay, promtool's backfill, Prometheus' start and the evaluation of the rules, the report);
the process tree's RSS is sampled every 50 ms: the backtest's own peak, and the tree's (with promtool and
Prometheus) at its highest.

Run: python bench/bench_backtest.py [--days 7] [--gpus 8] [--step 15] [--keep DIR] [--jobs N]
The goal: under a minute here, the memory bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from _common import machine

T0 = 1_714_521_600  # 2024-05-01 00:00:00 UTC
TOTAL = 85_899_345_920  # an 80 GiB GPU


def write_history(path: Path, *, days: float, gpus: int, step: float) -> tuple[int, list[str]]:
    """The CSV, written a line at a time; the rows written and the OOM list's lines."""
    leak = (3 * 86400 + 10 * 3600, 40 * 60, 3)  # (start, seconds to the OOM, GPU)
    spike = (5 * 86400 + 15 * 3600, 8 * 60, 5)
    ooms = [f"{T0 + start + span} gpu={gpu} node=node-1" for start, span, gpu in (leak, spike) if gpu < gpus]
    n = 0
    with path.open("w", encoding="utf-8") as out:
        out.write("time,node,gpu,used_bytes,total_bytes,target,kv_cache_usage,waiting,running,preemptions_total,"
                  "gpu_memory_utilization\n")  # fmt: skip
        for i in range(int(days * 86400 / step)):
            t = i * step
            lines = []
            for g in range(gpus):
                ratio = 0.905 + 0.0006 * math.sin(i / 9.0 + g) + 0.0003 * math.sin(i / 97.0 + 2 * g)
                for start, span, gpu in (leak, spike):
                    if g == gpu and start <= t < start + span:
                        ratio += 0.094 * (t - start) / span  # to 99.9 % at the OOM
                kv = 0.3 + 0.25 * ((i + 7 * g) % 40) / 40
                lines.append(f"{T0 + t:.0f},node-1,{g},{ratio * TOTAL:.0f},{TOTAL},vllm-{g},{kv:.3f},"
                             f"{(i + g) % 3},{4 + (i + g) % 6},{i // 200},0.9\n")  # fmt: skip
                n += 1
            out.write("".join(lines))
    return n, ooms


def run(command: list[str]) -> tuple[float, float, float, int, str, float, float]:
    """(wall seconds, the backtest's peak RSS, the tree's peak RSS, exit status, stdout, the tree's CPU seconds,
    the share of the CPUs other processes used meanwhile)."""
    cpus = len(psutil.Process().cpu_affinity() or [0])
    before = psutil.cpu_times()
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    me = psutil.Process(proc.pid)
    own = tree = 0.0
    cpu: dict[int, float] = {}  # pid -> its CPU seconds when last seen (the tree's processes come and go)
    while proc.poll() is None:
        try:
            total = mine = me.memory_info().rss
            times = me.cpu_times()
            cpu[me.pid] = times.user + times.system
            for child in me.children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    total += child.memory_info().rss
                    times = child.cpu_times()
                    cpu[child.pid] = times.user + times.system
            own, tree = max(own, mine), max(tree, total)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    out = proc.stdout.read() if proc.stdout else ""
    proc.wait()
    wall = time.perf_counter() - started
    after = psutil.cpu_times()
    busy = sum(getattr(after, f) - getattr(before, f) for f in ("user", "nice", "system", "irq", "softirq"))
    ours = sum(cpu.values())
    return wall, own, tree, proc.returncode, out, ours, max(0.0, (busy - ours) / (wall * cpus) * 100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--step", type=float, default=15.0)
    parser.add_argument("--keep", type=Path, help="write the history there (and keep it)")
    parser.add_argument("--jobs", type=int, help="oomguard backtest --jobs (default: its own choice)")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-backtest-"))
    folder.mkdir(parents=True, exist_ok=True)
    history, ooms_path = folder / "week.csv", folder / "ooms.txt"
    rows, ooms = write_history(history, days=args.days, gpus=args.gpus, step=args.step)
    ooms_path.write_text("\n".join(ooms) + "\n")
    size = history.stat().st_size
    command = [sys.executable, "-m", "oomguard", "backtest", "--history", str(history), "--ooms", str(ooms_path),
               "--quiet", *(["--jobs", str(args.jobs)] if args.jobs else [])]  # fmt: skip
    wall, own, tree, status, out, cpu, others = run(command)
    print(f"## oomguard backtest: {args.days:g} days of {args.gpus} GPUs every {args.step:g} s ({machine()}; "
          f"other processes used {others:.0f} % of the CPUs meanwhile)")  # fmt: skip
    print()
    print(f"- history: {rows:,} rows, {size / 1e6:.1f} MB of CSV, {len(ooms)} OOMs")
    print(f"- command: {' '.join(command[1:])}")
    print(f"- exit status {status}; wall time **{wall:.1f} s** ({cpu:.1f} s of CPU, the process tree's); peak RSS of "
          f"the backtest {own / 2**20:.0f} MB, of its process tree (with its workers, promtool and Prometheus) "
          f"{tree / 2**20:.0f} MB")  # fmt: skip
    print()
    print("```")
    print("\n".join(line for line in out.splitlines() if line.strip())[:3000])
    print("```")
    if status != 0:
        sys.exit(status)


if __name__ == "__main__":
    main()
