"""The detection benchmark's library of GPU memory histories (library.py), made of realistic memory shapes
(shapes.py) on a simulated fleet (fleet.py), written as `oomguard backtest` reads them (write.py).

`generate(folder, seed)` writes every history with its OOM list and returns what each one expects of a monitor.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from detection.library import SPECS, T0, Spec, build
from detection.write import rows, write_history, write_ooms


class LibraryError(Exception):
    """A history that does not do what its spec says (a healthy one with an OOM): the library's bug, not the
    bundle's."""


@dataclass
class Expected:
    name: str
    kind: str
    summary: str
    style: str
    days: float
    slow: bool
    history: str
    ooms_file: str
    rows: int
    gpus: list[str]  # node/gpu
    ooms: list[dict] = field(default_factory=list)  # time, node, gpu, target, cause, unforeseeable


def generate(folder: Path, seed: int = 1, step: float = 30.0, only: list[str] | None = None) -> list[Expected]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for spec in SPECS:
        if only and spec.name not in only:
            continue
        out.append(_one(folder, spec, seed, step))
    (folder / "library.json").write_text(json.dumps([asdict(e) for e in out], indent=1))
    return out


def _one(folder: Path, spec: Spec, seed: int, step: float) -> Expected:
    built = build(spec, seed)
    fleet = built.fleet
    history = folder / f"{spec.name}.csv.gz"
    lines = (line for readings in fleet.run(T0, spec.days, step) for line in rows(spec.style, readings, spec.sleeps))
    n = write_history(history, spec.style, lines)
    ooms = fleet.ooms
    if spec.kind == "healthy" and ooms:
        raise LibraryError(f"{spec.name} (seed {seed}): healthy, yet {len(ooms)} OOMs, first {ooms[0]}")
    if spec.kind != "healthy" and not ooms:
        raise LibraryError(f"{spec.name} (seed {seed}): an {spec.kind} history with no OOM")
    unforeseeable = {i for i, o in enumerate(ooms) if o.sudden}
    if spec.kind == "incident" and all(o.cause == "spike" for o in ooms):
        raise LibraryError(f"{spec.name} (seed {seed}): no OOM of what grew, only spikes")
    ooms_file = folder / f"{spec.name}.ooms"
    write_ooms(ooms_file, ooms, unforeseeable)
    return Expected(
        name=spec.name,
        kind=spec.kind,
        summary=spec.summary,
        style=spec.style,
        days=spec.days,
        slow=spec.slow,
        history=history.name,
        ooms_file=ooms_file.name,
        rows=n,
        gpus=[f"{node}/{gpu}" for node, gpu in fleet.gpus],
        ooms=[
            {
                "time": o.t,
                "node": o.node,
                "gpu": o.gpu,
                "target": o.target,
                "cause": o.cause,
                "unforeseeable": i in unforeseeable,
            }
            for i, o in enumerate(ooms)
        ],
    )
