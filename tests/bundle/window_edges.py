"""Where a promtool test case's input samples sit on the edge of a window its expression reads.

Prometheus 2.x reads a range selector `x[W]` at time t over [t - W, t], an instant selector over the lookback
[t - 5m, t] and a subquery's steps over [t - R, t]; Prometheus 3.x made all three left-open (t - W, t]. A test
whose outcome depends on a sample exactly at t - W therefore means one thing under promtool 2.x and another
under 3.x. This module expands a test file's input series into sample times, finds every selector of the
expressions a case checks (through recording rules and subqueries), and lists the samples on such an edge at
each time that feeds the case: the eval_time of a promql_expr_test, and for an alert_rule_test every rule
evaluation its `for:` and `keep_firing_for:` reach back over.

It is a reader of PromQL's selector syntax only (names, matchers, ranges, offsets, subqueries), enough for the
bundle's rules; an expression it cannot read is an error, never a silent pass.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

LOOKBACK_MS = 5 * 60 * 1000
UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000, "y": 31_536_000_000}
DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
# Series the rule evaluation writes at every evaluation while an alert is pending or firing.
RULE_WRITTEN = {"ALERTS", "ALERTS_FOR_STATE"}


def duration_ms(text: str) -> int:
    text = str(text).strip()
    parts = DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * UNITS_MS[u] for n, u in parts)


# ---------------------------------------------------------------- input series


@dataclass
class Series:
    name: str
    labels: dict[str, str]
    times: list[int]  # ms of real samples, ascending
    stale: list[int]  # ms of staleness markers


SERIES_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
TERM = re.compile(
    r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]?Inf|NaN)(?:([+-])(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?))?x(\d+)$"
)
NUMBER = re.compile(r"^[+-]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|Inf|NaN)$")


def parse_series_name(text: str) -> tuple[str, dict[str, str]]:
    match = re.fullmatch(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*", text, re.S)
    if not match:
        raise ValueError(f"cannot read the series {text!r}")
    body = match.group(2) or ""
    labels: dict[str, str] = {}
    pos = 0
    while pos < len(body.strip()):
        label = SERIES_LABEL.match(body, pos)
        if not label:
            raise ValueError(f"cannot read the labels of {text!r}")
        labels[label.group(1)] = label.group(2)
        pos = label.end()
    return match.group(1), labels


def expand_values(text: str, interval_ms: int) -> tuple[list[int], list[int]]:
    """Sample and staleness-marker times of promtool's series notation ('1 2 _ 3x4 0+5x10 _x3 stale')."""
    times: list[int] = []
    stale: list[int] = []
    slot = 0
    for token in str(text).split():
        if token == "_":
            slot += 1
        elif token == "stale":
            stale.append(slot * interval_ms)
            slot += 1
        elif re.fullmatch(r"_x\d+", token):
            slot += int(token[2:])
        elif NUMBER.match(token):
            times.append(slot * interval_ms)
            slot += 1
        elif (term := TERM.match(token)) is not None:
            for _ in range(int(term.group(4)) + 1):
                times.append(slot * interval_ms)
                slot += 1
        else:
            raise ValueError(f"cannot read the value {token!r} of {text!r}")
    return times, stale


# ---------------------------------------------------------------- PromQL selectors


@dataclass(frozen=True)
class Subquery:
    range_ms: int
    step_ms: int
    offset_ms: int


@dataclass
class Selector:
    name: str | None
    matchers: list[tuple[str, str, str]]
    range_ms: int = 0  # 0: an instant selector
    offset_ms: int = 0
    subqueries: list[Subquery] = field(default_factory=list)  # outermost first
    text: str = ""


TOKEN = re.compile(
    r"""\s*(?:
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<braces>\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\})
  | (?P<brackets>\[[^\]]*\])
  | (?P<duration>\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*(?![a-zA-Z0-9_]))
  | (?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<paren>[()])
  | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>,@])
    )""",
    re.X,
)
MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')


def tokenize(expr: str) -> list[tuple[str, str]]:
    tokens = []
    pos = 0
    expr = expr.rstrip()
    while pos < len(expr):
        match = TOKEN.match(expr, pos)
        if not match or match.end() == pos:
            raise ValueError(f"cannot read PromQL at {expr[pos : pos + 30]!r} in {expr!r}")
        kind = match.lastgroup
        assert kind is not None
        tokens.append((kind, match.group(kind)))
        pos = match.end()
    return tokens


def parse_matchers(body: str) -> list[tuple[str, str, str]]:
    inner = body[1:-1]
    matchers = []
    pos = 0
    while pos < len(inner.strip()):
        match = MATCHER.match(inner, pos)
        if not match:
            raise ValueError(f"cannot read the matchers {body!r}")
        value = match.group(3).encode().decode("unicode_escape")
        matchers.append((match.group(1), match.group(2), value))
        pos = match.end()
    return matchers


@functools.cache
def selectors(expr: str) -> tuple[Selector, ...]:
    """Every vector and matrix selector of expr, with the subqueries around it."""
    tokens = tokenize(expr)
    found: list[tuple[int, Selector]] = []  # (token index, selector)
    open_parens: list[int] = []
    spans: list[tuple[int, int, Subquery]] = []  # (open index, close index, subquery)
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        if kind == "ident" and text in LABEL_LISTS and i + 1 < len(tokens) and tokens[i + 1][1] == "(":
            close = next(j for j in range(i + 1, len(tokens)) if tokens[j][1] == ")")
            i = close + 1
            continue
        if kind == "paren" and text == "(":
            open_parens.append(i)
        elif kind == "paren" and text == ")":
            start = open_parens.pop()
            sub, i = subquery_after(tokens, i + 1)
            if sub is not None:
                spans.append((start, i, sub))
            continue
        elif (kind == "ident" and text not in KEYWORDS and not next_is(tokens, i + 1, "(")) or kind == "braces":
            start = i
            name = text if kind == "ident" else None
            matchers: list[tuple[str, str, str]] = []
            if kind == "braces":
                matchers = parse_matchers(text)
            elif i + 1 < len(tokens) and tokens[i + 1][0] == "braces":
                i += 1
                matchers = parse_matchers(tokens[i][1])
            selector = Selector(name=name, matchers=matchers, text="")
            i += 1
            if i < len(tokens) and tokens[i][0] == "brackets" and ":" not in tokens[i][1]:
                selector.range_ms = duration_ms(tokens[i][1][1:-1])
                i += 1
            if i + 1 < len(tokens) and tokens[i] == ("ident", "offset"):
                selector.offset_ms = duration_ms(tokens[i + 1][1])
                i += 2
            selector.text = " ".join(t for _, t in tokens[start:i])
            found.append((start, selector))
            sub, i = subquery_after(tokens, i)
            if sub is not None:
                spans.append((start, i, sub))
            continue
        i += 1
    for start, end, sub in sorted(spans, key=lambda span: span[1] - span[0], reverse=True):
        for index, selector in found:
            if start <= index < end:
                selector.subqueries.append(sub)
    return tuple(selector for _, selector in found)


def next_is(tokens: list[tuple[str, str]], index: int, text: str) -> bool:
    return index < len(tokens) and tokens[index][1] == text


def subquery_after(tokens: list[tuple[str, str]], i: int) -> tuple[Subquery | None, int]:
    if i < len(tokens) and tokens[i][0] == "brackets" and ":" in tokens[i][1]:
        range_text, step_text = tokens[i][1][1:-1].split(":")
        if not step_text.strip():
            raise ValueError("a subquery without a step depends on the evaluation interval: give it one")
        i += 1
        offset = 0
        if i + 1 < len(tokens) and tokens[i] == ("ident", "offset"):
            offset = duration_ms(tokens[i + 1][1])
            i += 2
        return Subquery(duration_ms(range_text), duration_ms(step_text), offset), i
    return None, i


def matches(selector: Selector, name: str, labels: dict[str, str]) -> bool:
    if selector.name is not None and selector.name != name:
        return False
    for label, op, value in selector.matchers:
        actual = name if label == "__name__" else labels.get(label, "")
        if op == "=" and actual != value:
            return False
        if op == "!=" and actual == value:
            return False
        if op == "=~" and not re.fullmatch(value, actual):
            return False
        if op == "!~" and re.fullmatch(value, actual):
            return False
    return True


# ---------------------------------------------------------------- the check


@dataclass
class Rules:
    records: dict[str, str]
    alerts: dict[str, dict]


def load_rules(paths: list[Path]) -> Rules:
    records: dict[str, str] = {}
    alerts: dict[str, dict] = {}
    for path in paths:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    records[rule["record"]] = rule["expr"]
                else:
                    alerts[rule["alert"]] = rule
    return rules_of(records, alerts)


def rules_of(records: dict[str, str], alerts: dict[str, dict]) -> Rules:
    return Rules(records, alerts)


@dataclass
class Context:
    series: list[Series]
    rules: Rules
    eval_ms: int  # the rule evaluation interval

    def grid_at_or_before(self, t: int) -> int:
        return (t // self.eval_ms) * self.eval_ms


def edges(expr: str, t: int, ctx: Context, depth: int = 0) -> list[str]:
    """The samples of expr's selectors that sit on the start of a window read at time t."""
    if depth > 5:
        raise ValueError(f"recording rules nest too deep at {expr!r}")
    found = []
    for selector in selectors(expr):
        for time in subquery_times(selector, t, ctx, found):
            found += selector_edges(selector, time, ctx, depth)
    return found


def subquery_times(selector: Selector, t: int, ctx: Context, found: list[str]) -> list[int]:
    """The times at which selector is evaluated under its subqueries; a step on the subquery's start is an edge."""
    times = [t]
    for sub in selector.subqueries:
        inner = []
        for time in times:
            start = time - sub.offset_ms - sub.range_ms
            end = time - sub.offset_ms
            first = -(-start // sub.step_ms) * sub.step_ms  # the first step at or after start
            if first == start and has_data(selector, start, ctx):
                found.append(f"{selector.text}: subquery step at {fmt(start)} is its [{fmt(sub.range_ms)}] start")
                first += sub.step_ms
            inner += list(range(first, end + 1, sub.step_ms))
        times = inner
    return times


def has_data(selector: Selector, t: int, ctx: Context) -> bool:
    """Whether the selector reads anything at t (the subquery step on an edge then counts)."""
    at = t - selector.offset_ms
    if selector.name in ctx.rules.records or selector.name in RULE_WRITTEN:
        return at > 0
    window = selector.range_ms or LOOKBACK_MS
    for series in ctx.series:
        if matches(selector, series.name, series.labels):
            latest = max((s for s in series.times + series.stale if s <= at), default=None)
            if selector.range_ms and any(at - window <= s <= at for s in series.times):
                return True
            if not selector.range_ms and latest is not None and latest not in series.stale and latest >= at - window:
                return True
    return False


def selector_edges(selector: Selector, t: int, ctx: Context, depth: int) -> list[str]:
    at = t - selector.offset_ms
    found = []
    if selector.name in ctx.rules.records:
        # A recorded series has a sample at every rule evaluation, computed from its rule's expression there.
        record = ctx.rules.records[selector.name]
        if selector.range_ms:
            start = at - selector.range_ms
            if start >= 0 and start % ctx.eval_ms == 0:
                found.append(f"{selector.text} at {fmt(t)}: the recorded sample at {fmt(start)} is its start")
            grid = [g for g in range(0, at + 1, ctx.eval_ms) if g > start]
        else:
            grid = [ctx.grid_at_or_before(at)]
        for g in grid:
            found += [f"{selector.text} at {fmt(t)} <- {edge}" for edge in edges(record, g, ctx, depth + 1)]
        return found
    if selector.name in RULE_WRITTEN:
        start = at - (selector.range_ms or LOOKBACK_MS)
        if selector.range_ms and start > 0 and start % ctx.eval_ms == 0:
            found.append(f"{selector.text} at {fmt(t)}: the rule evaluation at {fmt(start)} is its start")
        return found
    for series in ctx.series:
        if not matches(selector, series.name, series.labels):
            continue
        if selector.range_ms:
            start = at - selector.range_ms
            if start in series.times:
                found.append(
                    f"{selector.text} at {fmt(t)}: {series_text(series)} has a sample at its start {fmt(start)}"
                )
        else:
            start = at - LOOKBACK_MS
            latest = max((s for s in series.times + series.stale if s <= at), default=None)
            if latest == start and latest not in series.stale:
                found.append(
                    f"{selector.text} at {fmt(t)}: the latest sample of {series_text(series)} is at its lookback's "
                    f"start {fmt(start)}"
                )
    return found


def series_text(series: Series) -> str:
    return series.name + "{" + ",".join(f'{k}="{v}"' for k, v in series.labels.items()) + "}"


def fmt(ms: int) -> str:
    if ms % 60_000 == 0:
        return f"{ms // 60_000}m"
    return f"{ms / 1000:g}s"


@dataclass
class Finding:
    case: str
    edges: list[str]


def check_file(path: Path) -> list[Finding]:
    """Every case of a promtool test file whose outcome reads a sample on a window's start."""
    suite = yaml.safe_load(path.read_text(encoding="utf-8"))
    rules = load_rules([path.parent / name for name in suite["rule_files"]])
    eval_ms = duration_ms(suite.get("evaluation_interval", "1m"))
    findings = []
    for number, group in enumerate(suite.get("tests") or [], 1):
        interval = duration_ms(group.get("interval", suite.get("evaluation_interval", "1m")))
        series = []
        for entry in group.get("input_series") or []:
            name, labels = parse_series_name(entry["series"])
            times, stale = expand_values(entry["values"], interval)
            series.append(Series(name, labels, times, stale))
        ctx = Context(series, rules, eval_ms)
        where = f"{path.name} test {number}"
        for case in group.get("promql_expr_test") or []:
            t = duration_ms(case["eval_time"])
            found = edges(case["expr"], t, ctx)
            if found:
                findings.append(Finding(f"{where}: {case['expr'].strip()} at {fmt(t)}", found))
        for case in group.get("alert_rule_test") or []:
            rule = rules.alerts[case["alertname"]]
            t = ctx.grid_at_or_before(duration_ms(case["eval_time"]))
            reach = duration_ms(rule.get("for", "0s")) + duration_ms(rule.get("keep_firing_for", "0s"))
            found = []
            for g in range(max(0, t - reach), t + 1, eval_ms):
                found += [f"evaluation at {fmt(g)}: {edge}" for edge in edges(rule["expr"], g, ctx)]
            if found:
                findings.append(Finding(f"{where}: {case['alertname']} at {fmt(t)}", found))
    return findings
