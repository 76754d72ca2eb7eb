"""The diagnoses as terminal text (verdict first), JSON, or an incident report (Markdown or HTML) with plots."""

from __future__ import annotations

import base64
import html
import io
import itertools
import json
import math
import time
from pathlib import Path

from oomguard.common import kinds
from oomguard.diagnose.core import Diagnosis
from oomguard.diagnose.evidence import QUESTIONS, Facts
from oomguard.diagnose.recommend import Recommendation
from oomguard.diagnose.verdict import confidence_label

PLOT_SIZE = (10.0, 8.0)  # inches; at PLOT_DPI: 1000 x 800 pixels
PLOT_DPI = 100


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + "Z" if t else "-"


def _value(value: float | str | None) -> str:
    return "unknown" if value is None else f"{value:g}" if isinstance(value, float | int) else str(value)


def _cells(r: Recommendation) -> list[str]:
    """The report's current and suggested cells; "-" for advice with no figure on either side."""
    if r.current is None and r.suggested is None:
        return ["-", "-"]
    return [_value(r.current), f"{_value(r.suggested)} {r.unit}".strip()]


def _change(r: Recommendation) -> str:
    """`max_num_seqs: 64 -> 11 sequences`; advice with no figure on either side (the leak, a liveness probe) is its
    name alone, and a setting diagnose cannot size says so rather than "unknown -> unknown"."""
    if r.current is None and r.suggested is None:
        return r.setting
    if r.suggested is None:
        return f"{r.setting}: {_value(r.current)} {r.unit}, not sized (below)".replace("  ", " ")
    return f"{r.setting}: {_value(r.current)} -> {_value(r.suggested)} {r.unit}".rstrip()


# ---- terminal text and JSON --------------------------------------------------------------------


def text(diagnoses: list[Diagnosis], source: str = "") -> str:
    lines = []
    for d in diagnoses:
        who = d.target or (f"GPU {','.join(d.gpus)}" if d.gpus else "-")
        where = f" on {d.instance}" if d.instance else ""
        lines.append(f"{d.verdict.upper()}  {who}{where}  (confidence {d.confidence:.2f}, "
                     f"{confidence_label(d.confidence)})")  # fmt: skip
        lines.append(f"  {d.summary}")
        step = 0
        for item in d.evidence:
            if item.step != step:
                step = item.step
                lines.append(f"  {step}. {QUESTIONS[step]}")
            at = f"  [{_when(item.at)}]" if item.at else ""
            lines.append(f"     - {item.finding}{at}")
        if d.recommendations:
            lines.append("  change:")
            for r in d.recommendations:
                lines.append(f"     - {_change(r)}")
                lines.append(f"       {r.why}")
        lines.append("")
    if source:
        lines.append(f"(read from {source}{_scale_note(diagnoses)})")
    return "\n".join(lines).rstrip() + "\n"


def _scale_note(diagnoses: list[Diagnosis]) -> str:
    scales = sorted({d.time_scale for d in diagnoses if d.time_scale != 1})
    return "".join(f"; durations in simulated time, clock {s:g}x faster than life" for s in scales)


def to_json(diagnoses: list[Diagnosis], *, source: str = "", start: float | None = None,
            end: float | None = None) -> str:  # fmt: skip
    body = {
        "source": source,
        "window": {"start": start, "end": end},
        "diagnoses": [d.json() for d in diagnoses],
    }
    return json.dumps(body, indent=2) + "\n"


# ---- the timeline, relative to the first OOM ---------------------------------------------------


def timeline(facts: Facts) -> tuple[float, list[tuple[float, str]]]:
    """(T+0, [(time, what)]): T+0 is the first OOM, else the window's start."""
    events: list[tuple[float, str]] = []

    def first(points, test, what: str) -> None:
        t = next((t for t, v in points if test(v)), None)
        if t is not None:
            events.append((t, what))

    # The bundle configuration's levels (thresholds.py): gpu_memory_high's and gpu_memory_critical's on the total, the
    # critical one on the headroom where a reservation is known (the state GpuMemoryCritical pages on).
    t = facts.thresholds
    first(facts.memory, lambda v: v > t.used_high, f"GPU memory past {_level(t.used_high)}")
    first(facts.memory, lambda v: v > t.used_critical, f"GPU memory past {_level(t.used_critical)}")
    headroom = facts.per_gpu_headroom.get(facts.worst_gpu or "")
    if headroom:
        first(headroom, lambda v: v > t.headroom_critical,
              f"GPU memory past {_level(t.headroom_critical)} of the headroom (GpuMemoryCritical's level)")  # fmt: skip
    first(facts.kv, lambda v: v >= t.kv_saturated, "KV cache saturated")
    first(facts.waiting, lambda v: v > t.queue_backlog, f"more than {t.queue_backlog:g} requests waiting")
    for state, t in facts.trend_states.items():
        if state in ("climbing", "spike", "saturated"):
            events.append((t, f"memory trend: {state}"))
    for kind, times in facts.events.items():
        events.extend((t, kind) for t in times)
    events.extend((t, "restart") for t in facts.restarts)
    previous = None
    for t, v in facts.states:
        up = v >= 1
        if previous is not None and up != previous:
            events.append((t, "engine up" if up else "engine not up"))
        previous = up
    ooms = facts.oom_times or facts.events.get(kinds.STARTUP_MEMORY, [])
    zero = ooms[0] if ooms else facts.start
    return zero, sorted(events)


def _level(ratio: float) -> str:
    return f"{100 * ratio:g} %"


def _minutes(t: float, zero: float, facts: Facts) -> float:
    """Minutes of the scenario's clock from T+0 (simulated minutes on a drill's compressed clock)."""
    return facts.clock.simulated(t - zero) / 60


def _rel(t: float, zero: float, facts: Facts) -> str:
    minutes = _minutes(t, zero, facts)
    return f"T{'+' if minutes >= 0 else '-'}{abs(minutes):.0f}"


# ---- plots -------------------------------------------------------------------------------------


class MissingExtra(ValueError):
    """A package of an extra is not installed; a ValueError, so `diagnose --report` says it in one line."""


# Reference lines (the reservation, the 90 % alert threshold, the cache's capacity) are drawn under the curves:
# a curve that runs along one (vLLM's use at its reservation, the running batch at the cache's capacity) stays seen.
REFERENCE_ZORDER = 1.0
CURVE_ZORDER = 3.0


def plot_png(facts: Facts, title: str = "") -> bytes:
    """The plot of plot_figure as a PNG."""
    fig = plot_figure(facts, title)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=PLOT_DPI)
    return buffer.getvalue()


def plot_figure(facts: Facts, title: str = ""):  # -> matplotlib.figure.Figure (an extra: not imported here)
    """Memory per GPU with the reservation line, KV cache use, waiting requests; OOMs and restarts marked."""
    try:
        import matplotlib
    except ImportError as exc:  # an extra: the node agent (and its image) runs without it
        raise MissingExtra(
            "the report's plots need matplotlib, oomguard's report extra: from a clone: .venv/bin/pip install -e "
            "'.[report]' (from a wheel or an index with oomguard: pip install 'oomguard[report]')"
        ) from exc

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    zero, _ = timeline(facts)

    def minutes(times):
        return [_minutes(t, zero, facts) for t in times]

    def x(points):
        # A series absent for a while (the engine down or loading) is drawn with a gap, not a line across it.
        steps = sorted(b[0] - a[0] for a, b in itertools.pairwise(points))
        gap = 3 * steps[len(steps) // 2] if steps else float("inf")
        times: list[float] = []
        values: list[float] = []
        for i, (t, v) in enumerate(points):
            if i and t - points[i - 1][0] > gap:
                times.append((t + points[i - 1][0]) / 2)
                values.append(math.nan)
            times.append(t)
            values.append(v)
        return minutes(times), values

    fig = Figure(figsize=PLOT_SIZE, dpi=PLOT_DPI)
    memory_ax, kv_ax, queue_ax = fig.subplots(3, 1, sharex=True, height_ratios=[2, 1, 1])
    for gpu, points in sorted(facts.per_gpu.items()):
        memory_ax.plot(*x(points), label=f"GPU {gpu} used", linewidth=1.4, zorder=CURVE_ZORDER)
    reserved = facts.reserved_ratio
    level = facts.thresholds.used_high  # the bundle's gpu_memory_high threshold (on the total)
    if reserved is not None and abs(reserved - level) < 0.005:
        # One line for both: two at the same height would hide one under the other.
        memory_ax.axhline(reserved, color="tab:orange", linestyle="--", zorder=REFERENCE_ZORDER,
                          label=f"engine reservation {reserved:g} = the {_level(level)} alert level")  # fmt: skip
    else:
        if reserved is not None:
            memory_ax.axhline(reserved, color="tab:orange", linestyle="--", zorder=REFERENCE_ZORDER,
                              label=f"engine reservation {reserved:g}")  # fmt: skip
        memory_ax.axhline(level, color="tab:red", linestyle=":", linewidth=1, zorder=REFERENCE_ZORDER,
                          label=f"{_level(level)} (alert)")  # fmt: skip
    memory_ax.set_ylim(0, 1.05)
    memory_ax.set_ylabel("GPU memory (share)")
    kv_ax.plot(*x(facts.kv), color="tab:purple", label="KV cache use", zorder=CURVE_ZORDER)
    kv_ax.set_ylim(0, 1.05)
    kv_ax.set_ylabel("KV cache")
    queue_ax.plot(*x(facts.waiting), color="tab:brown", label="waiting", zorder=CURVE_ZORDER)
    if facts.running:
        queue_ax.plot(*x(facts.running), color="tab:gray", linewidth=1.2, label="running", zorder=CURVE_ZORDER)
    held = facts.capacity_check.capacity
    if held is not None:
        # What the running batch can reach before the cache is full: running requests near it is the cache binding.
        queue_ax.axhline(held, color="tab:purple", linestyle="--", linewidth=1, zorder=REFERENCE_ZORDER,
                         label=f"KV cache holds ~{held:.0f} requests")  # fmt: skip
    queue_ax.set_ylabel("requests")
    unit = f"simulated minutes ({facts.clock.factor:g}x)" if facts.clock.compressed else "minutes"
    queue_ax.set_xlabel(f"{unit} from the first OOM" if facts.oom_times else f"{unit} from the window's start")
    for ax in (memory_ax, kv_ax, queue_ax):
        for t in facts.oom_times:
            ax.axvline(_minutes(t, zero, facts), color="red", alpha=0.5, linewidth=1)
        for t in facts.restarts:
            ax.axvline(_minutes(t, zero, facts), color="black", alpha=0.3, linestyle="--", linewidth=1)
        ax.grid(alpha=0.3)
    if facts.oom_times:
        memory_ax.plot(minutes(facts.oom_times), [1.02] * len(facts.oom_times), "rX",
                       markersize=9, label="OOM")  # fmt: skip
    if facts.restarts:
        memory_ax.plot(minutes(facts.restarts), [0.03] * len(facts.restarts), "k^",
                       markersize=7, label="restart")  # fmt: skip
    for ax in (memory_ax, kv_ax, queue_ax):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize=8)
    memory_ax.set_title(title)
    fig.tight_layout()
    return fig


# ---- the incident report -----------------------------------------------------------------------


def _sections(d: Diagnosis) -> list[tuple[str, list[str], list[list[str]] | None]]:
    """(heading, paragraphs, table rows) in the postmortem's shape, shared by Markdown and HTML."""
    out: list[tuple[str, list[str], list[list[str]] | None]] = []
    out.append(("What happened", [d.summary], None))
    if d.facts is not None and d.facts.history:
        zero, events = timeline(d.facts)
        rows = [["time", "UTC", "what"]] + [[_rel(t, zero, d.facts), _when(t), what] for t, what in events]
        note = "T+0 is the first OOM." if d.facts.oom_times else "No OOM: T+0 is the window's start."
        if d.facts.clock.compressed:
            note += (f" Times T+N in simulated minutes: the history ran on a clock {d.facts.clock.factor:g}x faster "
                     "than life (a drill); the UTC column is the real time.")  # fmt: skip
        out.append(("Timeline", [note], rows if events else None))
    out.append(("Root cause", [f"Verdict: **{d.verdict}**, confidence {d.confidence:.2f} "
                               f"({confidence_label(d.confidence)})."],
                [["criterion", "met"]] + [[k, "yes" if v else "no"] for k, v in d.criteria.items()]
                if d.criteria else None))  # fmt: skip
    rows = [["#", "question", "finding", "at"]] + [
        [str(i.step), QUESTIONS[i.step], i.finding, _when(i.at) if i.at else ""] for i in d.evidence
    ]
    out.append(("Evidence, in the postmortem's order", [], rows))
    if d.recommendations:
        rows = [["setting", "current", "suggested", "why"]] + [
            [r.setting, *_cells(r), r.why] for r in d.recommendations
        ]
        out.append(("What to change", [], rows))
    return out


def _title(d: Diagnosis) -> str:
    who = d.target or f"GPU {','.join(d.gpus)}"
    return f"{who}" + (f" on {d.instance}" if d.instance else "")


def markdown(diagnoses: list[Diagnosis], images: dict[int, str], source: str = "") -> str:
    """`images`: index of a diagnosis -> the PNG's file name beside the report."""
    lines = ["# Incident report: oomguard diagnose", ""]
    if source:
        lines += [f"Read from {source}{_scale_note(diagnoses)}.", ""]
    for n, d in enumerate(diagnoses):
        lines += [f"## {_title(d)}: {d.verdict}", ""]
        for heading, paragraphs, rows in _sections(d):
            lines += [f"### {heading}", ""]
            for p in paragraphs:
                lines += [p, ""]
            if rows:
                lines.append("| " + " | ".join(rows[0]) + " |")
                lines.append("|" + "---|" * len(rows[0]))
                lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows[1:]]
                lines.append("")
        if n in images:
            lines += ["### Plots", "", f"![{_title(d)}]({images[n]})", ""]
    return "\n".join(lines)


def html_report(diagnoses: list[Diagnosis], pngs: dict[int, bytes], source: str = "") -> str:
    esc = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>oomguard diagnose</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}</style></head><body>",
             "<h1>Incident report: oomguard diagnose</h1>"]  # fmt: skip
    if source:
        parts.append(f"<p>Read from {esc(source + _scale_note(diagnoses))}.</p>")
    for n, d in enumerate(diagnoses):
        parts.append(f"<h2>{esc(_title(d))}: {esc(d.verdict)}</h2>")
        for heading, paragraphs, rows in _sections(d):
            parts.append(f"<h3>{esc(heading)}</h3>")
            parts += [f"<p>{esc(p).replace('**', '')}</p>" for p in paragraphs]
            if rows:
                parts.append("<table><tr>" + "".join(f"<th>{esc(c)}</th>" for c in rows[0]) + "</tr>")
                parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows[1:]]
                parts.append("</table>")
        if n in pngs:
            data = base64.b64encode(pngs[n]).decode()
            parts.append(f"<h3>Plots</h3><img alt='{esc(_title(d))}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def report_format(path: Path) -> str:
    """The format, md or html, from the name; ValueError otherwise (diagnose checks it before reading anything)."""
    suffix = path.suffix.lower()
    if suffix in (".md", ".markdown"):
        return "md"
    if suffix in (".html", ".htm"):
        return "html"
    raise ValueError(f"--report {path}: end the name with .md or .html to choose the format")


def write_report(path: Path, diagnoses: list[Diagnosis], source: str = "") -> list[Path]:
    """Markdown (.md) with PNGs beside it, or HTML (.html/.htm) with them embedded. Returns the files written."""
    html_format = report_format(path) == "html"
    pngs = {
        n: plot_png(d.facts, f"{_title(d)}: {d.verdict}")
        for n, d in enumerate(diagnoses)
        if d.facts is not None and d.facts.history and d.facts.memory
    }
    if html_format:
        path.write_text(html_report(diagnoses, pngs, source), encoding="utf-8")
        return [path]
    written = [path]
    names: dict[int, str] = {}
    for n, png in pngs.items():
        image = path.with_name(f"{path.stem}-{n + 1}.png")
        image.write_bytes(png)
        names[n] = image.name
        written.append(image)
    path.write_text(markdown(diagnoses, names, source), encoding="utf-8")
    return written
