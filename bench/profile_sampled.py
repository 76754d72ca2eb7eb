"""Where a scrape's CPU goes, sampled: the exporter under py-spy while a client scrapes it, grouped by part.

yappi (profile_scrape.py) counts every call, which inflates code of many small calls (the exposition's); py-spy
samples the running stack instead (`--nonblocking`, 250 a second, every thread) and distorts nothing. Each busy
sample counts for the innermost part its stack is in: the HTTP client, the extraction, the reading, building
and rendering the answer, the exporter's server, the worker threads, the sockets, else asyncio and the rest.
Idle samples (the loop's select, a worker waiting for work) are left out.
Run: python bench/profile_sampled.py [--targets 500] [--mode no|auto] [--seconds 25] [--top 15]
needs py-spy (pip install py-spy), not a dependency of the exporter, and the right to trace a child process.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp
from _common import default_delays, start_exporter, start_targets

PARTS = [  # (part, what a frame of it holds); the innermost frame that matches one decides
    ("extraction (promtext.py)", ("FamilyExtractor.extract",)),
    ("engine reading and checks", ("read_checked",)),
    ("building and rendering the answer", ("families (oomguard/exposition", "Exposition.render")),
    ("HTTP client: aiohttp's", ("aiohttp/client", "aiohttp/streams", "aiohttp/connector", "aiohttp/helpers", "yarl")),
    ("HTTP client: engine_client.py", ("oomguard/engine_client.py",)),
    ("the exporter's HTTP server, besides rendering", ("aiohttp/web_", "aiohttp/http_writer")),
]
IDLE = ("thread.py:81)", "selectors.py")  # a worker waiting for work, the event loop waiting for events


def part(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, marks in PARTS:
            if any(mark in frame for mark in marks):
                return name
    if any("Thread.run" in f for f in frames):
        return "worker threads (NVML, /proc)"
    if any("selector_events" in f for f in frames[-2:]):
        return "sockets (send, recv)"
    return "asyncio and the rest"


def summary(raw: Path, top: int) -> str:
    parts: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    busy = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not stack or any(mark in frames[-1] for mark in IDLE):
            continue
        busy += int(count)
        parts[part(frames)] += int(count)
        own[frames[-1]] += int(count)
    lines = [f"{busy} busy samples\n", "| part | share of the busy samples |", "|---|---:|"]
    lines += [f"| {name} | {100 * n / busy:.1f} % |" for name, n in parts.most_common()]
    lines += ["", "| function (line) by its own samples | share |", "|---|---:|"]
    lines += [f"| `{frame}` | {100 * n / busy:.1f} % |" for frame, n in own.most_common(top)]
    return "\n".join(lines)


async def scrape_until(port: int, deadline: float) -> None:
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                await response.read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", type=int, default=500)
    parser.add_argument("--mode", default="no", choices=("auto", "no"))
    parser.add_argument("--seconds", type=int, default=25)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--delays", action="store_true", help="bench_scrape.py's delays (0-5 ms, the first 20 ms)")
    args = parser.parse_args()
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("bench/profile_sampled.py needs py-spy, a sampling profiler: pip install py-spy")
    delays = default_delays() if args.delays else [0.0]
    targets, ports = start_targets((delays * (args.targets // len(delays) + 1))[: args.targets])
    exporter, port = start_exporter(ports, args.mode)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "samples.txt"
        try:
            asyncio.run(scrape_until(port, time.monotonic() + 3))  # warm: connections open, caches full
            record = subprocess.Popen(
                [spy, "record", "--nonblocking", "-r", "250", "-d", str(args.seconds), "-f", "raw", "-o", str(raw),
                 "-p", str(exporter.pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
            asyncio.run(scrape_until(port, time.monotonic() + args.seconds + 1))
            _, err = record.communicate(timeout=60)
            if record.returncode != 0:
                raise SystemExit(f"py-spy failed: {err.decode(errors='replace')[-500:]}")
        finally:
            exporter.kill()
            targets.kill()
        print(f"## Sampled: {args.targets} targets, local_process {args.mode}, {args.seconds} s of scrapes in a loop\n")
        print(summary(raw, args.top))


if __name__ == "__main__":
    main()
