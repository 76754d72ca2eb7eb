"""Replay traces through the real sampler at accelerated time, and measure lead times.

python -m tests.trend.replay      # prints the lead-time table of docs/trend.md
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from oomguard.exporter.model import Observation, TrendKey
from oomguard.exporter.trend.analysis import TrendSettings
from oomguard.exporter.trend.sampler import Sampler, TrendTracker
from tests.trend.traces import INTERVAL, TRACES_DIR, Trace, library, read

GPU = TrendKey("gpu", "0", "gpu")
TOTAL = 80 * 1024**3
THRESHOLD, THRESHOLD_FOR = 0.90, 120.0  # the plain alert: above 90 % for 2 minutes


@dataclass
class Replay:
    trace: Trace
    states: list[str]  # the state after each sample
    first: dict[str, float]  # state -> first time seen

    @property
    def first_signal(self) -> float | None:
        times = [self.first[s] for s in ("climbing", "spike") if s in self.first]
        return min(times) if times else None

    @property
    def threshold_fires(self) -> float | None:
        above_since = None
        for i, v in enumerate(self.trace.values):
            t = i * INTERVAL
            if v > THRESHOLD:
                above_since = t if above_since is None else above_since
                if t - above_since >= THRESHOLD_FOR:
                    return t
            else:
                above_since = None
        return None

    def lead(self, fired: float | None) -> float | None:
        oom = self.trace.oom_at
        return None if oom is None or fired is None else oom - fired


class _VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def replay(trace: Trace, settings: TrendSettings | None = None) -> Replay:
    settings = settings or TrendSettings()
    assert settings.interval_seconds == INTERVAL
    tracker = TrendTracker(settings)
    if trace.from_serving:
        tracker.forget({GPU})  # as the observer does when the engine comes up
    clock = _VirtualClock()
    states: list[str] = []
    first: dict[str, float] = {}
    position = iter(trace.values)

    async def observe() -> dict[TrendKey, Observation]:
        if states or tracker.samples_total:  # the previous sample's result
            note(tracker)
        return {GPU: Observation(next(position) * TOTAL, TOTAL)}

    def note(t: TrendTracker) -> None:
        state = t.latest[GPU].trend.state
        first.setdefault(state, len(states) * INTERVAL)
        states.append(state)

    sampler = Sampler(tracker, observe, clock=clock, sleep=clock.sleep, offload=False)
    asyncio.run(sampler.run(iterations=len(trace.values)))
    note(tracker)
    return Replay(trace, states, first)


def load_library() -> list[Trace]:
    """The committed CSV files, with the expectations of the generator that made them."""
    traces = []
    for trace in library():
        path = TRACES_DIR / f"{trace.name}.csv"
        traces.append(
            Trace(trace.name, trace.family, read(path), trace.forbidden, trace.expected_by, trace.from_serving)
        )
    return traces


def minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f}"


def table(replays: list[Replay]) -> str:
    rows = [
        "| trace | OOM at (min) | first climbing/spike (min) | lead (min) "
        "| 90 % for 2 min fires (min) | lead (min) | states seen |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in replays:
        rows.append(
            f"| `{r.trace.name}` | {minutes(r.trace.oom_at)} | {minutes(r.first_signal)} "
            f"| {minutes(r.lead(r.first_signal))} "
            f"| {minutes(r.threshold_fires)} | {minutes(r.lead(r.threshold_fires))} | {', '.join(sorted(r.first))} |"
        )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(table([replay(t) for t in load_library()]), end="")
