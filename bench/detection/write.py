"""A simulated fleet written as `oomguard backtest` reads a history (docs/backtest.md, "The history as a file"), in one
of three styles a team's history comes in, and its OOMs as `--ooms` reads them."""

from __future__ import annotations

import gzip
from collections.abc import Iterable
from pathlib import Path

from detection.fleet import Engine, OomEvent, Reading

# node: what oomguard's node agent knows (NVML with its per-process list, the engine's state and figures);
# dcgm: dcgm-exporter's MiB and vLLM's own /metrics scraped beside it (no state, no per-process memory);
# bare: GPU memory and each engine's reservation only.
STYLES = {
    "node": ("time", "node", "gpu", "used_bytes", "total_bytes", "target", "engine", "state", "sleep_state",
             "engine_used_bytes", "kv_cache_usage", "waiting", "running", "preemptions_total",
             "gpu_memory_utilization", "max_num_seqs"),
    "dcgm": ("time", "node", "gpu", "used_mib", "free_mib", "target", "engine", "kv_cache_usage", "waiting",
             "running", "preemptions_total", "gpu_memory_utilization"),
    "bare": ("time", "node", "gpu", "used_bytes", "total_bytes", "target", "gpu_memory_utilization"),
}  # fmt: skip
MiB = 2**20


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.0f}" if value.is_integer() else f"{value:.4g}"
    return str(value)


def rows(style: str, readings: list[Reading], sleeps: bool) -> Iterable[str]:
    """One line per GPU and engine on it (several engines on one GPU: a line each); a GPU no engine uses has a line
    with its memory alone."""
    columns = STYLES[style]
    for r in readings:
        base = {"time": f"{r.t:.0f}", "node": r.gpu.node, "gpu": r.gpu.name}
        if style == "dcgm":
            used = round(r.used / MiB)
            base |= {"used_mib": used, "free_mib": max(0, round(r.gpu.total / MiB) - used)}
        else:
            base |= {"used_bytes": f"{r.used:.0f}", "total_bytes": f"{r.gpu.total:.0f}"}
        on = r.engines or [(None, 0.0)]
        for engine, own in on:
            row = dict(base)
            if engine is not None:
                row |= _engine(style, engine, own, sleeps)
            yield ",".join(_cell(row.get(c)) for c in columns)


def _engine(style: str, engine: Engine, own: float, sleeps: bool) -> dict[str, object]:
    row: dict[str, object] = {"target": engine.target, "engine": engine.kind}
    if style == "bare":
        return row | {"gpu_memory_utilization": engine.reservation}
    state = engine.state
    if style == "node":
        row |= {"state": state, "engine_used_bytes": f"{own:.0f}"}
        if sleeps and state == "up":
            row["sleep_state"] = engine.figures.get("sleep_state")
        if state == "up":
            row["max_num_seqs"] = engine.max_num_seqs
        elif state == "loading":
            row["gpu_memory_utilization"] = engine.reservation  # its command line's, as the exporter reads it
    if state == "up":
        for name in ("kv_cache_usage", "waiting", "running", "preemptions_total", "gpu_memory_utilization"):
            row[name] = engine.figures.get(name)
    return row


def write_history(path: Path, style: str, lines: Iterable[str]) -> int:
    """The CSV (gzip-compressed where the name ends in .gz); the lines written."""
    n = 0
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8", newline="") as out:  # type: ignore[operator]
        out.write(",".join(STYLES[style]) + "\n")
        batch: list[str] = []
        for line in lines:
            batch.append(line)
            if len(batch) >= 4096:
                out.write("\n".join(batch) + "\n")
                n += len(batch)
                batch.clear()
        if batch:
            out.write("\n".join(batch) + "\n")
            n += len(batch)
    return n


def write_ooms(path: Path, ooms: list[OomEvent], unforeseeable: set[int]) -> None:
    """One OOM a line, its place; `unforeseeable` (indices): marked so (docs/backtest.md, "OOMs")."""
    lines = []
    for i, oom in enumerate(ooms):
        flag = " unforeseeable" if i in unforeseeable else ""
        lines.append(f"{oom.t:.0f} gpu={oom.gpu} node={oom.node} target={oom.target}{flag}  # {oom.cause}")
    path.write_text("\n".join(lines) + ("\n" if lines else ""))
