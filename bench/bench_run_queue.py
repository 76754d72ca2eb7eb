"""How long this machine keeps a ready process off the CPU: sleep 50 ms in a loop and, whenever the sleep
overruns by more than --threshold seconds, print by how much and how much of it /proc/self/schedstat counts
as run delay (runnable, not run). Run it beside a test to see whether the machine, not the code, is late
(docs/testing.md, "The real vLLM on CPU").

    .venv/bin/python bench/bench_run_queue.py --seconds 300 &
    OOMGUARD_REQUIRE_REALVLLM=1 .venv/bin/python -m pytest tests/real/vllm/test_drill_realvllm.py
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def run_delay_seconds() -> float:
    return int(Path("/proc/self/schedstat").read_text().split()[1]) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0, help="how long to watch")
    parser.add_argument("--threshold", type=float, default=0.3, help="report overruns longer than this")
    args = parser.parse_args()
    worst = 0.0
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        delay, started = run_delay_seconds(), time.perf_counter()
        time.sleep(0.05)
        over = time.perf_counter() - started - 0.05
        worst = max(worst, over)
        if over > args.threshold:
            print(f"{time.strftime('%H:%M:%S')} late {over:.2f} s, run delay +{run_delay_seconds() - delay:.2f} s",
                  flush=True)  # fmt: skip
    print(f"worst overrun {worst:.3f} s in {args.seconds:g} s")


if __name__ == "__main__":
    main()
