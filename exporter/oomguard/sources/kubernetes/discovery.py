"""Pod discovery: the engine pods of this node become targets as they appear, and go as they go.

Watches the pods of this node that match the label selector (in every namespace, or in each
configured one) and the kubelet's Events of pods; keeps the runtime's scrapers and event sources in
step (a target `namespace/pod` per pod, its engine container's log followed, its API events counted).
While the API fails the known targets stay and are scraped; the failure is `oomguard_source_success
{source="kubernetes"} 0`. Everything here runs on the event loop; file work goes to threads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from oomguard.config import Config, TargetConfig
from oomguard.events.kinds import CONTAINER_OOM_KILLED, PROBE_FAILURE, PROBE_KILL
from oomguard.events.kubernetes import PodApiEvents
from oomguard.events.registry import pod_log
from oomguard.events.runner import EventRunner
from oomguard.events.source import POSITIONS
from oomguard.model import Event, NvmlReading, ProcessTree, TargetReading
from oomguard.process_start import start_time
from oomguard.sources.kubernetes import cgroup
from oomguard.sources.kubernetes.api import ApiClient, ApiError, connect
from oomguard.sources.kubernetes.pods import PodTarget, pod_target, timestamp
from oomguard.sources.kubernetes.watch import ListWatch, Obj
from oomguard.sources.registry import SourceRegistry
from oomguard.sources.target_set import TargetSet

log = logging.getLogger(__name__)
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
SOURCE = "kubernetes"  # the `source` label of oomguard_source_success
# The kubelet's messages: `Liveness probe failed: ...`, `Container vllm failed startup probe, will be restarted`.
_PROBE_FAILED = re.compile(r"^(Liveness|Startup) probe failed", re.IGNORECASE)
_PROBE_KILLED = re.compile(r"failed (liveness|startup) probe", re.IGNORECASE)
_FIELD_CONTAINER = re.compile(r"spec\.(?:initC|c)ontainers\{(.+)\}")


@dataclass
class _Known:
    pod: PodTarget
    api: PodApiEvents


def probe_kind(event: Obj) -> str | None:
    """The event kind of a kubelet Event of a pod (PROBE_FAILURE, PROBE_KILL), or None."""
    reason, message = event.get("reason", ""), event.get("message", "")
    if reason == "Unhealthy" and _PROBE_FAILED.search(message):
        return PROBE_FAILURE
    if reason == "Killing" and _PROBE_KILLED.search(message):
        return PROBE_KILL
    return None


class KubernetesDiscovery:
    def __init__(
        self,
        config: Config,
        *,
        registry: SourceRegistry,
        targets: TargetSet,
        events: EventRunner,
    ) -> None:
        assert config.kubernetes is not None
        self.config = config
        self.k8s = config.kubernetes
        self.registry = registry
        self.targets = targets
        self.events = events
        self.static = {t.label for t in config.targets}
        self.known: dict[str, _Known] = {}  # by target name
        self.watches: list[ListWatch] = []
        self._health: dict[str, tuple[bool, float]] = {}  # by watch path
        # Pods listed in every scope: later pods are new, their logs read from the start.
        self._scopes: list[str | None] = list(self.k8s.namespaces) or [None]
        self._pods_listed_in: set[str | None] = set()
        self._event_counts: dict[str, tuple[str, int]] = {}  # Event UID -> (its namespace, its count) as last seen
        self._events_listed_in: set[str | None] = set()
        self._client: ApiClient | None = None

    # -- running --------------------------------------------------------------------------------
    async def run(self) -> None:
        retry = 0.5
        while self._client is None:
            try:
                connection = await asyncio.to_thread(connect, self.k8s.kubeconfig)
                self._client = ApiClient(connection)
                log.info("kubernetes: API at %s (%s), node %s",
                         connection.server, connection.source, self.k8s.node_name)  # fmt: skip
            except (ApiError, OSError) as exc:
                self.registry.record(SOURCE, False, 0.0)
                log.error("kubernetes: cannot find the API: %s (retried in %.1fs)", exc, retry)
                await asyncio.sleep(retry)
                retry = min(retry * 2, self.k8s.retry_max_seconds)
        try:
            await asyncio.gather(*(w.run() for w in self._make_watches(self._client)))
        finally:
            await self._client.close()

    def _make_watches(self, client: ApiClient) -> list[ListWatch]:
        pods: dict[str, str] = {"fieldSelector": f"spec.nodeName={self.k8s.node_name}"}
        if self.k8s.label_selector:
            pods["labelSelector"] = self.k8s.label_selector
        events = {"fieldSelector": "involvedObject.kind=Pod,source=kubelet"}
        for namespace in self._scopes:
            prefix = f"/api/v1/namespaces/{namespace}" if namespace else "/api/v1"
            for path, params, on_list, on_event in (
                (f"{prefix}/pods", pods, self._pods_listed, self._pod_event),
                (f"{prefix}/events", events, self._events_list, self._api_event),
            ):
                self.watches.append(
                    ListWatch(
                        client, path, params,
                        on_list=_scoped(on_list, namespace), on_event=on_event,
                        on_health=_health_of(self, path),
                        resync_seconds=self.k8s.resync_seconds, retry_max_seconds=self.k8s.retry_max_seconds,
                    )
                )  # fmt: skip
        return self.watches

    def _record(self, path: str, ok: bool, duration: float, error: str) -> None:
        self._health[path] = (ok, duration)
        self.registry.record(SOURCE, all(o for o, _ in self._health.values()), duration)

    # -- pods -----------------------------------------------------------------------------------
    async def _pods_listed(self, items: list[Obj], namespace: str | None) -> None:
        seen: set[str] = set()
        for obj in items:
            if (pod := pod_target(obj, self.k8s.port, self.k8s.engine)) is not None and pod.target not in self.static:
                seen.add(pod.target)
                await self._upsert(pod)
        for name, known in list(self.known.items()):
            if name not in seen and (namespace is None or known.pod.namespace == namespace):
                await self._remove(name)  # gone while the watch was down
        self._pods_listed_in.add(namespace)

    @property
    def _listed(self) -> bool:
        return len(self._pods_listed_in) == len(self._scopes)

    async def _pod_event(self, kind: str, obj: Obj) -> None:
        pod = pod_target(obj, self.k8s.port, self.k8s.engine) if kind != "DELETED" else None
        meta = obj.get("metadata") or {}
        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if pod is None:
            if name in self.known and (kind == "DELETED" or meta.get("uid") == self.known[name].pod.uid):
                await self._remove(name)
        elif pod.target not in self.static:
            await self._upsert(pod)

    async def _upsert(self, pod: PodTarget) -> None:
        # Every change is made before the one await: a resync's timeout may cancel this there, and the thread
        # it awaits runs to its end regardless.
        known = self.known.get(pod.target)
        config = TargetConfig(url=pod.url, name=pod.target, engine=self.k8s.engine, local_process="no")
        follow = False
        if known is None:
            saved = self.events.saved
            source = f"k8s-api:{pod.target}"
            api = PodApiEvents(pod.target, source, saved.of(pod.target, source).get(POSITIONS))
            if api.last_termination is None and not self._listed and pod.last_termination is not None:
                api.last_termination = pod.last_termination.key  # ended before we watched: maybe counted before
            self.targets.add(config)
            known = self.known[pod.target] = _Known(pod, api)
            follow = True
            log.info("kubernetes: target %s at %s (container %s)", pod.target, pod.url, pod.container)
        elif known.pod.uid != pod.uid or known.pod.url != pod.url:
            # The pod replaced under its name (a StatefulSet's): its new address, its new log folder.
            self.targets.retarget(pod.target, config)
            follow = known.pod.uid != pod.uid
            log.info("kubernetes: target %s now at %s", pod.target, pod.url)
        elif pod.restart_count > known.pod.restart_count:
            self.targets.new_life(pod.target)  # a new container: loading until it answers, not down
        known.pod = pod
        self.targets.set_pod(pod.target, pod)
        ended = pod.last_termination
        if ended is not None and ended.key != known.api.last_termination:
            known.api.last_termination = ended.key
            if ended.oom_killed:
                known.api.push(Event(CONTAINER_OOM_KILLED, ended.finished_at or time.time()))
        if follow:
            await asyncio.to_thread(self._follow, pod.target, config, pod, known.api)

    def _follow(self, name: str, config: TargetConfig, pod: PodTarget, api: PodApiEvents) -> None:
        """The target's event sources: its API events and its engine container's log (blocking: in a thread)."""
        log_source = pod_log(
            config, self.config.events, self.events.saved, (pod.namespace, pod.name, pod.uid, pod.container),
            from_start=self._listed,
        )  # fmt: skip
        self.events.set_sources(name, [api, log_source])

    async def _remove(self, name: str) -> None:
        self.known.pop(name)
        self.targets.remove(name)
        await asyncio.to_thread(self.events.set_sources, name, [])
        log.info("kubernetes: target %s gone", name)

    # -- the kubelet's Events of pods -----------------------------------------------------------
    async def _events_list(self, items: list[Obj], namespace: str | None) -> None:
        relist = namespace in self._events_listed_in
        # A list replaces what its scope knew; the first is only a baseline (those Events may be counted already).
        counts = {u: c for u, c in self._event_counts.items() if namespace is not None and c[0] != namespace}
        for obj in items:
            meta = obj.get("metadata") or {}
            if relist:  # what happened while the watch was down
                self._count_event(obj, self._before(meta.get("uid", "")))
            counts[meta.get("uid", "")] = (meta.get("namespace", ""), _count(obj))
        self._event_counts = counts
        self._events_listed_in.add(namespace)

    def _before(self, uid: str) -> int:
        return self._event_counts.get(uid, ("", 0))[1]

    async def _api_event(self, kind: str, obj: Obj) -> None:
        uid = (obj.get("metadata") or {}).get("uid", "")
        if kind == "DELETED":
            self._event_counts.pop(uid, None)
            return
        self._count_event(obj, self._before(uid))
        self._event_counts[uid] = ((obj.get("metadata") or {}).get("namespace", ""), _count(obj))

    def _count_event(self, obj: Obj, before: int) -> None:
        new = _count(obj) - before
        if new <= 0 or (kind := probe_kind(obj)) is None:
            return
        involved = obj.get("involvedObject") or {}
        known = next((k for k in self.known.values() if k.pod.uid == involved.get("uid")), None)
        if known is None:
            return
        field = _FIELD_CONTAINER.match(involved.get("fieldPath", ""))
        if field and field.group(1) != known.pod.container:
            return  # another container's probe
        at = timestamp(obj.get("lastTimestamp") or obj.get("eventTime")) or time.time()
        known.api.push(Event(kind, at, count=new))

    # -- attribution: NVML's pids -> pods, through /proc/<pid>/cgroup ---------------------------
    async def attribute(
        self, nvml: NvmlReading | None, targets: tuple[TargetReading, ...]
    ) -> tuple[TargetReading, ...]:
        """The discovered targets with their pods' processes on the GPUs (which GPUs, their own memory) and their
        engine container's settings (its command line: the reservation it was told, while it reports none)."""
        trees = await self.pod_processes(nvml)
        out = []
        for t in targets:
            if t.name in trees and t.process is None:
                t = replace(t, process=trees[t.name])
            known = self.known.get(t.name)
            if known is not None and known.pod.settings and not t.settings:
                t = replace(t, settings=known.pod.settings)
            out.append(t)
        return tuple(out)

    async def pod_processes(self, nvml: NvmlReading | None) -> dict[str, ProcessTree]:
        """Target name -> its pod's processes in NVML's lists (for the collection and the trend sampler)."""
        pods = {k.pod.uid: name for name, k in self.known.items()}
        if nvml is None or not pods:
            return {}
        pids = {p.pid for g in nvml.gpus for p in g.processes or ()}
        return await asyncio.to_thread(_trees, pids, self.k8s.proc_dir, pods)


def _trees(pids: set[int], proc_dir: str, pods: dict[str, str]) -> dict[str, ProcessTree]:
    """Target name -> its pod's GPU processes (blocking: reads /proc)."""
    by_target: dict[str, list[int]] = {}
    for pid, (uid, _container) in cgroup.attribute(sorted(pids), proc_dir).items():
        if uid in pods:
            by_target.setdefault(pods[uid], []).append(pid)
    out = {}
    for name, mine in by_target.items():
        starts = [s for pid in mine if (s := start_time(pid)) is not None] if proc_dir == "/proc" else []
        out[name] = ProcessTree(
            root_pid=min(mine),
            pids=frozenset(mine),
            resident_bytes=sum(_resident_bytes(proc_dir, pid) for pid in mine),
            start_time_seconds=min(starts) if starts else 0.0,
        )
    return out


def _resident_bytes(proc_dir: str, pid: int) -> float:
    try:
        with open(f"{proc_dir}/{pid}/statm", "rb") as f:
            return float(int(f.read().split()[1]) * PAGE_SIZE)
    except (OSError, ValueError, IndexError):
        return 0.0  # exited since NVML listed it


def _count(event: Obj) -> int:
    return int(event.get("count") or (event.get("series") or {}).get("count") or 1)


def _scoped(on_list: Callable[[list[Obj], str | None], Any], namespace: str | None) -> Callable[[list[Obj]], Any]:
    async def call(items: list[Obj]) -> None:
        await on_list(items, namespace)

    return call


def _health_of(discovery: KubernetesDiscovery, path: str) -> Callable[[bool, float, str], None]:
    return lambda ok, duration, error: discovery._record(path, ok, duration, error)
