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
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from oomguard.config import Config, TargetConfig
from oomguard.events.kubernetes import PodEvents
from oomguard.model import LogStreams, NvmlReading, ProcessTree, TargetReading
from oomguard.process_start import start_time
from oomguard.sources.dcgm import DcgmEndpoint
from oomguard.sources.kubernetes import cgroup
from oomguard.sources.kubernetes.api import ApiClient, ApiError, connect
from oomguard.sources.kubernetes.pod_logs import PodLogFollower
from oomguard.sources.kubernetes.pods import PodTarget, pod_target
from oomguard.sources.kubernetes.shards import Shard
from oomguard.sources.kubernetes.trusted_dcgm import TrustedDcgm
from oomguard.sources.kubernetes.watch import ListWatch, Obj
from oomguard.sources.registry import SourceRegistry
from oomguard.sources.target_set import TargetSet

log = logging.getLogger(__name__)
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
SOURCE = "kubernetes"  # the `source` label of oomguard_source_success
PROCESSES = "pod_processes"  # the source label of the attribution of NVML's pids to pods (/proc cgroups)


class KubernetesDiscovery:
    def __init__(
        self,
        config: Config,
        *,
        registry: SourceRegistry,
        targets: TargetSet,
        pod_events: PodEvents,
    ) -> None:
        assert config.kubernetes is not None
        self.config = config
        self.k8s = config.kubernetes
        self.registry = registry
        self.targets = targets
        self.pod_events = pod_events
        self.static = {t.label for t in config.targets}
        self.known: dict[str, PodTarget] = {}  # by target name
        self.watches: list[ListWatch] = []
        self._health: dict[str, tuple[bool, float]] = {}  # by watch path
        # Pods listed in every scope: later pods are new, their logs read from the start.
        self._scopes: list[str | None] = list(self.k8s.namespaces) or [None]
        self._pods_listed_in: set[str | None] = set()
        self._client: ApiClient | None = None
        self.cluster = self.k8s.scope == "cluster"  # every node's pods, no host access (docs/kubernetes.md)
        # The nodes this exporter reads, where the cluster mode is sharded (shards.py); the API cannot select by a
        # hash, so every shard lists every engine pod and keeps its own nodes'.
        self.shard = Shard(self.k8s.shard or 0, self.k8s.shards)
        self._dcgm: dict[tuple[str, str], DcgmEndpoint] = {}  # the dcgm-exporter pods taken, by (namespace, name)
        self._dcgm_trusted = TrustedDcgm(config.dcgm.daemonsets if config.dcgm is not None else ())
        self.dcgm_port = config.dcgm.port if config.dcgm is not None else 0
        self._log_followers: dict[str, asyncio.Task[None]] = {}  # the cluster mode's, by target name
        self._unmapped = UnmappedPods()

    # -- running --------------------------------------------------------------------------------
    async def run(self) -> None:
        retry = 0.5
        while self._client is None:
            try:
                connection = await asyncio.to_thread(connect, self.k8s.kubeconfig)
                self._client = ApiClient(connection)
                log.info("kubernetes: API at %s (%s), node %s",
                         connection.server, connection.source, self.k8s.node_name)  # fmt: skip
                if self.shard.count > 1:
                    log.info("kubernetes: shard %d of %d: the nodes whose name hashes to %d, their pods and "
                             "dcgm-exporter", self.shard.index, self.shard.count, self.shard.index)  # fmt: skip
            except (ApiError, OSError) as exc:
                self.registry.record(SOURCE, False, 0.0)
                log.error("kubernetes: cannot find the API: %s (retried in %.1fs)", exc, retry)
                await asyncio.sleep(retry)
                retry = min(retry * 2, self.k8s.retry_max_seconds)
        try:
            await asyncio.gather(*(w.run() for w in self._make_watches(self._client)))
        finally:
            for task in self._log_followers.values():
                task.cancel()
            await asyncio.gather(*self._log_followers.values(), return_exceptions=True)
            await self._client.close()

    def _make_watches(self, client: ApiClient) -> list[ListWatch]:
        # Filtered by the server: a node's pods (an indexed field), the engines' labels; finished pods make no target.
        fields = "status.phase!=Succeeded,status.phase!=Failed"
        pods: dict[str, str] = {"fieldSelector": fields if self.cluster else f"spec.nodeName={self.k8s.node_name}"}
        if self.k8s.label_selector:
            pods["labelSelector"] = self.k8s.label_selector
        events = {"fieldSelector": "involvedObject.kind=Pod,source=kubelet"}
        for namespace in self._scopes:
            prefix = f"/api/v1/namespaces/{namespace}" if namespace else "/api/v1"
            for path, params, on_list, on_event in (
                (f"{prefix}/pods", pods, self._pods_listed, self._pod_event),
                (f"{prefix}/events", events, self._events_list, self._kubelet_event),
            ):
                self.watches.append(
                    ListWatch(
                        client, path, params,
                        on_list=_scoped(on_list, namespace), on_event=on_event,
                        on_health=_health_of(self, path),
                        resync_seconds=self.k8s.resync_seconds, retry_max_seconds=self.k8s.retry_max_seconds,
                    )
                )  # fmt: skip
        dcgm = self.config.dcgm
        if dcgm is not None and dcgm.discover:
            params = {"labelSelector": dcgm.label_selector, "fieldSelector": fields}
            for namespace in dcgm.namespaces or (None,):
                path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
                self.watches.append(
                    ListWatch(
                        client, path, params,
                        on_list=_scoped(self._dcgm_listed, namespace), on_event=self._dcgm_event,
                        on_health=_health_of(self, path + "?dcgm"),
                        resync_seconds=self.k8s.resync_seconds, retry_max_seconds=self.k8s.retry_max_seconds,
                    )
                )  # fmt: skip
        return self.watches

    # -- dcgm-exporter's pods: where each node's GPUs are read (sources/dcgm.py) ----------------------------
    def dcgm_endpoints(self) -> list[DcgmEndpoint]:
        """One per node: a node that two pods claim is read from neither (TrustedDcgm)."""
        return self._dcgm_trusted.endpoints(self._dcgm)

    def dcgm_refusals(self) -> dict[tuple[str, str, str, str], int]:
        """(node, namespace, pod, reason) -> how often it was refused as its node's dcgm-exporter."""
        return self._dcgm_trusted.refusals

    async def _dcgm_listed(self, items: list[Obj], namespace: str | None) -> None:
        self._dcgm = {key: e for key, e in self._dcgm.items() if namespace is not None and key[0] != namespace}
        for obj in items:
            await self._dcgm_event("ADDED", obj)

    async def _dcgm_event(self, kind: str, obj: Obj) -> None:
        meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        ip, node = status.get("podIP") or "", spec.get("nodeName") or ""
        gone = kind == "DELETED" or not ip or not node or status.get("phase") in ("Succeeded", "Failed")
        if gone or not self.shard.owns(node):  # another shard's node: read, and judged, by that shard
            self._dcgm_trusted.forget(key)
            if self._dcgm.pop(key, None) is not None:
                log.info("kubernetes: dcgm-exporter %s/%s gone", *key)
            return
        if not self._dcgm_trusted.owned(obj, key, node):
            self._dcgm.pop(key, None)
            return
        host = f"[{ip}]" if ":" in ip else ip
        endpoint = DcgmEndpoint(f"http://{host}:{self.dcgm_port}/metrics", node)
        if self._dcgm.get(key) != endpoint:
            log.info("kubernetes: dcgm-exporter of node %s at %s", node, endpoint.url)
        self._dcgm[key] = endpoint

    def _record(self, path: str, ok: bool, duration: float, error: str) -> None:
        self._health[path] = (ok, duration)
        self.registry.record(SOURCE, all(o for o, _ in self._health.values()), duration)

    # -- pods -----------------------------------------------------------------------------------
    async def _pods_listed(self, items: list[Obj], namespace: str | None) -> None:
        seen: set[str] = set()
        for obj in items:
            pod = self._own(pod_target(obj, self.k8s.port, self.k8s.engine))
            if pod is not None and pod.target not in self.static:
                seen.add(pod.target)
                await self._upsert(pod)
        for name, known in list(self.known.items()):
            if name not in seen and (namespace is None or known.namespace == namespace):
                await self._remove(name)  # gone while the watch was down
        self._pods_listed_in.add(namespace)

    @property
    def _listed(self) -> bool:
        return len(self._pods_listed_in) == len(self._scopes)

    async def _pod_event(self, kind: str, obj: Obj) -> None:
        pod = self._own(pod_target(obj, self.k8s.port, self.k8s.engine)) if kind != "DELETED" else None
        meta = obj.get("metadata") or {}
        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if pod is None:
            if name in self.known and (kind == "DELETED" or meta.get("uid") == self.known[name].uid):
                await self._remove(name)
        elif pod.target not in self.static:
            await self._upsert(pod)

    def _own(self, pod: PodTarget | None) -> PodTarget | None:
        """The pod, if it runs on one of this shard's nodes."""
        return pod if pod is not None and self.shard.owns(pod.node) else None

    async def _upsert(self, pod: PodTarget) -> None:
        # Every change is made before the one await: a resync's timeout may cancel this there, and the thread
        # it awaits runs to its end regardless.
        known = self.known.get(pod.target)
        config = TargetConfig(url=pod.url, name=pod.target, engine=self.k8s.engine, local_process="no")
        follow = False
        if known is None:
            self.targets.add(config)
            self.pod_events.add(
                pod.target, namespace=pod.namespace, name=pod.name, uid=pod.uid, container=pod.container,
                ended=pod.last_termination, watched=self._listed,
            )  # fmt: skip
            follow = True
            log.info("kubernetes: target %s at %s (container %s)", pod.target, pod.url, pod.container)
        elif known.uid != pod.uid or known.url != pod.url:
            # The pod replaced under its name (a StatefulSet's): its new address, its new log folder.
            self.targets.retarget(pod.target, config)
            follow = known.uid != pod.uid
            log.info("kubernetes: target %s now at %s", pod.target, pod.url)
        elif pod.restart_count > known.restart_count:
            self.targets.new_life(pod.target)  # a new container: loading until it answers, not down
        self.known[pod.target] = pod
        self.targets.set_pod(pod.target, pod.uid, pod.ref)
        self.pod_events.update(pod.target, uid=pod.uid, container=pod.container, ended=pod.last_termination)
        if follow and self.cluster:
            await self._follow_api(pod, config)
        elif follow:
            await asyncio.to_thread(self.pod_events.follow, pod.target, config, from_start=self._listed)

    async def _follow_api(self, pod: PodTarget, config: TargetConfig) -> None:
        """The cluster mode: the engine container's log through the API, one stream per container."""
        if (old := self._log_followers.pop(pod.target, None)) is not None:
            old.cancel()
        reader = await asyncio.to_thread(self.pod_events.follow_api, config, from_start=self._listed)
        now = self.known.get(pod.target)
        if reader is None or self._client is None or now is None or now.uid != pod.uid:
            return  # removed or replaced while this waited for its thread (its replacement follows its own log)
        follower = PodLogFollower(
            self._client, reader, namespace=pod.namespace, pod=pod.name, container=pod.container,
            retry_max_seconds=self.k8s.retry_max_seconds,
        )  # fmt: skip
        self._log_followers[pod.target] = asyncio.ensure_future(follower.run())

    async def _remove(self, name: str) -> None:
        self.known.pop(name)
        self.targets.remove(name)
        self.pod_events.remove(name)
        if (follower := self._log_followers.pop(name, None)) is not None:
            follower.cancel()
        await asyncio.to_thread(self.pod_events.unfollow, name)
        log.info("kubernetes: target %s gone", name)

    # -- the kubelet's Events of pods: counted in events/kubernetes.py --------------------------------------
    async def _events_list(self, items: list[Obj], namespace: str | None) -> None:
        self.pod_events.events_listed([obj for obj in items if self._own_event(obj)], namespace)

    async def _kubelet_event(self, kind: str, obj: Obj) -> None:
        if self._own_event(obj):
            self.pod_events.event(kind, obj)

    def _own_event(self, obj: Obj) -> bool:
        """An Event of a kubelet of this shard's nodes (its `source.host`); one without a host is matched to the
        pods this shard knows, as any Event is."""
        host = (obj.get("source") or {}).get("host") or ""
        return not host or self.shard.owns(host)

    # -- attribution: NVML's pids -> pods, through /proc/<pid>/cgroup ---------------------------
    async def attribute(
        self, nvml: NvmlReading | None, targets: tuple[TargetReading, ...]
    ) -> tuple[TargetReading, ...]:
        """The discovered targets with their pod (its labels and probes, the kubelet's restart count), its processes
        on the GPUs (which GPUs, their own memory) and its engine container's settings (its command line: the
        reservation it was told, while it reports none). Never raises: a failed /proc read is the `pod_processes`
        source's failure, and the readings go on without the processes."""
        # timed, never raising; the cluster mode reads no /proc: no such source
        trees = {} if self.cluster else await self.registry.run(PROCESSES, self.pod_processes(nvml)) or {}
        out = []
        for t in targets:
            pod = self.known.get(t.name)
            if pod is None:
                out.append(t)
                continue
            # The kubelet's restart count: it sees every life, even one killed before its first line.
            ended = pod.last_termination
            last_restart_at = ended.finished_at if ended and ended.finished_at else t.last_restart_at
            t = replace(t, pod=pod.ref, restarts_total=pod.restart_count, last_restart_at=last_restart_at)
            if t.name in trees and t.process is None:
                t = replace(t, process=trees[t.name])
            if pod.settings and not t.settings:
                t = replace(t, settings=pod.settings)
            out.append(t)
        if self.cluster and nvml is not None:
            self._unmapped.say(nvml, [self.known[t.name] for t in out if t.name in self.known])
        return tuple(out)

    async def pod_processes(self, nvml: NvmlReading | None) -> dict[str, ProcessTree]:
        """Target name -> its pod's processes in NVML's lists (for the collection and the trend sampler)."""
        pods = {pod.uid: name for name, pod in self.known.items()}
        if nvml is None or not pods or self.cluster:
            return {}  # the cluster mode reads no host's /proc (and dcgm-exporter lists no pids)
        pids = {p.pid for g in nvml.gpus for p in g.processes or ()}
        return await asyncio.to_thread(_trees, pids, self.k8s.proc_dir, pods)

    def log_streams(self) -> LogStreams | None:
        """The cluster mode's log streams against their budget (sources/kubernetes/log_budget.py); None before the
        API is found, and in the node mode, which follows files."""
        return self._client.log_budget.counts() if self._client is not None and self.cluster else None


class UnmappedPods:
    """The cluster mode finds a pod's GPUs by dcgm-exporter's pod labels alone: where they are missing, the pod's
    memory figures and alerts are silently absent. Said once per node (its dcgm-exporter names no pod at all: its
    Kubernetes mapping is off) and once per pod (its node's names others, not it: a pod that uses GPUs without
    requesting nvidia.com/gpu is not mapped, nor is a CPU engine, which needs nothing)."""

    def __init__(self) -> None:
        self._said: set[str] = set()  # nodes and pods said, said again only after they are mapped

    def say(self, gpus: NvmlReading, pods: list[PodTarget]) -> None:
        nodes: dict[str, set[tuple[str, str]]] = {}
        for gpu in gpus.gpus:
            nodes.setdefault(gpu.node, set()).update(gpu.pods)
        for pod in pods:
            mapped = nodes.get(pod.node)
            if mapped is None:
                continue  # no GPU read on its node (no dcgm-exporter there, or it failed: said by the source)
            key, node_key = f"pod {pod.target}", f"node {pod.node}"
            if not mapped:
                self._once(node_key, "kubernetes: dcgm-exporter on node %s names no pod on its GPUs: its Kubernetes "
                           "mapping is off (the GPU Operator sets it; dcgm-exporter's --kubernetes), so no pod there "
                           "is joined with its GPUs", pod.node)  # fmt: skip
            elif (pod.namespace, pod.name) not in mapped:
                self._said.discard(node_key)
                self._once(key, "kubernetes: dcgm-exporter on node %s names no GPU of pod %s: its memory figures are "
                           "absent (a pod that uses GPUs without requesting nvidia.com/gpu is not mapped)",
                           pod.node, pod.target)  # fmt: skip
            else:
                self._said.discard(key)
                self._said.discard(node_key)

    def _once(self, key: str, message: str, *args: object) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning(message, *args)


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


def _scoped(on_list: Callable[[list[Obj], str | None], Any], namespace: str | None) -> Callable[[list[Obj]], Any]:
    async def call(items: list[Obj]) -> None:
        await on_list(items, namespace)

    return call


def _health_of(discovery: KubernetesDiscovery, path: str) -> Callable[[bool, float, str], None]:
    return lambda ok, duration, error: discovery._record(path, ok, duration, error)
