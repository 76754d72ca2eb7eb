"""Writes the example history that the README's `oomguard backtest` runs on: history.csv.gz and ooms.txt here.

A day (2024-05-01, UTC) of one node with four 80 GB GPUs every 15 s, a vLLM engine on each at
gpu_memory_utilization 0.9, in the columns of docs/backtest.md ("The history as a file"): GPU memory as NVML gives it
and the engine's own figures (KV cache, queue, preemptions, its reservation) from its /metrics. The day's traffic
rises in the morning and falls at night. Two OOMs, each followed by the engine's restart (its GPU empty for two
minutes, then the model's load; the history gives no state, so the backtest infers the load):

- GPU 2 at 14:45: memory beyond the reservation leaks from 14:00 (a fragmenting allocator), to full: foreseeable,
  the alerts should page before it;
- GPU 1 at 19:20: one 120k-token prompt at once, memory flat before it: marked `unforeseeable` in the OOM list.

GPUs 0 and 3 stay healthy all day. The same numbers every run (no randomness; gzip's header without a time):

    .venv/bin/python examples/backtest/write.py [FOLDER]
"""

from __future__ import annotations

import gzip
import math
import sys
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
T0 = 1_714_521_600  # 2024-05-01 00:00:00 UTC
STEP = 15
HOURS = 24
NODE = "gpu-node-1"
GPUS = 4
TOTAL = 85_520_809_984  # an 80 GB H100 as NVML counts it (81,559 MiB)
RESERVATION = 0.9
CONTEXT = 600 * 2**20  # the CUDA context and what PyTorch keeps outside its reservation
LEAK = (2, 14 * 3600, 14 * 3600 + 45 * 60)  # GPU, from, OOM (seconds into the day)
SPIKE = (1, 19 * 3600 + 20 * 60)  # GPU, OOM
DOWN, LOAD = 120, 90  # seconds without a process after an OOM, then the model's load
COLUMNS = ("time,node,gpu,used_bytes,total_bytes,target,kv_cache_usage,waiting,running,preemptions_total,"
           "gpu_memory_utilization")  # fmt: skip


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _traffic(t: float, gpu: int) -> float:
    """0-1: busy from the morning to the evening, quiet at night, each engine a little apart."""
    day = 0.5 - 0.5 * math.cos(2 * math.pi * (t - 4 * 3600) / 86400)
    return min(1.0, max(0.0, 0.1 + 0.8 * day + 0.05 * math.sin(t / 370 + gpu) + 0.03 * math.sin(t / 53 + 2 * gpu)))


def _since_oom(t: float, gpu: int) -> float | None:
    """Seconds since this GPU's engine died of its OOM, or None where it has not."""
    ooms = [oom for g, _, oom in (LEAK,) if g == gpu] + [oom for g, oom in (SPIKE,) if g == gpu]
    past = [t - oom for oom in ooms if t >= oom]
    return min(past) if past else None


def rows() -> list[str]:
    lines = []
    steady = RESERVATION * TOTAL + CONTEXT
    preemptions = [0.0] * GPUS
    for i in range(HOURS * 3600 // STEP):
        t = i * STEP
        for gpu in range(GPUS):
            load = _traffic(t, gpu)
            used = steady + 40 * 2**20 * math.sin(t / 97 + gpu)  # the allocator's cache breathing
            gone = _since_oom(t, gpu)
            figures = True
            if gone is not None and gone < DOWN + LOAD:  # dead, then loading: no /metrics
                figures = False
                used = 0.0 if gone < DOWN else steady * min(1.0, (gone - DOWN) / LOAD)
                if gone < DOWN + STEP:
                    preemptions[gpu] = 0.0  # a new process: its counter starts again
            elif gpu == LEAK[0] and LEAK[1] <= t < LEAK[2]:
                used += (TOTAL - steady) * ((t - LEAK[1]) / (LEAK[2] - LEAK[1])) ** 1.3
            kv = 0.08 + 0.85 * load
            if kv > 0.85:
                preemptions[gpu] += (kv - 0.85) * 4
            engine = (
                f"{kv:.3f},{max(0, round(30 * (load - 0.8)))},{round(2 + 30 * load)},{int(preemptions[gpu])},"
                f"{RESERVATION}"
                if figures
                else ",,,,"
            )
            lines.append(f"{_stamp(T0 + t)},{NODE},{gpu},{used:.0f},{TOTAL},llm/vllm-{gpu},{engine}")
    return lines


def ooms() -> list[str]:
    return [
        "# The engines' logs: torch.OutOfMemoryError, then the pod's restart",
        f"{_stamp(T0 + LEAK[2])} gpu={LEAK[0]} node={NODE}",
        f"{_stamp(T0 + SPIKE[1])} gpu={SPIKE[0]} node={NODE} unforeseeable   # a 120k-token prompt at once",
    ]


def write(folder: Path) -> tuple[Path, Path]:
    history, oom_list = folder / "history.csv.gz", folder / "ooms.txt"
    text = "\n".join([COLUMNS, *rows()]) + "\n"
    with history.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as out:
        out.write(text.encode())
    oom_list.write_text("\n".join(ooms()) + "\n", encoding="utf-8")
    return history, oom_list


if __name__ == "__main__":
    for path in write(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(f"wrote {path} ({path.stat().st_size:,} bytes)")
