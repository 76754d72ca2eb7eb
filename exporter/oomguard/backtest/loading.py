"""An engine's load, inferred where the history does not say its state (a dcgm-exporter history, a file without the
`state` column).

The live exporter knows a loading engine (its port closed, or its /health 503) and leaves it out of the trend: a load
fills the GPU by design (trend/observe.py). A history without states shows only the memory: its engine's GPUs empty
(the process gone: a deploy, an OOM, a gap in the history), then a ramp as the weights stream in and the KV pool is
allocated. Read as serving, that ramp is a climb and a spike to the reservation. So here a ramp from near zero after
the engine's GPUs were empty (or after a gap longer than the lookback, or at the history's start) is taken for its
load, until the engine gives the figures only a serving engine gives (its KV cache, its queue), holds its
reservation (as the history last gave it: a reserving engine's load ends with its KV pool), or its memory has
stopped rising for SETTLE seconds; the report says how many loads were inferred.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from oomguard.backtest.history import EngineRow, Step

# A GPU below this share of its total holds no engine (a CUDA context is about 0.5 GiB, 0.7 % of 80 GB).
GONE = 0.05
# A rise of more than this share of the total is still the load.
RISE = 0.01
# A load is over once its memory has not risen for this long (the KV pool allocated, the CUDA graphs captured).
SETTLE = 180.0


@dataclass
class _Engine:
    gone: bool
    last_seen: float
    loading_since: float | None = None
    peak: float = 0.0
    last_rise: float = 0.0


class LoadInference:
    def __init__(self, lookback: float) -> None:
        self.lookback = lookback
        self._engines: dict[str, _Engine] = {}
        self.inferred: set[str] = set()  # the engines whose load is inferred at this step
        self.spells = 0  # loads inferred over the history
        self.engines: set[str] = set()  # the engines one was inferred for
        self._reservation: dict[str, float] = {}  # each engine's reservation as the history last gave it

    def infer(self, step: Step, engines: dict[str, EngineRow]) -> dict[str, EngineRow]:
        """`engines` with `state="loading"` where a load is inferred (only those whose state the history leaves
        unsaid)."""
        shares: dict[str, float] = {}
        for row in step.gpus:
            total = row.total or (
                row.used + row.free + (row.reserved or 0.0) if row.used is not None and row.free is not None else None
            )
            if row.used is None or not total:
                continue
            for target in row.targets:
                shares[target] = max(shares.get(target, 0.0), row.used / total)
        self.inferred = set()
        out = engines
        for name, engine in engines.items():
            share = shares.get(name)
            if engine.state or share is None:
                continue
            if self._loading(name, engine, share, step.t):
                if out is engines:
                    out = dict(engines)
                out[name] = replace(engine, state="loading")
                self.inferred.add(name)
        return out

    def _loading(self, name: str, engine: EngineRow, share: float, t: float) -> bool:
        if engine.gpu_memory_utilization is not None:
            self._reservation[name] = engine.gpu_memory_utilization
        held = self._engines.get(name)
        if held is None:
            held = self._engines[name] = _Engine(gone=share < GONE, last_seen=t)
        elif t - held.last_seen > self.lookback:
            held.gone, held.loading_since = True, None  # a gap: what follows may be a new process's load
        held.last_seen = t
        if share < GONE:
            held.gone, held.loading_since = True, None
            return False
        if held.gone:
            held.gone = False
            if engine.serving():
                return False
            held.loading_since, held.peak, held.last_rise = t, share, t
            self.spells += 1
            self.engines.add(name)
            return True
        if held.loading_since is None:
            return False
        if share > held.peak + RISE:
            held.peak, held.last_rise = share, t
        # Over once it serves, once its memory settles, or once it holds its reservation (a reserving engine's load
        # ends with its KV pool allocated: what rises after that is no load, a leak right after a start included).
        reserved = self._reservation.get(name)
        if engine.serving() or t - held.last_rise >= SETTLE or (reserved is not None and share >= reserved - RISE):
            held.loading_since = None
            return False
        return True
