"""Pod discovery: the engine pods of this node become targets as they appear, and go as they go.

Watches the pods of this node that match the label selector (in every namespace, or in each
configured one) and the kubelet's Events of pods; keeps the runtime's scrapers and event sources in
step (a target `namespace/pod` per pod, its engine container's log followed, its API events counted).
While the API fails the known targets stay and are scraped; the failure is `oomguard_source_success
{source="kubernetes"} 0`. Everything here runs on the event loop; file work goes to threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from oomguard.common.process_start import start_time
from oomguard.exporter.config import Config, TargetConfig
from oomguard.exporter.events.kubernetes import PodEvents
from oomguard.exporter.model import GpuReadings, LogStreams, ProcessTree, TargetReading
from oomguard.exporter.sources.dcgm import DcgmEndpoint
from oomguard.exporter.sources.kubernetes import cgroup
from oomguard.exporter.sources.kubernetes.api import ApiClient, ApiError, connect
from oomguard.exporter.sources.kubernetes.groups import PodGroup
from oomguard.exporter.sources.kubernetes.handover import REFRESH_SECONDS, Decision, Handover, record_key
from oomguard.exporter.sources.kubernetes.handover import SOURCE as HANDOVER
from oomguard.exporter.sources.kubernetes.pod_logs import PodLogFollower
from oomguard.exporter.sources.kubernetes.pods import PodTarget, pod_target
from oomguard.exporter.sources.kubernetes.shards import Shard
from oomguard.exporter.sources.kubernetes.trusted_dcgm import TrustedDcgm
from oomguard.exporter.sources.kubernetes.watch import ListWatch, Obj
from oomguard.exporter.sources.source_runs import SourceRuns
from oomguard.exporter.sources.target_set import TargetSet

log = logging.getLogger(__name__)
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
SOURCE = "kubernetes"  # the `source` label of oomguard_source_success
PROCESSES = "pod_processes"  # the source label of the attribution of NVML's pids to pods (/proc cgroups)


class KubernetesDiscovery:
    def __init__(
        self,
        config: Config,
        *,
        source_runs: SourceRuns,
        targets: TargetSet,
        pod_events: PodEvents,
    ) -> None:
        assert config.kubernetes is not None
        self.config = config
        self.k8s = config.kubernetes
        self.source_runs = source_runs
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
        dcgm = config.dcgm
        self._dcgm_trusted = TrustedDcgm(dcgm.daemonsets, dcgm.namespaces) if dcgm is not None else TrustedDcgm((), ())
        self.dcgm_port = config.dcgm.port if config.dcgm is not None else 0
        self._log_followers: dict[str, asyncio.Task[None]] = {}  # the cluster mode's, by pod name
        self._unmapped = UnmappedPods()
        # Engines spanning pods (groups.py). The pods the watch gave that are tracked, with their group (None: an
        # engine of its own); each group's leader as last seen, on any node; the workers on this exporter's nodes;
        # the workers attached to their leader's target (pod name -> target name), and the targets whose leader is
        # on a node another exporter reads.
        self._seen: dict[str, PodGroup | None] = {}
        self._leaders: dict[str, PodTarget] = {}  # by group key
        self._workers: dict[str, PodTarget] = {}  # by pod name
        self._attached: dict[str, tuple[str, PodTarget]] = {}  # pod name -> (target, the worker as attached)
        self._elsewhere: set[str] = set()
        self._group_target: dict[str, str] = {}  # group key -> its target's name, while it has one
        self._finding: dict[str, asyncio.Task[None]] = {}  # group key -> the request for its leader (node mode)
        self._said_no_leader: set[str] = set()
        self._followed: set[str] = set()  # the attached workers whose sources were given to the runner
        # A sharded cluster mode hands a node that changes shard over through the API (handover.py): the nodes this
        # exporter reads and how each was taken; those another shard count's shard still reads, with their pods as
        # last seen (read once it lets them go); how each pod of a node taken resumes (pod UID -> watched, whole);
        # the nodes held at the last run and no more, with their pods' saved states, until the first list is done.
        self._handover: Handover | None = None
        self._taken: dict[str, Decision] = {}
        self._waiting: dict[str, dict[str, Obj]] = {}
        self._handed: dict[str, tuple[bool, bool]] = {}
        self._releasing: dict[str, dict[str, dict[str, Any]]] = {}
        self._handover_tasks: list[asyncio.Task[None]] = []
        self._handover_wake = asyncio.Event()  # a node began to wait: read the records again soon

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
                self.source_runs.record(SOURCE, False, 0.0)
                log.error("kubernetes: cannot find the API: %s (retried in %.1fs)", exc, retry)
                await asyncio.sleep(retry)
                retry = min(retry * 2, self.k8s.retry_max_seconds)
        try:
            if self._sharded():
                await self._start_handover(self._client)
            await asyncio.gather(*(w.run() for w in self._make_watches(self._client)))
        finally:
            tasks = [*self._log_followers.values(), *self._finding.values(), *self._handover_tasks]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """Once the event runner has closed the sources (runtime.py): the nodes read are handed over, at the last
        line read (a sharded cluster mode), and the API client closed."""
        if self._client is None:
            return
        if self._handover is not None and self._handover.usable:
            # Every node held, those read with their pods' states, those of no pod this run with none (a pod there
            # now is new to whoever reads it next); not those of the last run still to let go (the first list not
            # done): their states are on this exporter's volume, and its next start lets them go.
            held = [n for n, e in self._handover.mine.nodes.items() if e.held and n not in self._releasing]
            for node in held:
                self._handover.release(node, self._pod_states(node) if node in self._taken else {})
            await self._write_handover()
            if held:
                log.info("kubernetes: %d nodes let go, at the last line read of each pod, for the shard that reads "
                         "them next", len(held))  # fmt: skip
        await self._client.close()
        self._client = None

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
            for namespace in dcgm.namespaces:  # required (config.py): never every namespace
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
        """One per node: a node that two pods claim is read from neither (TrustedDcgm); a node another shard count's
        shard still reads (a reshard rolling, handover.py) is read by that one alone, until it lets it go."""
        return self._dcgm_trusted.endpoints({k: e for k, e in self._dcgm.items() if self._node_taken(e.node)})

    def dcgm_refusals(self) -> dict[tuple[str, str, str, str], int]:
        """(node, namespace, pod, reason) -> how often it was refused as its node's dcgm-exporter."""
        return self._dcgm_trusted.refusals

    def dcgm_node_pods(self) -> dict[str, int]:
        """Node -> the pods taken as its dcgm-exporter at the last read: 2 and more, a node read from none."""
        return self._dcgm_trusted.claims

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
        self.source_runs.record(SOURCE, all(o for o, _ in self._health.values()), duration)

    # -- pods -----------------------------------------------------------------------------------
    async def _pods_listed(self, items: list[Obj], namespace: str | None) -> None:
        first = not self._listed
        seen = set()
        for obj in items:
            seen.add(await self._pod_changed(obj))
            if self._releasing:
                self._note_released_pod(obj)
        for name in [
            n for n in self._seen if n not in seen and (namespace is None or n.partition("/")[0] == namespace)
        ]:
            await self._pod_gone(name)  # gone while the watch was down
        for stash in self._waiting.values():
            for name in [n for n in stash if n not in seen and (namespace is None or n.partition("/")[0] == namespace)]:
                del stash[name]
        self._pods_listed_in.add(namespace)
        if first and self._listed and self._handover is not None and self._handover.usable:
            for node, pods in self._releasing.items():  # held at the last run, another shard's now
                self._handover.release(node, pods)
            if self._releasing:
                log.info("kubernetes: %d nodes read at the last run are another shard's now: let go at the last line "
                         "read", len(self._releasing))  # fmt: skip
            self._releasing = {}
            await self._write_handover()

    @property
    def _listed(self) -> bool:
        return len(self._pods_listed_in) == len(self._scopes)

    async def _pod_event(self, kind: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if kind == "DELETED":
            for stash in self._waiting.values():
                stash.pop(name, None)
            if name in self._seen and self._uid_of(name) in (None, meta.get("uid")):
                await self._pod_gone(name)
            return
        await self._pod_changed(obj)

    def _uid_of(self, name: str) -> str | None:
        pod = self.known.get(name) or self._workers.get(name)
        if pod is None:
            group = self._seen.get(name)
            pod = self._leaders.get(group.key) if group is not None else None
        return pod.uid if pod is not None else None

    def _owns_node(self, node: str) -> bool:
        """Whether this exporter reads `node`'s GPUs: its own node (the node mode), or a node of its shard."""
        if self.cluster:
            return self.shard.owns(node) and self._node_taken(node)
        return not self.k8s.node_name or node == self.k8s.node_name

    async def _pod_changed(self, obj: Obj) -> str:
        """A pod as the watch or a list gives it; its name."""
        meta = obj.get("metadata") or {}
        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        pod = pod_target(obj, self.k8s.port, self.k8s.engine)
        if pod is None or pod.target in self.static:
            if name in self._seen and (pod is None and meta.get("uid") == self._uid_of(name)):
                await self._pod_gone(name)  # finished, or lost its address: no target
            return name
        if self.cluster and self.shard.owns(pod.node) and not self._node_taken(pod.node):
            self._waiting[pod.node][name] = obj  # another shard count's shard reads its node still
            return name
        group = pod.group
        if group is None:
            if self._owns_node(pod.node):
                self._seen[name] = None
                await self._upsert(pod)
            elif name in self._seen:
                await self._pod_gone(name)
            return name
        if group.leader:
            self._seen[name] = group
            self._leaders[group.key] = pod
        elif self._owns_node(pod.node):
            self._seen[name] = group
            self._workers[name] = pod
        else:
            return name  # another exporter's worker
        await self._sync_group(group)
        return name

    async def _pod_gone(self, name: str) -> None:
        if name not in self._seen:
            return
        group = self._seen.pop(name)
        if group is None:
            if name in self.known:
                await self._remove(name)
            return
        if group.leader:
            leader = self._leaders.get(group.key)
            if leader is not None and leader.target == name:
                del self._leaders[group.key]
        else:
            self._workers.pop(name, None)
        await self._sync_group(group)

    async def _sync_group(self, group: PodGroup) -> None:
        """One engine spanning pods as this exporter sees it now: a target named after its leader where the leader
        is on one of its nodes or one of its workers is (whose GPUs, log and restarts count for it), else none."""
        key = group.key
        leader = self._leaders.get(key)
        workers = {n: w for n, w in self._workers.items() if w.group is not None and w.group.key == key}
        old = self._group_target.get(key)
        own = leader is not None and self._owns_node(leader.node)
        if leader is None or not (own or workers):
            if old is not None and old in self.known:
                await self._remove(old)
            self._group_target.pop(key, None)
            if leader is not None and leader.target not in self._seen:
                del self._leaders[key]  # asked of the API for workers that have gone: asked again for new ones
            if leader is None and workers:
                self._find_leader(group)
            return
        if not own and not self.cluster:
            self._find_leader(group)  # kept up to date while its workers run here
        if old is not None and old != leader.target and old in self.known:
            await self._remove(old)  # a new leader under another name
        self._group_target[key] = leader.target
        self._said_no_leader.discard(key)
        await self._upsert(leader, own=own, workers=workers)

    def _find_leader(self, group: PodGroup) -> None:
        """The node mode watches its node's pods: a leader on another node is asked of the API, and asked again each
        resync while workers of its group run here (its address changes when it is replaced)."""
        if group.key not in self._said_no_leader and group.key not in self._leaders:
            self._said_no_leader.add(group.key)
            log.info("kubernetes: %s group %s: its workers here wait for their leader pod", group.layout, group.key)
        if self.cluster or self._client is None or group.key in self._finding:
            return  # the cluster mode lists every engine pod: the leader comes with them (or is not one)
        self._finding[group.key] = asyncio.ensure_future(self._follow_leader(group))

    def _has_workers(self, key: str) -> bool:
        return any(w.group is not None and w.group.key == key for w in self._workers.values())

    async def _follow_leader(self, group: PodGroup) -> None:
        assert self._client is not None
        path, params = group.leader_query()
        try:
            while self._has_workers(group.key):
                try:
                    found = await self._client.list(path, params)
                except ApiError as exc:
                    log.warning("kubernetes: cannot read the leader of %s group %s: %s", group.layout, group.key, exc)
                else:
                    items = [o for o in found.get("items") or [] if isinstance(o, dict)]
                    pods = [p for o in items if (p := pod_target(o, self.k8s.port, self.k8s.engine)) is not None]
                    leader = next((p for p in pods if p.group is not None and p.group.key == group.key
                                   and p.group.leader), None)  # fmt: skip
                    if leader != self._leaders.get(group.key) and leader is not None:
                        self._leaders[group.key] = leader
                        await self._sync_group(group)
                    elif leader is None and self._leaders.pop(group.key, None) is not None:
                        await self._sync_group(group)
                await asyncio.sleep(self.k8s.resync_seconds)
        finally:
            self._finding.pop(group.key, None)

    async def _upsert(self, pod: PodTarget, *, own: bool = True, workers: dict[str, PodTarget] | None = None) -> None:
        """The target of `pod` (an engine of its own, or a group's leader) as it is now. `own`: the pod runs on a node
        this exporter reads (else only its workers here are: its own events and restarts are another's)."""
        # Every change is made before the first await: a resync's timeout may cancel this there, and the thread
        # it awaits runs to its end regardless.
        known = self.known.get(pod.target)
        config = TargetConfig(url=pod.url, name=pod.target, engine=self.k8s.engine, local_process="no")
        was_own = known is not None and pod.target not in self._elsewhere
        follow = False
        if known is None:
            self.targets.add(config)
            follow = own
            log.info("kubernetes: target %s at %s (container %s)%s", pod.target, pod.url, pod.container,
                     "" if own else ": its workers here, its leader on another node")  # fmt: skip
        elif known.uid != pod.uid or known.url != pod.url:
            # The pod replaced under its name (a StatefulSet's): its new address, its new log folder.
            self.targets.retarget(pod.target, config)
            follow = own and (known.uid != pod.uid or not was_own)
            log.info("kubernetes: target %s now at %s", pod.target, pod.url)
        elif own and pod.restart_count > known.restart_count:
            self.targets.new_life(pod.target)  # a new container: loading until it answers, not down
        if own and (known is None or not was_own):
            self.pod_events.add(
                pod.target, namespace=pod.namespace, name=pod.name, uid=pod.uid, container=pod.container,
                ended=pod.last_termination, watched=self._resumes(pod, pod.target)[0],
            )  # fmt: skip
        elif not own and was_own:
            self.pod_events.remove(pod.target)
        (self._elsewhere.discard if own else self._elsewhere.add)(pod.target)
        self.known[pod.target] = pod
        if own:
            self.pod_events.update(pod.target, uid=pod.uid, container=pod.container, ended=pod.last_termination)
        detached = self._attach(pod.target, workers or {})
        self._set_pod(pod.target)
        if not own and was_own:
            await asyncio.to_thread(self.pod_events.unfollow, pod.target)
        if follow and self.cluster:
            await self._follow_api(pod, config)
        elif follow:
            await asyncio.to_thread(self.pod_events.follow, pod.target, config, from_start=self._listed)
        await self._follow_workers(pod.target, config, detached)

    def _attach(self, target: str, workers: dict[str, PodTarget]) -> list[str]:
        """The workers that count for `target` now; the names of those detached from it (their sources to close)."""
        detached = [n for n, (t, w) in self._attached.items() if t == target and (n not in workers
                    or workers[n].uid != w.uid)]  # fmt: skip
        for name in detached:
            del self._attached[name]
            self._followed.discard(name)
            self.pod_events.remove(name)
            if (follower := self._log_followers.pop(name, None)) is not None:
                follower.cancel()
        for name, worker in workers.items():
            if name in self._attached:
                self.pod_events.update(name, uid=worker.uid, container=worker.container,
                                       ended=worker.last_termination)  # fmt: skip
                self._attached[name] = (target, worker)
                continue
            self.pod_events.add(
                name, namespace=worker.namespace, name=worker.name, uid=worker.uid, container=worker.container,
                ended=worker.last_termination, watched=self._resumes(worker, target)[0], target=target,
            )  # fmt: skip
            self._attached[name] = (target, worker)
        return detached

    def _workers_of(self, target: str) -> list[PodTarget]:
        return [w for t, w in self._attached.values() if t == target]

    def _set_pod(self, target: str) -> None:
        pod = self.known[target]
        workers = self._workers_of(target)
        ref = replace(pod.ref, members=tuple(w.ref for w in workers), leader_elsewhere=target in self._elsewhere)
        self.targets.set_pod(target, pod.uid, ref, tuple(w.uid for w in workers))

    async def _follow_workers(self, target: str, config: TargetConfig, detached: list[str]) -> None:
        for name in detached:
            await asyncio.to_thread(self.pod_events.unfollow, name, target)
        for name, (owner, worker) in list(self._attached.items()):
            if owner != target or name in self._followed:
                continue
            self._followed.add(name)
            if self.cluster:
                await self._follow_api(worker, config)
            else:
                await asyncio.to_thread(self.pod_events.follow, name, config, from_start=self._listed)

    async def _follow_api(self, pod: PodTarget, config: TargetConfig) -> None:
        """The cluster mode: a container's log through the API, one stream per container (the engine's, or a
        worker's, counted for `config`'s target)."""
        name = pod.target
        if (old := self._log_followers.pop(name, None)) is not None:
            old.cancel()
        whole = self._resumes(pod, config.label)[1]
        reader = await asyncio.to_thread(self.pod_events.follow_api, name, config, from_start=whole)
        now = self.known.get(name) if not pod.worker else self._attached.get(name, ("", None))[1]
        if reader is None or self._client is None or now is None or now.uid != pod.uid:
            return  # removed or replaced while this waited for its thread (its replacement follows its own log)
        decision = self._taken.get(pod.node)
        if decision is not None and decision.kind == "lost":
            reader.error(f"its node {pod.node} was held by {decision.holder}, gone without letting it go: read as if "
                         "no position was saved (OOMs it logged meanwhile may be lost, or counted again)")  # fmt: skip
        follower = PodLogFollower(
            self._client, reader, namespace=pod.namespace, pod=pod.name, container=pod.container,
            retry_max_seconds=self.k8s.retry_max_seconds,
        )  # fmt: skip
        self._log_followers[name] = asyncio.ensure_future(follower.run())

    async def _remove(self, name: str) -> None:
        self.known.pop(name)
        self._elsewhere.discard(name)
        self.targets.remove(name)
        self.pod_events.remove(name)
        if (follower := self._log_followers.pop(name, None)) is not None:
            follower.cancel()
        detached = self._attach(name, {})
        await asyncio.to_thread(self.pod_events.unfollow, name)
        for worker in detached:
            await asyncio.to_thread(self.pod_events.unfollow, worker, name)
        log.info("kubernetes: target %s gone", name)

    # -- a sharded cluster mode's hand-over of the nodes that change shard (handover.py) -------------------------
    def _sharded(self) -> bool:
        pod = os.environ.get("POD_NAME", "")
        statefulset = record_key(pod, 0) == pod
        return self.cluster and bool(self.k8s.handover) and (self.shard.count > 1 or statefulset)

    async def _start_handover(self, client: ApiClient) -> None:
        """The records read before the first list, so that no node is read before it is known whose it is; a
        ConfigMap that cannot be read (missing, no RBAC) is said, and the nodes read as if there were none."""
        key = record_key(os.environ.get("POD_NAME", ""), self.shard.index)
        handover = self._handover = Handover(
            client, namespace=client.connection.namespace, name=self.k8s.handover, key=key, shard=self.shard
        )
        retry = 0.5
        while True:
            started = time.perf_counter()
            try:
                await handover.load()
            except ApiError as exc:
                self.source_runs.record(HANDOVER, False, time.perf_counter() - started)
                if exc.status in (401, 403, 404):
                    log.error("kubernetes: %s: %s: a node that changes shard is read from now, its OOMs meanwhile "
                              "lost; give the service account get and patch on it (deploy/kubernetes-sharded)",
                              handover.where, exc)  # fmt: skip
                    break
                log.warning("kubernetes: %s: %s (tried again in %.1fs)", handover.where, exc, retry)
                await asyncio.sleep(retry)
                retry = min(retry * 2, self.k8s.retry_max_seconds)
                continue
            self.source_runs.record(HANDOVER, True, time.perf_counter() - started)
            self._releasing = {node: {} for node in handover.previously_held()}
            break
        self._handover_tasks.append(asyncio.ensure_future(self._follow_handover()))

    def _node_taken(self, node: str) -> bool:
        """Whether this exporter reads `node` now (one of its shard's): taken at once unless a shard of another
        shard count holds it, then once it lets it go (_follow_handover)."""
        if self._handover is None or not self._handover.usable or node in self._taken:
            return True
        if node in self._waiting:
            return False
        decision = self._handover.decide(node)
        if decision.kind == "wait":
            self._waiting[node] = {}
            self._handover_wake.set()
            log.info("kubernetes: node %s is read by %s (another shard count) until it lets it go", node,
                     decision.holder)  # fmt: skip
            return False
        self._take(node, decision)
        return True

    def _take(self, node: str, decision: Decision) -> None:
        assert self._handover is not None
        if decision.kind == "take" and decision.holder != self._handover.key:
            log.info("kubernetes: node %s taken over from %s, at the last line it read of each pod", node,
                     decision.holder)  # fmt: skip
        elif decision.kind == "lost":
            log.warning("kubernetes: node %s was held by %s, which did not let it go in time: its pods are read as if "
                        "no position was saved", node, decision.holder)  # fmt: skip
        self._taken[node] = decision
        self._handover.hold(node, decision.seq)
        self._handover_wake.set()  # written soon: a shard that reshards next sees who holds it

    def _resumes(self, pod: PodTarget, target: str) -> tuple[bool, bool]:
        """How a pod's sources start: (watched: its container's end not a baseline, whole: its log from its start).
        A pod of a node handed over resumes from the release's states, seeded here once; one the release does not
        name came after the releaser let go: its end and its log are all new."""
        decision = self._taken.get(pod.node)
        if decision is None or decision.kind != "take":
            return self._listed, self._listed
        if pod.uid not in self._handed:
            states = decision.pods.get(pod.uid)
            if states is None:
                self._handed[pod.uid] = (True, True)
            else:
                self.pod_events.seed(target, pod.target, states)
                self._handed[pod.uid] = (True, False)
        return self._handed[pod.uid]

    def _pod_states(self, node: str) -> dict[str, dict[str, Any]]:
        """Pod UID -> its sources' states, of the pods of `node` this exporter follows (at its stop)."""
        out = {pod.uid: self.pod_events.states(target) for target, pod in self.known.items()
               if pod.node == node and target not in self._elsewhere}  # fmt: skip
        out |= {w.uid: self.pod_events.states(name) for name, (_, w) in self._attached.items() if w.node == node}
        return out

    def _note_released_pod(self, obj: Obj) -> None:
        """A pod of a node held at the last run and no more: its saved states, to let go."""
        pod = pod_target(obj, self.k8s.port, self.k8s.engine)
        if pod is None or pod.node not in self._releasing:
            return
        states = self.pod_events.saved_states(pod.namespace, pod.name, pod.uid, pod.container)
        if states is not None:
            self._releasing[pod.node][pod.uid] = states

    async def _follow_handover(self) -> None:
        """The records read again: the nodes waited for taken once let go (their pods as last seen processed), this
        exporter's releases that were taken since dropped."""
        assert self._handover is not None
        handover = self._handover
        while handover.usable:
            if self._waiting:
                await asyncio.sleep(min(self.k8s.retry_max_seconds, 2.0))
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._handover_wake.wait(), REFRESH_SECONDS)
            self._handover_wake.clear()
            started = time.perf_counter()
            try:
                await handover.load()
            except ApiError as exc:
                self.source_runs.record(HANDOVER, False, time.perf_counter() - started)
                log.warning("kubernetes: %s: %s", handover.where, exc)
                continue
            self.source_runs.record(HANDOVER, True, time.perf_counter() - started)
            for node in list(self._waiting):
                decision = handover.decide(node)
                if decision.kind == "wait":
                    continue
                stash = self._waiting.pop(node)
                self._take(node, decision)
                for obj in stash.values():
                    await self._pod_changed(obj)
                for group in {p.group for p in self._leaders.values() if p.node == node and p.group is not None}:
                    await self._sync_group(group)
            handover.drop_superseded()
            await self._write_handover()

    async def _write_handover(self) -> None:
        if self._handover is None or not self._handover.usable:
            return
        started = time.perf_counter()
        try:
            await self._handover.write()
        except ApiError as exc:
            self.source_runs.record(HANDOVER, False, time.perf_counter() - started)
            log.error("kubernetes: %s: cannot write this exporter's record (%s): the shard that reads its nodes next "
                      "cannot go on from its positions", self._handover.where, exc)  # fmt: skip
        else:
            self.source_runs.record(HANDOVER, True, time.perf_counter() - started)

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
        self, nvml: GpuReadings | None, targets: tuple[TargetReading, ...]
    ) -> tuple[TargetReading, ...]:
        """The discovered targets with their pod (its labels and probes, the kubelet's restart count), its processes
        on the GPUs (which GPUs, their own memory) and its engine container's settings (its command line: the
        reservation it was told, while it reports none). Never raises: a failed /proc read is the `pod_processes`
        source's failure, and the readings go on without the processes."""
        # timed, never raising; the cluster mode reads no /proc: no such source
        trees = {} if self.cluster else await self.source_runs.run(PROCESSES, self.pod_processes(nvml)) or {}
        out = []
        for t in targets:
            pod = self.known.get(t.name)
            if pod is None:
                out.append(t)
                continue
            # The kubelet's restart count: it sees every life, even one killed before its first line. An engine
            # spanning pods: its leader's (where this exporter reads the leader's node) and its workers' here.
            workers = self._workers_of(t.name)
            pods = [*([] if t.name in self._elsewhere else [pod]), *workers]
            ends = [e.finished_at for p in pods if (e := p.last_termination) is not None and e.finished_at]
            last_restart_at = max(ends) if ends else t.last_restart_at
            ref = replace(pod.ref, members=tuple(w.ref for w in workers), leader_elsewhere=t.name in self._elsewhere)
            restarts = sum(p.restart_count for p in pods)
            t = replace(t, pod=ref, restarts_total=restarts, last_restart_at=last_restart_at)
            if t.name in trees and t.process is None:
                t = replace(t, process=trees[t.name])
            if pod.settings and not t.settings:
                t = replace(t, settings=pod.settings)
            out.append(t)
        if self.cluster and nvml is not None:
            self._unmapped.say(nvml, [self.known[t.name] for t in out if t.name in self.known])
        return tuple(out)

    async def pod_processes(self, nvml: GpuReadings | None) -> dict[str, ProcessTree]:
        """Target name -> its pod's processes in NVML's lists (for the collection and the trend sampler)."""
        pods = {pod.uid: name for name, pod in self.known.items() if name not in self._elsewhere}
        pods.update({worker.uid: target for target, worker in self._attached.values()})
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

    def say(self, gpus: GpuReadings, pods: list[PodTarget]) -> None:
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
