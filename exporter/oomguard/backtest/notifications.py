"""What the people on call would have received: the alert episodes through Alertmanager's routing, grouping, timers
and inhibitions, as the shipped configuration (bundle/alertmanager.yml, deploy/alertmanager/) sets them.

Prometheus sends each firing alert; Alertmanager routes it down its tree (the first matching child, deeper while
children match), puts it in its route's group (`group_by` labels), and notifies the group's receiver `group_wait`
after the group's first alert, then at `group_interval` ticks when the group changed (an alert new to it, or all of
it resolved), and again every `repeat_interval` while it fires. An alert whose `inhibit_rules` source fires with the
`equal` labels is muted: left out of its group's notifications. This module replays that on the episodes (the
dispatcher and the dedup stage of Alertmanager's notify pipeline, as its documentation and source describe them);
one notification with a firing alert is what a person receives.

The replayed series have no `instance` label (replay.py): each alert is given its GPU's node as its instance here,
as the node agent's instance is its node, so that the routing's grouping and the inhibitions' `equal` hold.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

from oomguard.backtest.rules import Episode
from oomguard.common.excerpt import excerpt

_MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"?(.*?)"?\s*$')
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
# Alertmanager's defaults where the configuration says nothing.
DEFAULTS = {"group_wait": 30.0, "group_interval": 300.0, "repeat_interval": 14400.0}


def _seconds(text: Any) -> float:
    return sum(int(n) * _UNITS[u] for n, u in _DURATION.findall(str(text)))


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str
    value: str

    @classmethod
    def parse(cls, text: str) -> Matcher:
        found = _MATCHER.match(text)
        if found is None:
            raise ValueError(f"not a matcher: {excerpt(text)!r}")
        return cls(*found.groups())

    def __call__(self, labels: dict[str, str]) -> bool:
        value = labels.get(self.name, "")
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        hit = re.fullmatch(self.value, value) is not None  # Alertmanager's regexes are anchored
        return hit if self.op == "=~" else not hit


@dataclass
class Route:
    receiver: str
    group_by: tuple[str, ...]
    group_wait: float
    group_interval: float
    repeat_interval: float
    matchers: tuple[Matcher, ...] = ()
    keep_going: bool = False  # `continue`
    routes: list[Route] = field(default_factory=list)

    @classmethod
    def parse(cls, raw: dict[str, Any], parent: Route | None = None) -> Route:
        def inherit(key: str) -> Any:
            if key in raw:
                return _seconds(raw[key]) if key in DEFAULTS else raw[key]
            return getattr(parent, key) if parent is not None else DEFAULTS.get(key)

        route = cls(
            receiver=inherit("receiver") or "",
            group_by=tuple(raw.get("group_by", parent.group_by if parent else ())),
            group_wait=inherit("group_wait"),
            group_interval=inherit("group_interval"),
            repeat_interval=inherit("repeat_interval"),
            matchers=tuple(Matcher.parse(m) for m in raw.get("matchers", ())),
            keep_going=bool(raw.get("continue", False)),
        )
        route.routes = [cls.parse(child, route) for child in raw.get("routes", ())]
        return route

    def match(self, labels: dict[str, str]) -> list[Route]:
        """The routes that take the alert: its deepest matching routes (the first child that matches, more where a
        child says `continue`), else this one."""
        found: list[Route] = []
        for child in self.routes:
            if all(m(labels) for m in child.matchers):
                found += child.match(labels)
                if not child.keep_going:
                    break
        return found or [self]


@dataclass(frozen=True)
class Inhibition:
    sources: tuple[Matcher, ...]
    targets: tuple[Matcher, ...]
    equal: tuple[str, ...]


@dataclass
class Routing:
    route: Route
    inhibitions: list[Inhibition]
    receivers_sending_resolved: set[str]
    name: str
    # The receivers with an integration: one without (the shipped `null`, where info alerts go) sends nothing.
    receivers_notifying: set[str]

    @classmethod
    def shipped(cls) -> Routing:
        text = resources.files("oomguard.bundle").joinpath("alertmanager.yml").read_text(encoding="utf-8")
        return cls.parse(yaml.safe_load(text), "the shipped routing (deploy/alertmanager/alertmanager.yml)")

    @classmethod
    def parse(cls, raw: dict[str, Any], name: str) -> Routing:
        inhibitions = [
            Inhibition(
                tuple(Matcher.parse(m) for m in rule.get("source_matchers", ())),
                tuple(Matcher.parse(m) for m in rule.get("target_matchers", ())),
                tuple(rule.get("equal", ())),
            )
            for rule in raw.get("inhibit_rules", ())
        ]
        resolved = {
            r["name"] for r in raw.get("receivers", ())
            if any(c.get("send_resolved", True) for kind, configs in r.items() if kind.endswith("_configs")
                   for c in configs)
        }  # fmt: skip
        notifying = {
            r["name"] for r in raw.get("receivers", ()) if any(configs for kind, configs in r.items()
                                                               if kind.endswith("_configs"))
        }  # fmt: skip
        return cls(Route.parse(raw["route"]), inhibitions, resolved, name, notifying)


@dataclass
class _Alert:
    episode: Episode
    labels: dict[str, str]
    start: float
    end: float  # resolved (inf: firing at the history's end)


@dataclass
class Sent:
    receiver: str
    at: float
    firing: int
    repeat: bool
    for_nothing: bool  # every firing alert in it was counted outside incidents


@dataclass
class Notifications:
    routing: str
    sent: list[Sent]

    def count(self, receiver: str, *, for_nothing: bool | None = None, repeats: bool | None = None) -> int:
        return sum(
            1 for s in self.sent
            if s.receiver == receiver and (for_nothing is None or s.for_nothing == for_nothing)
            and (repeats is None or s.repeat == repeats)
        )  # fmt: skip

    def text(self) -> list[str]:
        lines = [f"Notifications, as {self.routing} would send them (grouped, repeated, inhibited):"]
        for receiver in sorted({s.receiver for s in self.sent}):
            total, nothing = self.count(receiver), self.count(receiver, for_nothing=True)
            repeats = self.count(receiver, repeats=True)
            lines.append(
                f"  {receiver}: {total} ({repeats} of them repeats), {nothing} for nothing (outside incidents)"
            )
        if not self.sent:
            lines.append("  none")
        return lines

    def json(self) -> dict[str, Any]:
        receivers = sorted({s.receiver for s in self.sent})
        return {
            "routing": self.routing,
            "by_receiver": {
                r: {
                    "sent": self.count(r),
                    "repeats": self.count(r, repeats=True),
                    "for_nothing": self.count(r, for_nothing=True),
                }
                for r in receivers
            },
            "sent": [
                {
                    "receiver": s.receiver,
                    "at": s.at,
                    "firing": s.firing,
                    "repeat": s.repeat,
                    "for_nothing": s.for_nothing,
                }
                for s in self.sent
            ],
        }


def notify(episodes: list[Episode], routing: Routing, end: float) -> Notifications:
    """The notifications `routing` sends for the fired `episodes` up to `end` (the history's end)."""
    alerts = []
    for e in episodes:
        if e.fired_at is None:
            continue
        labels = {**e.labels, "alertname": e.alert}
        labels.setdefault("instance", labels.get("node") or "backtest")
        alerts.append(_Alert(e, labels, e.fired_at, e.resolved_at if e.resolved_at is not None else float("inf")))
    muted = _muted(alerts, routing.inhibitions)
    groups: dict[tuple[int, tuple[str, ...]], tuple[Route, list[_Alert]]] = {}
    routes: list[Route] = []
    for alert in alerts:
        for route in routing.route.match(alert.labels):
            if route not in routes:
                routes.append(route)
            key = (routes.index(route), tuple(alert.labels.get(k, "") for k in route.group_by))
            groups.setdefault(key, (route, []))[1].append(alert)
    sent: list[Sent] = []
    for route, members in groups.values():
        if route.receiver in routing.receivers_notifying:
            sent += _group(route, members, muted, end, route.receiver in routing.receivers_sending_resolved)
    sent.sort(key=lambda s: s.at)
    return Notifications(routing.name, sent)


def _muted(alerts: list[_Alert], rules: list[Inhibition]) -> dict[int, list[tuple[float, float]]]:
    """id() of an alert -> the spans in which an inhibition mutes it (a source firing with the equal labels)."""
    out: dict[int, list[tuple[float, float]]] = {}
    for rule in rules:
        sources = [a for a in alerts if all(m(a.labels) for m in rule.sources)]
        if not sources:
            continue
        for alert in alerts:
            if not all(m(alert.labels) for m in rule.targets):
                continue
            mine = tuple(alert.labels.get(k, "") for k in rule.equal)
            for source in sources:
                if source is not alert and tuple(source.labels.get(k, "") for k in rule.equal) == mine:
                    out.setdefault(id(alert), []).append((source.start, source.end))
    return out


def _is_muted(alert: _Alert, at: float, muted: dict[int, list[tuple[float, float]]]) -> bool:
    return any(a <= at < b for a, b in muted.get(id(alert), ()))


def _group(
    route: Route, alerts: list[_Alert], muted: dict[int, list[tuple[float, float]]], end: float, resolved: bool
) -> list[Sent]:
    """One aggregation group's notifications: its flushes at group_wait, then every group_interval while it holds
    alerts; at each, Alertmanager's dedup stage decides whether the receiver hears of it."""
    alerts = sorted(alerts, key=lambda a: a.start)
    out: list[Sent] = []
    i = 0
    while i < len(alerts):
        # A group is made by its first alert and lives while it holds any (firing, or resolved and not yet told).
        at = alerts[i].start + route.group_wait
        members: list[_Alert] = []
        # The firing alerts the receiver knows of, by their labels: Alertmanager's identity of an alert (one that
        # resolved and fired again on the same series between two ticks is the one it was told of).
        told: set[tuple[tuple[str, str], ...]] = set()
        last_sent: float | None = None
        while True:
            while i < len(alerts) and alerts[i].start <= at:
                members.append(alerts[i])
                i += 1
            if at > end:
                break
            firing = [a for a in members if a.start <= at < a.end and not _is_muted(a, at, muted)]
            ids = {tuple(sorted(a.labels.items())) for a in firing}
            gone = told - ids
            update = bool(ids - told) or (bool(gone) and (resolved or not ids))
            # Strictly after: Alertmanager compares with the time it sent, a moment after its flush, so a repeat
            # comes at the first flush past repeat_interval (an hour and a group_interval with the shipped routing).
            repeat = bool(firing) and last_sent is not None and at - last_sent > route.repeat_interval
            if firing and (update or repeat):
                nothing = all(a.episode.counted_as in ("outside", "early") for a in firing)
                out.append(Sent(route.receiver, at, len(firing), repeat and not update, nothing))
                last_sent = at
            elif update:
                last_sent = at  # the "resolved" notification: no one is woken
            told = ids
            members = [a for a in members if a.end > at]
            if not members:
                break
            at += route.group_interval
    return out
