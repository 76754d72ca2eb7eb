"""The bundle's own alert rules, evaluated over the replayed history as Prometheus evaluates them.

The rules are rendered from the user's bundle configuration by bundle/generate.py, the text `oomguard generate`
writes; the one change is the selector, which selects the replayed series (replay.SELECTOR) instead of the user's
scrape job. Of them, the groups judged on memory and the engines' figures are evaluated (EVALUATED): the others are
about what already happened (an OOM in a log, a restart: the incident itself) or about the exporter's own health,
whose series no history of GPU memory has.

Each alert's expression is evaluated by a real Prometheus (tsdb.py) as a range query at the rule group's
evaluation interval (its `interval:`, else the one given: Prometheus' global evaluation_interval), which is what
the rule manager computes at each evaluation: the same instant query, on the same grid. Then `for:` (and
`keep_firing_for:`) is applied as Prometheus' alerting rule does it (rules/alerting.go, `Eval`): a series present
at an evaluation where none was active becomes pending, active from that evaluation; it fires at the first
evaluation at which it has been active for `for`; absent at an evaluation, a pending alert is dropped and a firing
one resolves (or, with keep_firing_for, keeps firing until it has been absent that long). An alert that reads a
recording rule has that rule backfilled first (`promtool tsdb create-blocks-from rules`), as it would have been
recorded.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from oomguard.backtest import BacktestError
from oomguard.backtest.replay import SELECTOR
from oomguard.backtest.tsdb import Prometheus, find_binary
from oomguard.bundle.bundle_config import BundleConfig, seconds
from oomguard.bundle.generate import ALERTS_FILE, RECORDS_FILE, render
from oomguard.common.excerpt import excerpt

EVALUATED = ("oomguard-gpu-memory", "oomguard-engine")
QUERIES_AT_ONCE = 4
# The shipped routing (bundle/alertmanager.yml): critical pages, warning makes a ticket, info reaches no one.
RECEIVERS = {"critical": "page", "warning": "ticket", "info": ""}

_NAME = re.compile(r"(?<![\w:])([a-zA-Z_:][\w:]*)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
# PromQL's words that look like names: functions, keywords, aggregations.
_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or", "unless", "sum",
    "min", "max", "avg", "count", "quantile", "stddev", "stdvar", "topk", "bottomk", "count_values", "group", "atan2",
    "inf", "nan", "le",
}  # fmt: skip


@dataclass(frozen=True)
class AlertRule:
    name: str
    group: str
    expr: str
    for_seconds: float
    keep_firing_seconds: float
    labels: dict[str, str]
    interval: float  # the group's evaluation interval

    @property
    def severity(self) -> str:
        return self.labels.get("severity", "")

    @property
    def receiver(self) -> str:
        return RECEIVERS.get(self.severity, "ticket")  # an unknown severity still reaches a human (the routing's)


@dataclass
class Episode:
    """One alert of one series, from pending to resolved."""

    alert: str
    severity: str
    labels: dict[str, str]
    active_at: float
    fired_at: float | None  # None: pending only, never fired
    resolved_at: float | None  # None: still active at the end of the history
    # Set by the report's judge: how it was counted (lead, early, aftermath, outside) and for which OOM (its time),
    # and whether it fired again soon after the same series' episode resolved (a flap).
    counted_as: str = ""
    oom: float | None = None
    flap: bool = False

    @property
    def receiver(self) -> str:
        return RECEIVERS.get(self.severity, "ticket")


@dataclass
class RuleSet:
    alerts: list[AlertRule]
    records: dict[str, str]  # record name -> expression, of those the alerts read
    wanted: dict[str, list[dict[str, str]]] = field(default_factory=dict)  # raw families read, for the replay


def _duration(text: Any, where: str) -> float:
    if text in (None, "", 0):
        return 0.0
    total = 0.0
    for number, unit in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", str(text)):
        total += int(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}[unit]
    if total == 0 and str(text) not in ("0", "0s"):
        raise BacktestError(f"{where}: {excerpt(str(text))!r} is not a Prometheus duration")
    return total


def references(expr: str) -> dict[str, list[dict[str, str]]]:
    """The series names an expression reads, each with the equality matchers of each selector of it (job and
    instance left out: every replayed series has the backtest's). Label lists (by, on...) and strings are not
    names; a word followed by "(" is a function."""
    out: dict[str, list[dict[str, str]]] = {}
    text = _STRINGS.sub('""', expr)
    text = _CLAUSES.sub(" ", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)  # range and subquery durations
    selectors = iter(_BRACES.findall(expr))  # the matchers, read from the expression as written
    for match in _NAME.finditer(text):
        name, braces = match.group(1), match.group(2)
        if braces:
            braces = next(selectors, "")
        if name.lower() in _WORDS or text[match.end(1) :].lstrip().startswith("(") or name[0].isdigit():
            continue
        matchers = {}
        for label, op, value in _MATCHER.findall(braces or ""):
            if op == "=" and label not in ("job", "instance"):
                matchers[label] = value
        out.setdefault(name, []).append(matchers)
    return out


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_CLAUSES = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_BRACES = re.compile(r'\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}')


def rule_set(config: BundleConfig, interval: float, groups: tuple[str, ...] = EVALUATED) -> RuleSet:
    """The bundle's alerts of `groups`, rendered from `config` with the backtest's selector; the records they read."""
    rendered = render(config.model_copy(update={"selector": SELECTOR}))
    alerts_doc = yaml.safe_load(rendered[ALERTS_FILE])
    records_doc = yaml.safe_load(rendered[RECORDS_FILE])
    records = {
        rule["record"]: rule["expr"] for group in records_doc["groups"] for rule in group["rules"] if "record" in rule
    }
    return rules_from(alerts_doc, records, interval, groups)


def rules_from(
    alerts_doc: dict[str, Any], records: dict[str, str], interval: float, groups: tuple[str, ...] | None
) -> RuleSet:
    alerts = []
    for group in alerts_doc.get("groups") or []:
        if groups is not None and group["name"] not in groups:
            continue
        every = _duration(group.get("interval"), f"group {group['name']} interval") or interval
        for rule in group.get("rules") or []:
            if "alert" not in rule:
                continue
            alerts.append(
                AlertRule(
                    name=rule["alert"],
                    group=group["name"],
                    expr=str(rule["expr"]),
                    for_seconds=_duration(rule.get("for"), f"{rule['alert']} for"),
                    keep_firing_seconds=_duration(rule.get("keep_firing_for"), f"{rule['alert']} keep_firing_for"),
                    labels={str(k): str(v) for k, v in (rule.get("labels") or {}).items()},
                    interval=every,
                )
            )
    read_records: dict[str, str] = {}
    wanted: dict[str, list[dict[str, str]]] = {}
    pending = [alert.expr for alert in alerts]
    while pending:
        for name, selectors in references(pending.pop()).items():
            if name in records:
                if name not in read_records:
                    read_records[name] = records[name]
                    pending.append(records[name])
            else:
                held = wanted.setdefault(name, [])
                held.extend(sel for sel in selectors if sel not in held)  # each selector once
    return RuleSet(alerts, read_records, wanted)


def grid(start: float, end: float, interval: float) -> tuple[float, int]:
    """The evaluations' first time (a multiple of the interval, at or after `start`) and their count up to `end`."""
    first = math.ceil(start / interval) * interval
    return first, max(0, int((end - first) // interval) + 1)


Runs = list[list[int]]  # [first, last] evaluations (indices on the grid) at which a series is present, in order


def add_runs(runs: Runs, indices: Iterator[int]) -> None:
    """Evaluations at which a series is present (ascending, after those already in `runs`) as runs: a series that
    fires all week is one pair of numbers, not 20,000 points held."""
    for i in indices:
        if runs and runs[-1][1] >= i - 1:
            runs[-1][1] = max(runs[-1][1], i)
        else:
            runs.append([i, i])


def runs_of(indices: list[int]) -> Runs:
    runs: Runs = []
    add_runs(runs, iter(sorted(set(indices))))
    return runs


def _machine(
    rule: AlertRule, labels: dict[str, str], runs: Runs, first: float, step: float, count: int
) -> list[Episode]:
    """rules/alerting.go's Eval over the evaluations at which the series is present (its runs): pending from the
    first, firing at the first at which it has been active for `for`; absent, a pending alert is dropped and a
    firing one resolves, or keeps firing until absent for keep_firing_for."""
    out: list[Episode] = []
    keep = math.ceil(rule.keep_firing_seconds / step - 1e-9) if rule.keep_firing_seconds > 0 else 0
    hold = math.ceil(rule.for_seconds / step - 1e-6)  # evaluations from its activation to its firing
    episode: Episode | None = None
    active = last = -1

    def at(i: int) -> float:
        return first + i * step

    for a, b in runs:
        if episode is not None:
            ends = last + 1 + (keep if episode.fired_at is not None else 0)
            if ends < a:
                episode.resolved_at = at(ends)
                out.append(episode)
                episode = None
        if episode is None:
            episode, active = Episode(rule.name, rule.severity, labels, at(a), None, None), a
        if episode.fired_at is None and active + hold <= b:
            episode.fired_at = at(max(a, active + hold))
        last = b
    if episode is not None:
        ends = last + 1 + (keep if episode.fired_at is not None else 0)
        if ends < count:
            episode.resolved_at = at(ends)
        out.append(episode)
    return out


def evaluate(prometheus: Prometheus, rules: list[AlertRule], start: float, end: float) -> dict[str, list[Episode]]:
    """Every rule over [start, end]: its episodes, by alert name (a name may have several series). The rules'
    queries go to Prometheus QUERIES_AT_ONCE at a time (it answers each on its own cores); each answer, a chunk of
    the window at a time, is kept as runs of evaluations, so a rule's memory is its episodes', whatever the window."""

    def one(rule: AlertRule) -> list[Episode]:
        step = rule.interval
        first, count = grid(start, end, step)
        if count == 0:
            return []
        series: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], Runs]] = {}
        for chunk in prometheus.query_range_chunks(rule.expr, first, first + (count - 1) * step, step):
            for found in chunk:
                metric = found["metric"]
                key = tuple(sorted(metric.items()))
                held = series.get(key)
                if held is None:
                    labels = {k: v for k, v in metric.items() if k != "__name__"}
                    held = series[key] = ({**labels, **rule.labels}, [])
                # Present at each time it has a value, NaN too, as an instant query's result would hold it.
                add_runs(held[1], (round((float(t) - first) / step) for t, _ in found["values"]))
        episodes = [e for labels, runs in series.values() for e in _machine(rule, labels, runs, first, step, count)]
        episodes.sort(key=lambda e: (e.active_at, e.alert))
        return episodes

    out: dict[str, list[Episode]] = {}
    with concurrent.futures.ThreadPoolExecutor(QUERIES_AT_ONCE, thread_name_prefix="rules") as pool:
        for rule, found in zip(rules, pool.map(one, rules), strict=True):
            out.setdefault(rule.name, []).extend(found)
    return out


def backfill_records(
    prometheus: Prometheus, records: dict[str, str], start: float, end: float, interval: float, workdir: Path
) -> Path | None:
    """The recording rules the alerts read, evaluated over the history by `promtool tsdb create-blocks-from rules`
    against the backtest's Prometheus: the blocks' folder, to move beside the others (None: none read)."""
    if not records:
        return None
    path = workdir / "records.yaml"
    rules = [{"record": name, "expr": expr} for name, expr in records.items()]
    path.write_text(yaml.safe_dump({"groups": [{"name": "backtest-records", "rules": rules}]}, sort_keys=False))
    out = workdir / "records-blocks"
    command = [
        find_binary("promtool"), "tsdb", "create-blocks-from", "rules",
        f"--start={int(start)}", f"--end={math.ceil(end) + 1}", f"--url={prometheus.url}",
        f"--output-dir={out}", f"--eval-interval={max(1, round(interval))}s", str(path),
    ]  # fmt: skip
    try:
        # Its TMPDIR the backtest's folder, removed with it whatever happens (tsdb.Backfill says why).
        env = {**os.environ, "TMPDIR": str(workdir)}
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, env=env)
    except subprocess.TimeoutExpired:
        raise BacktestError("promtool took over 600s to record the rules the alerts read") from None
    if result.returncode != 0:
        raise BacktestError(
            "promtool could not record the rules the alerts read: "
            + excerpt((result.stderr or result.stdout).strip(), 1000)
        )
    return out


def for_seconds(config: BundleConfig, alert: str) -> float:
    """An alert's `for:` in the bundle's configuration, in seconds (its time scale applied)."""
    value = getattr(config.alerts, alert).for_
    return max(1, round(config.clock.real(seconds(value))))
