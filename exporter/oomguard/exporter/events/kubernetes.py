"""What the Kubernetes API says of a discovered pod's engine container, as events of its target.

`PodEvents` is the one door between pod discovery (sources/kubernetes/discovery.py) and the event runner: the
discovery tells it, on the event loop, which pods are targets and what the API said of them (a pod object, a
kubelet Event); it makes each pod's event sources (`PodApiEvents`, and its engine container's log) and gives them
to the runner. What the API says becomes events there: a container that ended OOMKilled (or with exit code 137),
a failed liveness or startup probe (a kubelet Event `Unhealthy`) and the kill that follows (`Killing`), each
taken by the runner's poll in its thread. The state saved is the last termination counted, so that a restarted
exporter does not count it again.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from oomguard.common.kinds import CONTAINER_OOM_KILLED, KUBERNETES_EVENT_KINDS, PROBE_FAILURE, PROBE_KILL
from oomguard.exporter.config import EventsConfig, TargetConfig
from oomguard.exporter.events.api_log import ApiLogReader
from oomguard.exporter.events.registry import pod_api_log, pod_log
from oomguard.exporter.events.runner import BadState, check_state
from oomguard.exporter.events.source import INCIDENTS, POSITIONS, source_health
from oomguard.exporter.model import Event, EventSourceHealth, ReadStats, Termination

if TYPE_CHECKING:
    from oomguard.exporter.events.runner import EventRunner

_log = logging.getLogger(__name__)
Obj = dict[str, Any]  # an API object as JSON
# The kubelet's messages: `Liveness probe failed: ...`, `Container vllm failed startup probe, will be restarted`.
_PROBE_FAILED = re.compile(r"^(Liveness|Startup) probe failed", re.IGNORECASE)
_PROBE_KILLED = re.compile(r"failed (liveness|startup) probe", re.IGNORECASE)
_FIELD_CONTAINER = re.compile(r"spec\.(?:initC|c)ontainers\{(.+)\}")
MAX_EVENT_COUNT = 2**31 - 1  # an Event's count is an int32 in the API
# What one change of an Event may add: the kubelet's event recorder lets a burst of 25 Events of one object through
# (client-go's spam filter), so more between two changes the watch sees is no prober's doing.
MAX_GROWTH = 25
# The API's events are read by one watch (and the pods' objects) for the whole exporter: their source's health is
# said once, under this name with the target empty, not once a pod (six series a pod, each the same).
API_EVENTS = "k8s-api"


def probe_kind(event: Obj) -> str | None:
    """The event kind of a kubelet Event of a pod (PROBE_FAILURE, PROBE_KILL), or None."""
    reason, message = event.get("reason", ""), event.get("message", "")
    if reason == "Unhealthy" and _PROBE_FAILED.search(message):
        return PROBE_FAILURE
    if reason == "Killing" and _PROBE_KILLED.search(message):
        return PROBE_KILL
    return None


class PodApiEvents:
    kinds: tuple[str, ...] = KUBERNETES_EVENT_KINDS

    def __init__(
        self, target: str, name: str, saved: dict[str, Any] | None = None, uid: str = "", stats: ReadStats | None = None
    ) -> None:
        """`stats`: the exporter's API events' (PodEvents'), shared by every pod's source; its own when None."""
        self.target = target
        self.name = name  # "k8s-api:NAMESPACE/POD": its key in the state file
        self.uid = uid  # the pod's, saved with the position: whose it is (a pod replaced under its name is another)
        # lines_read: API events and terminations received, of every pod (pushed on the event loop only)
        self.stats = stats if stats is not None else ReadStats()
        last = saved.get("last_termination") if isinstance(saved, dict) else None
        self.last_termination: str | None = last if isinstance(last, str) else None  # a wrong type: none counted yet
        self._pending: list[Event] = []
        self._lock = threading.Lock()
        self.wake: Callable[[], None] | None = None  # set by the runner: it polls this source when an event comes

    def push(self, event: Event) -> None:
        with self._lock:
            self._pending.append(event)
            self.stats.lines_read += 1
        if (wake := self.wake) is not None:
            wake()

    def poll(self, now: float) -> list[Event]:
        with self._lock:
            events, self._pending = self._pending, []
        return events

    def health(self) -> EventSourceHealth:
        return source_health(self, self.stats, exporter_wide=API_EVENTS)

    def state(self) -> dict[str, Any]:
        if not self.last_termination:
            return {POSITIONS: {"uid": self.uid}} if self.uid else {}
        return {POSITIONS: {"last_termination": self.last_termination, **({"uid": self.uid} if self.uid else {})}}

    def close(self) -> list[Event]:
        return self.poll(0.0)


@dataclass
class _Pod:
    target: str  # whose events its are: its own target, or (a worker of an engine spanning pods) its leader's
    namespace: str
    name: str
    uid: str
    container: str  # the engine's
    api: PodApiEvents
    sources: list[Any]  # what the runner reads of it: its API events and its engine container's log


class PodEvents:
    """The discovered pods' events, for the discovery: which pods, what their objects and the kubelet's Events say.

    A pod is named `namespace/name`; its events count for its target: the same name, or for a worker of an engine
    spanning pods (sources/kubernetes/groups.py) its leader's. Called on the event loop, but for `follow`,
    `follow_api` and `unfollow`, which close and open files: in a worker thread."""

    def __init__(self, runner: EventRunner, config: EventsConfig) -> None:
        self._runner = runner
        self._config = config
        self._pods: dict[str, _Pod] = {}  # by pod name (namespace/name)
        self._lock = threading.Lock()  # `_pods`' sources: the worker threads of two pods of one target
        self._counts: dict[str, tuple[str, int]] = {}  # kubelet Event UID -> (its namespace, its count) as last seen
        self._listed_in: set[str | None] = set()  # the scopes (a namespace, None: all) whose Events were listed
        self._api_stats = ReadStats()  # every pod's API events', said once (API_EVENTS): it outlives the pods

    # -- pods ---------------------------------------------------------------------------------------------------
    def add(
        self, pod_name: str, *, namespace: str, name: str, uid: str, container: str, ended: Termination | None,
        watched: bool, target: str | None = None,
    ) -> None:  # fmt: skip
        """A pod whose events count for `target` (its own name by default). `watched`: the pods were listed before
        it came (its end, if any, happened while we watched); else its last end may have been counted before the
        exporter started: a baseline."""
        target = target or pod_name
        source = f"k8s-api:{pod_name}"
        api = PodApiEvents(target, source, self._runner.saved.of(target, source).get(POSITIONS), uid, self._api_stats)
        if api.last_termination is None and not watched and ended is not None:
            api.last_termination = ended.key
        self._pods[pod_name] = _Pod(target, namespace, name, uid, container, api, [])

    def update(self, pod_name: str, *, uid: str, container: str, ended: Termination | None) -> None:
        """The pod's object as it is now: a new end of its engine container is counted once (OOMKilled or 137)."""
        pod = self._pods[pod_name]
        pod.uid, pod.container = uid, container
        if ended is not None and ended.key != pod.api.last_termination:
            pod.api.last_termination = ended.key
            if ended.oom_killed:
                pod.api.push(Event(CONTAINER_OOM_KILLED, ended.finished_at or time.time()))

    def remove(self, pod_name: str) -> None:
        """The pod is no target's any more (then `unfollow` it)."""
        self._pods.pop(pod_name, None)

    # -- a node handed from one shard to another (sources/kubernetes/handover.py) ------------------------------
    def seed(self, target: str, pod_name: str, states: dict[str, dict[str, Any]]) -> None:
        """What the pod's sources resume from, handed over by the shard that read them last (source name -> its
        state), before `add` and `follow_api` build them under `target`: checked as a state file is first."""
        for source, state in checked_states(states, pod_name).items():
            self._runner.saved.put(target, source, state)

    def states(self, pod_name: str) -> dict[str, dict[str, Any]]:
        """The pod's sources' states as last saved or seen (after the runner closed them: where they stopped)."""
        pod = self._pods.get(pod_name)
        if pod is None:
            return {}
        out = {pod.api.name: pod.api.state()}  # its API events' (kept here, whether followed or not)
        for source in pod.sources:
            state = self._runner.state_of(pod.target, source.name)
            if state is not None and source is not pod.api:
                out[source.name] = state
        return out

    def saved_states(self, namespace: str, name: str, uid: str, container: str) -> dict[str, dict[str, Any]] | None:
        """What the state file held of a pod's sources at start (None: nothing, or another pod's of that name)."""
        api = self._runner.saved.find(f"k8s-api:{namespace}/{name}")
        log = self._runner.saved.find(f"k8s-log:{namespace}/{name}/{container}")
        saved_uid = (api.get(POSITIONS) or {}).get("uid") if isinstance(api.get(POSITIONS), dict) else None
        if not (api or log) or saved_uid not in (None, uid):
            return None
        return {f"k8s-api:{namespace}/{name}": api, f"k8s-log:{namespace}/{name}/{container}": log}

    def follow(self, pod_name: str, config: TargetConfig, *, from_start: bool) -> None:
        """The pod's event sources given to the runner under its target (`config`): its API events and its engine
        container's log under events.k8s_pods_dir (blocking: a replaced pod's old log is closed, read to its end)."""
        pod = self._pods.get(pod_name)
        if pod is None:
            return  # removed while this waited for its thread: `unfollow` closes what it had
        log = pod_log(
            config, self._config, self._runner.saved, (pod.namespace, pod.name, pod.uid, pod.container),
            from_start=from_start,
        )  # fmt: skip
        self._set(pod, [pod.api, log])

    def follow_api(self, pod_name: str, target: TargetConfig, *, from_start: bool) -> ApiLogReader | None:
        """The cluster mode's `follow`: the pod's API events and its engine container's log through the API, whose
        reader the discovery's follower feeds (blocking: a replaced pod's old sources are closed). None: removed."""
        pod = self._pods.get(pod_name)
        if pod is None:
            return None
        key = (pod.namespace, pod.name, pod.container)
        log, reader = pod_api_log(target, self._config, self._runner.saved, key, from_start=from_start)
        self._set(pod, [pod.api, log])
        return reader

    def unfollow(self, pod_name: str, target: str | None = None) -> None:
        """The pod's sources closed, what they held counted (blocking); its target's other pods' go on."""
        with self._lock:
            target = target or pod_name
            others = [s for key, p in self._pods.items() if p.target == target and key != pod_name for s in p.sources]
            self._runner.set_sources(target, others)

    def _set(self, pod: _Pod, sources: list[Any]) -> None:
        with self._lock:
            pod.sources = sources
            mine = [s for p in self._pods.values() if p.target == pod.target for s in p.sources]
            self._runner.set_sources(pod.target, mine)

    # -- the kubelet's Events of pods ---------------------------------------------------------------------------
    def events_listed(self, items: list[Obj], namespace: str | None) -> None:
        """A list of a scope's Events: it replaces what that scope knew; the first is only a baseline (those Events
        may be counted already), a later one counts what they gained while the watch was down."""
        relist = namespace in self._listed_in
        counts = {u: c for u, c in self._counts.items() if namespace is not None and c[0] != namespace}
        for obj in items:
            meta = obj.get("metadata") or {}
            if relist:
                self._count(obj, self._before(meta.get("uid", "")))
            counts[meta.get("uid", "")] = (meta.get("namespace", ""), _count(obj))
        self._counts = counts
        self._listed_in.add(namespace)

    def event(self, kind: str, obj: Obj) -> None:
        """One change of an Event from the watch: its count's growth is counted."""
        uid = (obj.get("metadata") or {}).get("uid", "")
        if kind == "DELETED":
            self._counts.pop(uid, None)
            return
        self._count(obj, self._before(uid))
        self._counts[uid] = ((obj.get("metadata") or {}).get("namespace", ""), _count(obj))

    def _before(self, uid: str) -> int:
        return self._counts.get(uid, ("", 0))[1]

    def _count(self, obj: Obj, before: int) -> None:
        """An Event whose count grew: its growth, as events of its kind for its pod, at most MAX_GROWTH a change.
        The kubelet writes its Event again at each failure (each a change the watch sees), so a change is one
        failure, or a few that a dropped watch missed; a count is the Event's writer's word, and one that jumps to
        10^15 counts MAX_GROWTH."""
        new = min(_count(obj) - before, MAX_GROWTH)
        if new <= 0 or (kind := probe_kind(obj)) is None:
            return
        pod = self._pod_of(obj)
        if pod is None:
            return
        field = _FIELD_CONTAINER.match((obj.get("involvedObject") or {}).get("fieldPath", ""))
        if field and field.group(1) != pod.container:
            return  # another container's probe
        at = timestamp(obj.get("lastTimestamp") or obj.get("eventTime")) or time.time()
        pod.api.push(Event(kind, at, count=new))

    def _pod_of(self, obj: Obj) -> _Pod | None:
        """The pod an Event is about: its namespace, name and UID all the pod's, and the Event in the pod's namespace
        (the kubelet writes it there; an Event written in another namespace that names the pod's UID is not)."""
        involved, meta = obj.get("involvedObject") or {}, obj.get("metadata") or {}
        uid = involved.get("uid")
        for pod in self._pods.values():
            if pod.uid == uid and pod.name == involved.get("name") and pod.namespace == involved.get("namespace"):
                return pod if meta.get("namespace") == pod.namespace else None
        return None


def checked_states(states: dict[str, dict[str, Any]], pod: str) -> dict[str, dict[str, Any]]:
    """A release's states checked as a state file is (events/runner.py): one that is not what an exporter writes is
    dropped, with a warning, and its source starts as if nothing was handed over."""
    out = {}
    for source, state in states.items():
        sections = {s: {f"{pod}|{source}": v} for s, v in state.items() if s in (POSITIONS, INCIDENTS)}
        try:
            check_state(sections)
        except BadState as exc:
            _log.warning("kubernetes: the state handed over for %s's %s is refused (%s)", pod, source, exc)
            continue
        out[source] = {s: v for s, v in state.items() if s in (POSITIONS, INCIDENTS)}
    return out


def _count(event: Obj) -> int:
    """An Event's count (its series' in the events.k8s.io form), 1 where it has none; one that is no whole number
    from 1 to MAX_EVENT_COUNT is taken as 1 (a count is the Event's writer's word)."""
    value = event.get("count") or (event.get("series") or {}).get("count") or 1
    if type(value) is not int or not 1 <= value <= MAX_EVENT_COUNT:
        return 1
    return value


def timestamp(value: str | None) -> float | None:
    """An API time (RFC 3339, `2026-01-02T03:04:05Z`) as Unix time."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
