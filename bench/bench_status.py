"""The status page (`/`) and `/status.json` at 1,000 targets: one look's latency, 40 looks at once, and `/-/healthy`
meanwhile (issue 50, item 4: each at most 0.5 s, rendered once a snapshot, the health check unaffected).

One process serves the targets (as bench_many_targets.py: every target an aiohttp server on 127.0.0.1 serving the
real 50 kB vLLM body at once); each exporter runs in its own process (8 fake GPUs, local_process: no). With
`--before REV` a second exporter runs the code of that commit (`git archive REV exporter`, unpacked in a temporary
folder: the working tree is not touched) against the same targets, and the two are measured in turns, so the
machine's load falls on both alike. Each look is a collection of its own (as a scrape's), so a look costs at least
a collection of every target: `/metrics` is measured beside them as that floor.

Per exporter and path, in each turn: `--looks` looks one after the other (the latency of each), then `--concurrent`
at once (the latency of each, the last one's is the batch's), while a thread of this process asks `/-/healthy`
every 2 ms and records how long each answer took (its own event loop and connection).
Run: python bench/bench_status.py [--targets 1000] [--before REV] [--turns 3] [--looks 5] [--concurrent 40]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

import aiohttp
import psutil
from _common import _ctx, _started, cpu_mark, exporter_setup, machine, median, other_load, serve, start_targets

REPO = Path(__file__).resolve().parents[1]
PATHS = ("/", "/status.json", "/metrics")  # /metrics: a collection and its answer, the floor of a look
GOAL_SECONDS = 0.5
PROBE_EVERY = 0.002


# -- the exporter of a given code, in its own process ---------------------------------------------
def _serve_exporter(code: str, ports: list[int], conn: Connection) -> None:
    sys.path.insert(0, code)  # before oomguard's first import: this code, not the installed one
    import oomguard
    from oomguard.exporter.config import ScrapeConfig
    from oomguard.exporter.runtime import Runtime
    from oomguard.exporter.web import make_app

    assert Path(oomguard.__file__).is_relative_to(code), oomguard.__file__
    config, nvml = exporter_setup(ports, "no")
    # 1,000 targets answered by one process on a shared machine: the default timeout (2 s) cut some short.
    config = config.model_copy(update={"scrape": ScrapeConfig(timeout_seconds=10)})
    asyncio.run(serve(make_app(Runtime(config, nvml_lib=nvml)), conn))


def start_exporter(code: Path, ports: list[int]) -> tuple[BaseProcess, int]:
    parent, child = _ctx.Pipe()
    proc = _ctx.Process(target=_serve_exporter, args=(str(code), ports, child), daemon=True)
    proc.start()
    return proc, _started(proc, parent)  # type: ignore[return-value]


def unpack(rev: str, into: Path) -> Path:
    """The exporter's package as of `rev`, unpacked under `into`: its import root."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "exporter"], capture_output=True, check=True)
    with tempfile.TemporaryFile() as tar:
        tar.write(archive.stdout)
        tar.seek(0)
        with tarfile.open(fileobj=tar) as unpacked:
            unpacked.extractall(into, filter="data")
    return into / "exporter"


# -- /-/healthy asked every 2 ms from a thread of its own ------------------------------------------
class Probe:
    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/-/healthy"
        self.waits: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    async def _run(self) -> None:
        async with aiohttp.ClientSession() as session:
            while not self._stop.is_set():
                started = time.perf_counter()
                async with session.get(self.url) as response:
                    await response.read()
                self.waits.append(time.perf_counter() - started)
                await asyncio.sleep(PROBE_EVERY)


# -- the looks --------------------------------------------------------------------------------------
async def look(session: aiohttp.ClientSession, url: str) -> tuple[float, int]:
    started = time.perf_counter()
    async with session.get(url) as response:
        assert response.status == 200, (url, response.status)
        body = await response.read()
    return time.perf_counter() - started, len(body)


async def looks(port: int, path: str, n: int, at_once: bool) -> tuple[list[float], int]:
    url = f"http://127.0.0.1:{port}{path}"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        if at_once:
            results = await asyncio.gather(*(look(session, url) for _ in range(n)))
        else:
            results = [await look(session, url) for _ in range(n)]
    return [seconds for seconds, _ in results], results[-1][1]


class Figures:
    """One exporter's figures for one path, over the turns."""

    def __init__(self) -> None:
        self.single: list[float] = []
        self.batches: list[float] = []  # the last of the concurrent looks to be answered, per turn
        self.concurrent: list[float] = []
        self.health_single: list[float] = []
        self.health_concurrent: list[float] = []
        self.cpu_batch: list[float] = []  # the exporter's CPU seconds for a batch of concurrent looks
        self.size = 0


def measure(figures: Figures, proc: BaseProcess, port: int, path: str, n_looks: int, n_concurrent: int) -> None:
    with Probe(port) as probe:
        times, figures.size = asyncio.run(looks(port, path, n_looks, at_once=False))
    figures.single += times
    figures.health_single += probe.waits
    exporter = psutil.Process(proc.pid)
    before = exporter.cpu_times()
    with Probe(port) as probe:
        times, _ = asyncio.run(looks(port, path, n_concurrent, at_once=True))
    after = exporter.cpu_times()
    figures.cpu_batch.append(after.user + after.system - before.user - before.system)
    figures.batches.append(max(times))
    figures.concurrent += times
    figures.health_concurrent += probe.waits


def warm_up(port: int) -> None:
    """Every target answered once and the trend's first ticks taken: the first collections are the slowest."""
    for _ in range(3):
        asyncio.run(looks(port, "/metrics", 1, at_once=False))
    time.sleep(2)


async def document(port: int) -> dict:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/status.json") as response:
        return await response.json()


def render_costs(doc: dict, n: int = 20) -> tuple[float, float]:
    """(page, JSON) seconds, median of `n`, to render the view `doc` was rendered from, in this process: what each
    look paid before they were kept (the JSON on the event loop)."""
    import json  # here, not above: the exporters' processes import this module before choosing their code

    from oomguard.exporter.status import page
    from oomguard.exporter.status.view import GpuRow, Holding, StatusView, TargetRow

    fields = {**doc, "gpus": [GpuRow(**g) for g in doc["gpus"]], "targets": [TargetRow(**t) for t in doc["targets"]]}
    view = StatusView(**{**fields, "holding": [Holding(**h) for h in doc["holding"]]})
    assert json.loads(json.dumps(view.to_json())) == doc

    def timed(render: Callable[[], object]) -> float:
        times = []
        for _ in range(n):
            started = time.perf_counter()
            render()
            times.append(time.perf_counter() - started)
        return median(times)

    return timed(lambda: page.render(view)), timed(lambda: json.dumps(view.to_json()))


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", type=int, default=1000)
    parser.add_argument("--before", metavar="REV", help="also measure the exporter of this commit, in turns")
    parser.add_argument("--after", metavar="REV", help="the exporter of this commit as `after` (default: this tree)")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--looks", type=int, default=5, help="looks one after the other, a path a turn")
    parser.add_argument("--concurrent", type=int, default=40, help="looks at once, a path a turn")
    args = parser.parse_args()

    scratch = tempfile.TemporaryDirectory(prefix="bench-status-")
    after_code = unpack(args.after, Path(scratch.name) / "after") if args.after else REPO / "exporter"
    codes = {"after": after_code}
    if args.before:
        codes = {f"before ({args.before})": unpack(args.before, Path(scratch.name) / "before"), **codes}
    targets, ports = start_targets([0.0] * args.targets)
    exporters = {name: start_exporter(code, ports) for name, code in codes.items()}
    figures = {(name, path): Figures() for name in codes for path in PATHS}
    try:
        for _, port in exporters.values():
            warm_up(port)
        with Probe(next(iter(exporters.values()))[1]) as idle:
            time.sleep(1)
        mark = cpu_mark()
        for turn in range(args.turns):
            for name, (proc, port) in exporters.items():
                for path in PATHS:
                    measure(figures[name, path], proc, port, path, args.looks, args.concurrent)
            print(f"turn {turn + 1} of {args.turns} done", file=sys.stderr)
        other = other_load(mark)
        page_cost, json_cost = render_costs(asyncio.run(document(exporters["after"][1])))
    finally:
        for proc, _ in exporters.values():
            proc.kill()
        targets.kill()
        scratch.cleanup()

    print(f"after: {args.after or 'this working tree'}")
    print(f"## The status page at {args.targets} targets: {args.turns} turns of {args.looks} looks one after the")
    print(f"other and {args.concurrent} at once, a path an exporter a turn ({machine()}; other load {other:.0f} %)\n")
    print(f"`/-/healthy` idle: median {ms(median(idle.waits))} ms, longest {ms(max(idle.waits))} ms\n")
    print(
        "| exporter | path | body kB | one look median / longest ms | /-/healthy meanwhile median / longest ms "
        f"| {args.concurrent} at once: median / last ms (median of turns) | /-/healthy meanwhile median / longest ms "
        f"| exporter CPU for the {args.concurrent} ms |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (name, path), f in figures.items():
        print(
            f"| {name} | `{path}` | {f.size / 1000:,.0f} | {ms(median(f.single))} / {ms(max(f.single))} "
            f"| {ms(median(f.health_single))} / {ms(max(f.health_single))} "
            f"| {ms(median(f.concurrent))} / {ms(median(f.batches))} "
            f"| {ms(median(f.health_concurrent))} / {ms(max(f.health_concurrent))} | {ms(median(f.cpu_batch))} |"
        )

    print(
        f"\nIn this process, the view of the last `/status.json` rendered again: the page {page_cost * 1000:.1f} ms, "
        f"the JSON {json_cost * 1000:.1f} ms (median of 20), what each look paid before the renderings were kept\n"
    )
    after = "after"  # the name of its figures
    floor = figures[after, "/metrics"]
    for path in ("/", "/status.json"):
        f = figures[after, path]
        worst = max(median(f.single), median(f.batches))
        verdict = "met" if worst <= GOAL_SECONDS else "not met"
        print(
            f"goal: `{path}` at most {GOAL_SECONDS} s a look, alone and {args.concurrent} at once: one look "
            f"{median(f.single):.2f} s, the last of {args.concurrent} {median(f.batches):.2f} s ({verdict})"
        )
        # A look is a collection of its own: what the loop waits for during a scrape is the floor of what it may wait
        # during a look (the collection's stalls are issue 50's items 1 and 5, not the page's).
        health = max(f.health_concurrent + f.health_single)
        floor_health = max(floor.health_concurrent + floor.health_single)
        verdict = "met" if health <= floor_health else "not met"
        print(
            f"goal: `/-/healthy` unaffected by `{path}`: its longest wait during the looks {ms(health)} ms, during "
            f"as many scrapes of `/metrics` (a collection of as many targets each) {ms(floor_health)} ms ({verdict})"
        )


if __name__ == "__main__":
    main()
