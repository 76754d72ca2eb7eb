"""A day on a virtual clock: 43,200 trend ticks (24 h at 2 s) through the real TrendTracker, with a log
followed by the real EventRunner and rotated every simulated hour. No real sleeping.

Prints, per simulated hour: the process RSS, the median and max CPU time of one tick (record() of every
series, time.thread_time), the samples held (the largest series), and the events counted so far (one OOM
incident is written per simulated hour, half of its lines before the hour's rotation, half after).
Goals it bears on: RSS flat (within 2 MB from the second hour, once the 30-minute rings are full) and the
tick's cost flat.
Run: python bench/bench_soak.py [--hours 24] [--series 40]
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import psutil
from _common import cpu_mark, machine, other_load

from oomguard.exporter.config_loader import load_config
from oomguard.exporter.events.runner import EventRunner
from oomguard.exporter.model import Observation, TrendKey
from oomguard.exporter.trend.analysis import TrendSettings
from oomguard.exporter.trend.sampler import TrendTracker

MB = 1024**2
OOM = [
    "(EngineCore pid={i}) ERROR 12-02 12:00:00 [core.py:701] EngineCore encountered a fatal error.",
    "(EngineCore pid={i}) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "(APIServer pid={i}) INFO 12-02 12:00:05 [api_server.py:1000] vLLM server version 0.32.0, serving model m",
]
CHATTER = '(APIServer pid={i}) INFO:     127.0.0.1:5555 - "GET /metrics HTTP/1.1" 200 OK\n'


class Clock:
    def __init__(self) -> None:
        self.now = 1.7e9

    def __call__(self) -> float:
        return self.now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--series", type=int, default=40)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # each event is logged as a warning: not in the table
    settings = TrendSettings()
    per_hour = int(3600 / settings.interval_seconds)
    keys = [TrendKey("gpu" if i < 8 else "target", str(i), "gpu") for i in range(args.series)]
    rng = random.Random(3)
    tracker = TrendTracker(settings)
    me = psutil.Process()
    mark = cpu_mark()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "vllm.log"
        log.touch()
        clock = Clock()
        config = load_config(
            None,
            {
                "state_dir": str(Path(tmp) / "state"),
                "events": {"kernel_log": False, "quiet_seconds": 5},
                "targets": [{"name": "vllm", "url": "http://127.0.0.1:8000", "logs": [str(Path(tmp) / "vllm.log*")]}],
            },
        )
        runner = EventRunner(config, clock=clock)
        runner.poll()
        print(f"## Soak: {args.hours} h of {settings.interval_seconds:g} s trend ticks on a virtual clock, "
              f"{args.series} series, the log rotated hourly ({machine()})\n")  # fmt: skip
        print("| hour | RSS MB | tick CPU median ms | tick CPU max ms | samples held (largest series) | events |")
        print("|---:|---:|---:|---:|---:|---:|")
        levels = [0.5 + 0.3 * rng.random() for _ in keys]
        tick = 0
        started = time.perf_counter()
        for hour in range(1, args.hours + 1):
            costs = []
            for i in range(per_hour):
                t = tick * settings.interval_seconds
                clock.now = 1.7e9 + t
                # Noisy levels with a slow daily swing; a few series sawtooth.
                observations = {
                    k: Observation((levels[j] + 0.02 * rng.random() + (0.05 if j % 5 == 0 and tick % 60 < 30 else 0))
                                   * 80e9, 80e9)
                    for j, k in enumerate(keys)
                }  # fmt: skip
                cpu = time.thread_time()
                tracker.record(t, observations)
                costs.append((time.thread_time() - cpu) * 1000)
                if i % 15 == 0:  # the event poller, every 30 s of virtual time
                    with log.open("a") as f:
                        f.write(CHATTER.format(i=hour))
                    runner.poll()
                if i == per_hour // 2:  # the hour's incident, split by the hour's rotation
                    lines = [line.format(i=hour) + "\n" for line in OOM]
                    with log.open("a") as f:
                        f.write(lines[0])
                    os.replace(log, log.with_name(f"vllm.log.{hour:03d}"))
                    with log.open("a") as f:
                        f.write("".join(lines[1:]))
                tick += 1
            gc.collect()
            held = max(len(s) for s in tracker._series.values())
            events = runner.counts["vllm"].total.get("cuda_oom", 0) if "vllm" in runner.counts else 0
            print(
                f"| {hour} | {me.memory_info().rss / MB:.1f} | {statistics.median(costs):.2f} | {max(costs):.1f} "
                f"| {held} | {events} |"
            )
        runner.close()
    print(
        f"\n{tick} ticks in {time.perf_counter() - started:.0f} s of real time; other processes used "
        f"{other_load(mark):.0f} % of the CPUs meanwhile."
    )


if __name__ == "__main__":
    main()
