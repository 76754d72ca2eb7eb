"""What the backtest found: per OOM, each alert that fired before it and its lead; pages and tickets outside any
incident, per GPU-day judged; the GPUs never judged. As text, JSON, and (the `report` extra) a plot per incident.

An incident is the time from `before` (60 minutes by default) ahead of an OOM to `after` (30 minutes) past it:
what fires then is that OOM's warning or its aftermath (the restart loop), never a false alarm. An alert counts
for an OOM where their places meet: the OOM's GPU (or its node's, or its engine's GPUs) and the alert's GPU (or its
engine's GPUs); an OOM or an alert without a place meets every one. Alerts are counted as episodes of one alert on
one series, firing to resolved, as Prometheus' ALERTS series shows them: before Alertmanager's grouping and
inhibition, so a ticket a page silences is still counted (an upper bound of what reaches the queue).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from oomguard.backtest import BacktestError
from oomguard.backtest.notifications import Notifications
from oomguard.backtest.ooms import Oom
from oomguard.backtest.replay import ReplaySummary
from oomguard.backtest.rules import Episode
from oomguard.exporter.model import GpuKey

DAY = 86400.0


@dataclass(frozen=True)
class Window:
    before: float = 3600.0
    after: float = 1800.0


@dataclass
class Lead:
    alert: str
    receiver: str  # page, ticket, or "" (info: routed nowhere)
    fired_at: float
    lead_seconds: float
    labels: dict[str, str]


@dataclass
class OomResult:
    oom: Oom
    leads: list[Lead]  # each alert's earliest firing counted for the OOM (judge's rules)
    relapse_of: Oom | None = None  # within `after` of an earlier OOM of its place: that incident's relapse
    early: list[Lead] = field(default_factory=list)  # pages that fired before the incident and still fired: outside

    @property
    def first_page(self) -> Lead | None:
        pages = [lead for lead in self.leads if lead.receiver == "page"]
        return max(pages, key=lambda lead: lead.lead_seconds) if pages else None

    @property
    def first_alert(self) -> Lead | None:
        return max(self.leads, key=lambda lead: lead.lead_seconds) if self.leads else None


@dataclass
class Outcome:
    """The figures a sweep compares: how many OOMs were paged ahead, how early, how many pages for nothing."""

    ooms: int
    incidents: int  # OOMs that are no relapse of an earlier one
    paged: int  # incidents paged before their first OOM
    median_page_lead: float | None
    false_pages: int
    false_tickets: int
    gpu_days: float
    flapping_pages: int = 0  # of the false pages, those that were the same alert firing again within 10 minutes
    flapping_tickets: int = 0
    unforeseeable: int = 0  # incidents marked unforeseeable (not among `incidents`)

    @property
    def false_pages_per_gpu_day(self) -> float | None:
        return self.false_pages / self.gpu_days if self.gpu_days > 0 else None

    @property
    def false_tickets_per_gpu_day(self) -> float | None:
        return self.false_tickets / self.gpu_days if self.gpu_days > 0 else None


@dataclass
class Report:
    source: str
    start: float
    end: float
    steps: int
    step_seconds: float
    evaluation_seconds: float
    bundle: str
    window: Window
    ooms: list[OomResult]
    false_alarms: list[Episode]  # fired outside every incident of their place
    summary: ReplaySummary
    outcome: Outcome
    problems: list[str] = field(default_factory=list)
    sweep: list[dict[str, Any]] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    episodes: dict[str, list[Episode]] = field(default_factory=dict)  # every alert's, fired or pending only
    notifications: Notifications | None = None  # what the shipped routing would have sent (notifications.py)

    # -- text -----------------------------------------------------------------------------------------
    def text(self) -> str:
        lines = [*self._heading(), *self._oom_lines(), *self._outside_lines()]
        if self.notifications is not None:
            lines += ["", *self.notifications.text()]
        lines += self._unjudged_lines()
        if self.sweep:
            lines += ["", *sweep_text(self.sweep)]
        if self.plots:
            lines += ["", "Plots:", *[f"  {p}" for p in self.plots]]
        if self.problems or self.notes:
            lines += ["", "Notes:", *[f"  {p}" for p in [*self.problems, *self.notes]]]
        return "\n".join(lines) + "\n"

    def _heading(self) -> list[str]:
        """What was replayed: the history's span, its GPUs and engines, the rules and the incident window."""
        s = self.summary
        nodes = {key[0] for key in s.gpus}
        return [
            f"oomguard backtest of {self.source}",
            f"  {_time(self.start)} to {_time(self.end)} ({(self.end - self.start) / DAY:.1f} days, {self.steps:,} "
            f"readings every {self.step_seconds:g} s), {len(s.gpus)} GPUs on {len(nodes)} node{'s' * (len(nodes) != 1)}"
            f", {len(s.targets)} engine{'s' * (len(s.targets) != 1)}",
            f"  rules: {self.bundle}, evaluated every {self.evaluation_seconds:g} s; an incident: "
            f"{_minutes(self.window.before)} before an OOM to {_minutes(self.window.after)} after it",
            "",
        ]

    def _oom_lines(self) -> list[str]:
        """The OOMs: how many were paged ahead, then each with what fired before it."""
        if not self.ooms:
            return ["No OOMs given (--ooms FILE) nor found in the history: every alert below is counted as false.", ""]
        o = self.outcome
        lead = f", a median {_minutes(o.median_page_lead)} ahead" if o.median_page_lead is not None else ""
        unforeseeable = f" ({o.unforeseeable} more marked unforeseeable)" if o.unforeseeable else ""
        lines = [
            f"OOMs: {o.ooms} in {o.incidents} incident{'s' * (o.incidents != 1)}{unforeseeable}, paged within the "
            f"hour before their first OOM: {o.paged} of {o.incidents}{lead}"
        ]
        for result in self.ooms:
            lines += _oom_result_lines(result)
        return lines

    def _outside_lines(self) -> list[str]:
        """The pages and tickets outside every incident, their rate per GPU-day and their flaps."""
        o = self.outcome
        lines = ["", f"Outside incidents ({o.gpu_days:.2f} GPU-days judged):"]
        for receiver, count, rate, flapping in (
            ("pages", o.false_pages, o.false_pages_per_gpu_day, o.flapping_pages),
            ("tickets", o.false_tickets, o.false_tickets_per_gpu_day, o.flapping_tickets),
        ):
            mine = [e for e in self.false_alarms if e.receiver == receiver.rstrip("s")]
            by = _count_by_alert([e for e in mine if not e.flap])
            per = f" ({rate:.2f} per GPU-day)" if rate is not None else ""
            lines.append(f"  {receiver}: {count}{per}" + (f", first firings: {by}" if by else ""))
            if flapping:
                lines.append(f"    of them {flapping} flaps (fired again within {FLAP_SECONDS / 60:.0f} min of "
                             f"resolving): {_count_by_alert([e for e in mine if e.flap])}")  # fmt: skip
        return lines

    def _unjudged_lines(self) -> list[str]:
        """The GPUs never judged, and those judged on their total alone (no engine reservation known)."""
        s = self.summary
        never = [c for c in s.gpus.values() if c.measured == 0]
        total_only = [c for c in s.gpus.values() if c.measured and not c.headroom]
        lines: list[str] = []
        if never:
            lines += ["", "GPUs never judged (their figures missing):"]
            lines += [f"  {_gpu(c.node, c.name)}: no {' and no '.join(sorted(c.missing)) or 'reading'}" for c in never]
        if total_only:
            lines += [
                "",
                f"GPUs judged on their total, no engine reservation known: {len(total_only)} of {len(s.gpus)} "
                f"({', '.join(_gpu(c.node, c.name) for c in total_only[:8])}{', ...' if len(total_only) > 8 else ''}); "
                "a vLLM at gpu_memory_utilization 0.9 looks 90 % full all day to them: give the engines' "
                "gpu_memory_utilization in the history, or --gpu-memory-utilization",
            ]
        return lines

    # -- JSON -----------------------------------------------------------------------------------------
    def json(self) -> str:
        s = self.summary
        o = self.outcome
        data = {
            "source": self.source,
            "start": self.start,
            "end": self.end,
            "steps": self.steps,
            "step_seconds": self.step_seconds,
            "evaluation_interval_seconds": self.evaluation_seconds,
            "bundle": self.bundle,
            "incident_window": {"before_seconds": self.window.before, "after_seconds": self.window.after},
            "ooms": [
                {
                    "time": r.oom.t,
                    "gpu": r.oom.gpu,
                    "node": r.oom.node,
                    "target": r.oom.target,
                    "source": r.oom.source,
                    "relapse_of": None if r.relapse_of is None else r.relapse_of.t,
                    "unforeseeable": r.oom.unforeseeable,
                    "first_page": _lead(r.first_page),
                    "first_alert": _lead(r.first_alert),
                    "alerts": [_lead(lead) for lead in sorted(r.leads, key=lambda lead: -lead.lead_seconds)],
                    "early_pages": [_lead(lead) for lead in sorted(r.early, key=lambda lead: -lead.lead_seconds)],
                }
                for r in self.ooms
            ],
            "outside_incidents": {
                "gpu_days": o.gpu_days,
                "pages": o.false_pages,
                "pages_per_gpu_day": o.false_pages_per_gpu_day,
                "tickets": o.false_tickets,
                "tickets_per_gpu_day": o.false_tickets_per_gpu_day,
                "flapping_pages": o.flapping_pages,
                "flapping_tickets": o.flapping_tickets,
                "alerts": [_episode(e) for e in self.false_alarms],
            },
            "notifications": None if self.notifications is None else self.notifications.json(),
            # Every episode that fired, each with how it was counted: a lead of the OOM at `oom`, its aftermath, an
            # early page before it, or outside incidents.
            "episodes": [
                _episode(e)
                for e in sorted(
                    (e for eps in self.episodes.values() for e in eps if e.fired_at is not None),
                    key=lambda e: (e.fired_at, e.alert),
                )
            ],
            "summary": {
                "ooms": o.ooms,
                "incidents": o.incidents,
                "unforeseeable": o.unforeseeable,
                "incidents_paged_before": o.paged,
                "median_first_page_lead_seconds": o.median_page_lead,
            },
            "gpus": [
                {
                    "node": c.node,
                    "gpu": c.name,
                    "label": c.label,
                    "first": c.first,
                    "last": c.last,
                    "readings": c.steps,
                    "judged": c.measured,
                    "judged_on_headroom": c.headroom,
                    "judged_seconds": c.judged_seconds,
                    "missing": sorted(c.missing),
                    "targets": sorted(c.targets),
                }
                for c in s.gpus.values()
            ],
            "never_judged": [
                {"node": c.node, "gpu": c.name, "missing": sorted(c.missing)}
                for c in s.gpus.values()
                if c.measured == 0
            ],
            "problems": self.problems,
            "notes": self.notes,
            "sweep": self.sweep,
            "plots": self.plots,
        }
        return json.dumps(data, indent=2)


def _oom_result_lines(result: OomResult) -> list[str]:
    """One OOM: its time and place, what paged before it (or why nothing did), and each alert that would have
    reached someone before it, the earliest first."""
    page = result.first_page
    head = f"  {_time(result.oom.t)}  {result.oom.place()}: "
    if result.relapse_of is not None:
        head += f"(a relapse, {_minutes(result.oom.t - result.relapse_of.t)} after the OOM before it) "
    if result.oom.unforeseeable:
        head += "(unforeseeable: a page before it counts as one for nothing) "
    if page is not None:
        head += f"paged {_minutes(page.lead_seconds)} before ({page.alert})"
    elif result.early:
        head += "paged only long before (counted outside incidents)"
    elif any(lead.receiver for lead in result.leads):
        head += "no page before it, only tickets"
    elif result.leads:
        head += "nothing that reaches anyone fired before it (info only)"
    else:
        head += "nothing fired before it"
    lines = [head]
    # Info alerts reach no one (the JSON has them): the lines are what would have reached someone.
    for lead in sorted((x for x in result.leads if x.receiver), key=lambda lead: -lead.lead_seconds):
        lines.append(f"      {lead.alert:<36} {lead.receiver:<7} {_minutes(lead.lead_seconds)} before")
    for lead in sorted(result.early, key=lambda lead: -lead.lead_seconds):
        lines.append(f"      {lead.alert:<36} {lead.receiver:<7} {_minutes(lead.lead_seconds)} before: early, "
                     "counted outside incidents")  # fmt: skip
    return lines


def _lead(lead: Lead | None) -> dict[str, Any] | None:
    if lead is None:
        return None
    return {"alert": lead.alert, "receiver": lead.receiver, "fired_at": lead.fired_at,
            "lead_seconds": lead.lead_seconds, "labels": lead.labels}  # fmt: skip


def _episode(e: Episode) -> dict[str, Any]:
    return {"alert": e.alert, "receiver": e.receiver, "severity": e.severity, "active_at": e.active_at,
            "fired_at": e.fired_at, "resolved_at": e.resolved_at, "counted_as": e.counted_as, "oom": e.oom,
            "flap": e.flap, "labels": e.labels}  # fmt: skip


def _count_by_alert(episodes: list[Episode]) -> str:
    counts: dict[str, int] = {}
    for e in episodes:
        counts[e.alert] = counts.get(e.alert, 0) + 1
    return ", ".join(f"{name} {n}" for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if abs(seconds) >= 5400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min"


def _gpu(node: str, name: str) -> str:
    return f"{node}/GPU {name}" if node else f"GPU {name}"


# -- judging ----------------------------------------------------------------------------------------------
class Places:
    """Which GPUs an alert or an OOM is about, by the replay's names (summary.gpus, summary.targets)."""

    def __init__(self, summary: ReplaySummary) -> None:
        self.summary = summary
        self._by_name: dict[str, set[GpuKey]] = {}
        for key, cover in summary.gpus.items():
            self._by_name.setdefault(cover.name, set()).add(key)
            self._by_name.setdefault(cover.label, set()).add(key)

    def of_episode(self, labels: dict[str, str]) -> set[GpuKey] | None:
        if "gpu" in labels:
            return {(labels.get("node", ""), labels["gpu"])}
        target = labels.get("target")
        if target:
            return set(self.summary.targets.get(target, ()))
        return None

    def of_oom(self, oom: Oom) -> set[GpuKey] | None:
        if oom.gpu:
            keys = self._by_name.get(oom.gpu, set())
            keys = {k for k in keys if not oom.node or k[0] == oom.node} or {(oom.node, oom.gpu)}
            # The engine dies whole (a tensor-parallel group with the rank that ran out): its other GPUs are its place.
            return keys | set(self.summary.targets.get(oom.target, ())) if oom.target else keys
        if oom.target:
            return set(self.summary.targets.get(oom.target, ())) or None
        if oom.node:
            return {k for k in self.summary.gpus if k[0] == oom.node}
        return None

    def meet(self, labels: dict[str, str], oom: Oom, oom_keys: set[GpuKey] | None) -> bool:
        if oom.target and labels.get("target") == oom.target:
            return True
        mine = self.of_episode(labels)
        if mine is None or oom_keys is None:
            return True
        return bool(mine & oom_keys)


FLAP_SECONDS = 600.0  # an alert that fires again this soon after resolving, on the same series, is a flap


def judge(
    episodes: dict[str, list[Episode]], ooms: list[Oom], summary: ReplaySummary, window: Window
) -> tuple[list[OomResult], list[Episode], Outcome]:
    """Each episode counted once: as a warning of an OOM (a lead), as its aftermath, or as an alarm for nothing.

    - A page is an OOM's lead where it fired within `window.before` ahead of it, at its place, since the OOM before it
      there (what fired before that was that one's warning, unless it kept firing through into this incident: the
      same incident, never closed). A page that fired earlier and kept firing woke someone when nothing was within
      the hour: it counts outside incidents, and the OOM lists it as early.
    - A ticket is an OOM's lead however early it fired (a ticket is meant to say days ahead), since the OOM before it
      there, as long as it still fired at the incident's start (`window.before` ahead).
    - An OOM marked unforeseeable excuses nothing before it: a page in its hour before came by chance.
    - What fired within `window.after` past an OOM of its place is its aftermath (the restart loop).
    - Everything else fired outside incidents: the alarms for nothing, flaps among them (FLAP_SECONDS).

    An OOM within `window.after` of an earlier one of its place is that incident's relapse: the incident's paging is
    judged at its first OOM."""
    places = Places(summary)
    fired = sorted((e for eps in episodes.values() for e in eps if e.fired_at is not None), key=lambda e: e.fired_at)
    for e in fired:
        e.counted_as, e.oom, e.flap = "", None, False
    oom_keys = [places.of_oom(oom) for oom in ooms]
    results = []
    counted: set[int] = set()  # id() of the episodes counted as a lead
    for index, (oom, keys) in enumerate(zip(ooms, oom_keys, strict=True)):
        earlier = [o for o, k in zip(ooms[:index], oom_keys[:index], strict=True) if _overlap(keys, k) and o.t < oom.t]
        incident = _Incident(oom, keys, max((o.t for o in earlier), default=None), oom.t - window.before)
        for e in fired:
            _count_before(e, incident, places, counted)
        relapse_of = next((o for o in reversed(earlier) if oom.t - o.t <= window.after), None)
        results.append(OomResult(oom, list(incident.earliest.values()), relapse_of, list(incident.early.values())))
    false = _outside_incidents(fired, counted, ooms, oom_keys, places, window)
    flapped = flaps(false)
    for e in false:
        e.flap = id(e) in flapped
    return results, false, _outcome(results, false, ooms, summary)


@dataclass
class _Incident:
    """One OOM as `judge` weighs what fired before it: its place, the OOM before it there, the incident's start, and
    the leads and early pages found, each alert's earliest."""

    oom: Oom
    keys: set[GpuKey] | None
    previous: float | None  # the time of the OOM before it at its place
    start: float  # window.before ahead of it
    earliest: dict[str, Lead] = field(default_factory=dict)
    early: dict[str, Lead] = field(default_factory=dict)


def _count_before(e: Episode, incident: _Incident, places: Places, counted: set[int]) -> None:
    """An episode that fired before the incident's OOM at its place: a lead, an early page, the OOM before it's, or
    nothing (see `judge`)."""
    oom, start = incident.oom, incident.start
    assert e.fired_at is not None
    if e.fired_at > oom.t or not e.receiver or not places.meet(e.labels, oom, incident.keys):
        return
    lead = Lead(e.alert, e.receiver, e.fired_at, oom.t - e.fired_at, e.labels)
    if incident.previous is not None and e.fired_at <= incident.previous:
        # The OOM before it's, unless it never stopped firing since: the incident never closed (the engine
        # relaunched into the same load and ran out again), and this OOM was paged all along. It counts here
        # as it counted there: a lead, or an early page (outside incidents: never a lead too).
        if e.resolved_at is None or e.resolved_at >= start:
            if id(e) in counted:
                _keep_earliest(incident.earliest, lead)
            elif e.oom is not None:
                _keep_earliest(incident.early, lead)
        return
    if e.receiver == "page":
        if e.fired_at < start:
            if e.resolved_at is None or e.resolved_at >= start:
                _keep_earliest(incident.early, lead)  # paged hours ahead: counted outside, shown here
                e.oom = e.oom if e.oom is not None else oom.t
            return
        if oom.unforeseeable:
            return  # nothing to see: a page for nothing (counted outside), not a lead
    elif e.resolved_at is not None and e.resolved_at < start:
        return  # a ticket that ended before the incident began warned of nothing here
    if id(e) not in counted:
        counted.add(id(e))
        e.counted_as, e.oom = "lead", oom.t
    _keep_earliest(incident.earliest, lead)


def _outside_incidents(
    fired: list[Episode], counted: set[int], ooms: list[Oom], oom_keys: list[set[GpuKey] | None], places: Places,
    window: Window,
) -> list[Episode]:  # fmt: skip
    """The pages and tickets that were no lead: an OOM's aftermath, else alarms for nothing (early or outside)."""
    false = []
    for e in fired:
        assert e.fired_at is not None
        if id(e) in counted or e.receiver not in ("page", "ticket"):
            continue
        after = next(
            (oom for oom, keys in zip(ooms, oom_keys, strict=True)
             if oom.t <= e.fired_at <= oom.t + window.after and places.meet(e.labels, oom, keys)),
            None,
        )  # fmt: skip
        if after is not None:
            e.counted_as, e.oom = "aftermath", after.t
        else:
            e.counted_as = "early" if e.oom is not None else "outside"
            false.append(e)
    return false


def _outcome(results: list[OomResult], false: list[Episode], ooms: list[Oom], summary: ReplaySummary) -> Outcome:
    """The figures of the backtest: incidents paged ahead, and alarms for nothing per GPU-day (flaps marked)."""
    flapped = {id(e) for e in false if e.flap}
    gpu_days = sum(c.judged_seconds for c in summary.gpus.values()) / DAY
    firsts = [r for r in results if r.relapse_of is None and not r.oom.unforeseeable]
    leads = [r.first_page.lead_seconds for r in firsts if r.first_page is not None]
    return Outcome(
        ooms=len(ooms),
        incidents=len(firsts),
        paged=len(leads),
        median_page_lead=statistics.median(leads) if leads else None,
        false_pages=sum(1 for e in false if e.receiver == "page"),
        false_tickets=sum(1 for e in false if e.receiver == "ticket"),
        gpu_days=gpu_days,
        flapping_pages=sum(1 for e in false if e.receiver == "page" and id(e) in flapped),
        flapping_tickets=sum(1 for e in false if e.receiver == "ticket" and id(e) in flapped),
        unforeseeable=sum(1 for r in results if r.relapse_of is None and r.oom.unforeseeable),
    )


def _keep_earliest(held: dict[str, Lead], lead: Lead) -> None:
    found = held.get(lead.alert)
    if found is None or lead.fired_at < found.fired_at:
        held[lead.alert] = lead


def flaps(episodes: list[Episode]) -> set[int]:
    """id() of the episodes that fired within FLAP_SECONDS of the same alert's episode before them on the same
    series resolving: the alert flapping at its line, not a new alarm."""
    last: dict[tuple[str, tuple[tuple[str, str], ...]], float | None] = {}
    out = set()
    for e in sorted(episodes, key=lambda e: e.fired_at or e.active_at):
        key = (e.alert, tuple(sorted(e.labels.items())))
        resolved = last.get(key)
        if key in last and resolved is not None and e.fired_at is not None and e.fired_at - resolved <= FLAP_SECONDS:
            out.add(id(e))
        last[key] = e.resolved_at
    return out


def _overlap(a: set[GpuKey] | None, b: set[GpuKey] | None) -> bool:
    return a is None or b is None or bool(a & b)


# -- sweep table ----------------------------------------------------------------------------------------------
def sweep_text(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["Sweep: each row changes one alert's setting, the rest as configured (* the configuration's own):",
             f"  {'alert':<22} {'setting':<34} {'paged':>7} {'lead (median)':>14} {'pages/GPU-day':>14} "
             f"{'tickets/GPU-day':>16}"]  # fmt: skip
    for row in rows:
        rate = row["false_pages_per_gpu_day"]
        tickets = row["false_tickets_per_gpu_day"]
        lines.append(
            f"{'*' if row['configured'] else ' '} {row['alert']:<22} {row['setting']:<34} "
            f"{row['paged']:>3}/{row['ooms']:<3} {_minutes(row['median_first_page_lead_seconds']):>14} "
            f"{'-' if rate is None else f'{rate:.2f}':>14} {'-' if tickets is None else f'{tickets:.2f}':>16}"
        )
    return lines


# -- plots ----------------------------------------------------------------------------------------------------
def write_plots(directory: Path, report: Report, memory: dict[int, dict[str, list[tuple[float, float]]]]) -> list[str]:
    """One PNG per OOM: the memory of its GPUs around it, each alert's firing marked. `memory`: OOM index -> series
    name -> points. Needs matplotlib (the `report` extra)."""
    try:
        import matplotlib
    except ImportError:
        raise BacktestError(
            "--plot needs matplotlib, oomguard's report extra: from a clone: .venv/bin/pip install -e '.[report]' "
            "(from a wheel or an index with oomguard: pip install 'oomguard[report]'), or leave out --plot"
        ) from None
    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BacktestError(f"--plot {directory}: cannot make the folder: {exc.strerror}") from None
    written = []
    colours = {"page": "tab:red", "ticket": "tab:orange", "": "tab:gray"}
    for index, result in enumerate(report.ooms):
        figure = Figure(figsize=(10, 4.5))
        axes = figure.add_subplot()
        oom = result.oom.t
        for name, points in sorted(memory.get(index, {}).items()):
            if points:
                axes.plot([(t - oom) / 60 for t, _ in points], [v * 100 for _, v in points], label=name, linewidth=1.2)
        left = -report.window.before / 60
        routed = sorted((lead for lead in result.leads if lead.receiver), key=lambda lead: -lead.lead_seconds)
        for n, lead in enumerate(routed):
            x = max(left, -lead.lead_seconds / 60)  # fired before the window: drawn at its edge, its lead said
            name = lead.alert.removeprefix("OomGuard")
            if x == left and -lead.lead_seconds / 60 < left:
                name += f" ({_minutes(lead.lead_seconds)} before)"
            axes.axvline(x, color=colours.get(lead.receiver, "tab:gray"), linestyle="--", linewidth=1)
            axes.annotate(f"{name} ({lead.receiver})", (x, 0.97 - 0.09 * (n % 8)), xycoords=("data", "axes fraction"),
                          fontsize=7, ha="right", va="top", color=colours.get(lead.receiver, "tab:gray"))  # fmt: skip
        axes.set_xlim(left, report.window.after / 60)
        axes.axvline(0, color="black", linewidth=2, label="OOM")
        axes.set_xlabel("minutes from the OOM")
        axes.set_ylabel("% (used of total, or of the headroom)")
        axes.set_title(f"OOM at {_time(oom)}, {result.oom.place()}", fontsize=10)
        axes.legend(fontsize=7, loc="lower left")
        axes.grid(alpha=0.3)
        path = directory / f"oom-{index + 1:03d}-{datetime.fromtimestamp(oom, UTC):%Y%m%dT%H%M%S}.png"
        try:
            figure.savefig(path, dpi=100, bbox_inches="tight")
        except OSError as exc:
            raise BacktestError(f"--plot {directory}: cannot write {path.name}: {exc.strerror}") from None
        written.append(str(path))
    return written
