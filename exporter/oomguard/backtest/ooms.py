"""The OOMs the alerts are judged against: a file (from logs, Kubernetes events, by hand), or oomguard's own events.

The file: one OOM a line, its time first (Unix seconds or RFC 3339), then optionally where it happened, as
`gpu=3`, `node=gpu-node-7`, `target=vllm-llama` (or bare: the GPU, then the node), and the word `unforeseeable` for
an OOM no monitor could have seen coming (one allocation far beyond any before it): it is not counted among the
incidents to page ahead of, and a page in the hour before it is a page for nothing. `#` starts a comment.

    2024-05-01T12:03:00Z gpu=3 node=gpu-node-7
    1714565000 3 gpu-node-7
    2024-05-02T08:00:00+02:00 target=vllm-llama
    2024-05-03T17:40:00Z gpu=1 node=gpu-node-2 unforeseeable   # a 200k-token prompt

An OOM with no place is the whole fleet's: every alert is judged against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from oomguard.backtest import BacktestError
from oomguard.backtest.history import parse_time
from oomguard.backtest.regular import read_regular
from oomguard.common.excerpt import excerpt

MAX_FILE_BYTES = 16 * 1024**2  # a million OOMs is no incident list
MAX_LINE_BYTES = 4096
UNFORESEEABLE = "unforeseeable"  # the word that marks an OOM so


@dataclass(frozen=True)
class Oom:
    t: float
    gpu: str = ""
    node: str = ""
    target: str = ""
    source: str = ""  # where it was read: "file line 3", "oomguard_target_events_total"
    unforeseeable: bool = False  # no monitor could have seen it coming: nothing is expected to page before it

    def place(self) -> str:
        parts = [f"GPU {self.gpu}" if self.gpu else "", f"node {self.node}" if self.node else "",
                 f"target {self.target}" if self.target else ""]  # fmt: skip
        return ", ".join(p for p in parts if p) or "the fleet"


def read_ooms(path: Path) -> list[Oom]:
    data = read_regular(path, "OOM list", MAX_FILE_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BacktestError(f"{path}: the OOM list is not UTF-8 text; save it as UTF-8") from None
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if len(line) > MAX_LINE_BYTES:
            raise BacktestError(f"{path} line {number}: longer than {MAX_LINE_BYTES} characters: is this an OOM list?")
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.replace(",", " ").split()
        try:
            t = parse_time(fields[0], "time")
        except BacktestError as exc:
            raise BacktestError(
                f"{path} line {number}: {exc}; a line is `TIME [gpu=G] [node=N] [target=T] [unforeseeable]`"
            ) from None
        places: dict[str, str] = {}
        bare = []
        unforeseeable = False
        for field in fields[1:]:
            if field.lower() == UNFORESEEABLE:
                unforeseeable = True
                continue
            key, eq, value = field.partition("=")
            if eq:
                if key not in ("gpu", "node", "target"):
                    raise BacktestError(
                        f"{path} line {number}: {excerpt(key, 40)!r}: a place is gpu=, node= or target="
                    )
                places[key] = excerpt(value, 120)
            else:
                bare.append(excerpt(field, 120))
        if len(bare) > 2:
            raise BacktestError(
                f"{path} line {number}: after the time, at most a GPU and a node (or gpu=, node=, target=)"
            )
        for key, value in zip(("gpu", "node"), bare, strict=False):
            places.setdefault(key, value)
        out.append(Oom(t, source=f"{path.name} line {number}", unforeseeable=unforeseeable, **places))
    out.sort(key=lambda o: o.t)
    return out
