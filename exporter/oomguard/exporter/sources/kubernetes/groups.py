"""Engines that span pods: which group a pod is in, and whether it is the group's leader.

A model too large for one node is served by one engine over several pods: a leader that serves HTTP and /metrics,
and workers on other nodes that hold GPU memory and serve nothing. The workers are no targets; their GPUs, logs and
restarts count for their leader's target (discovery.py). Two layouts are read, by the labels their controllers set:

- LeaderWorkerSet (lws.sigs.k8s.io): every pod of a group carries `leaderworkerset.sigs.k8s.io/name`,
  `.../group-index` (and `.../group-key`); `.../worker-index` is 0 on the leader. A worker's annotation
  `.../leader-name` names its leader pod.
- KubeRay: every pod of a RayCluster carries `ray.io/cluster`; `ray.io/node-type` is `head` on the head pod, which
  runs the engine's server (vLLM's API server or Ray Serve), `worker` on the others.

A pod with neither set of labels is a group of its own, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LWS = "leaderworkerset.sigs.k8s.io/"
LWS_NAME, LWS_GROUP_INDEX, LWS_GROUP_KEY = LWS + "name", LWS + "group-index", LWS + "group-key"
LWS_WORKER_INDEX, LWS_LEADER_NAME = LWS + "worker-index", LWS + "leader-name"
RAY_CLUSTER, RAY_NODE_TYPE = "ray.io/cluster", "ray.io/node-type"


@dataclass(frozen=True, slots=True)
class PodGroup:
    """The engine group a pod is in: `key` the same on every pod of one group (and unique in the cluster)."""

    layout: str  # "leaderworkerset" or "ray"
    key: str
    leader: bool
    leader_name: str = ""  # the leader pod's name where the worker's object says it (LeaderWorkerSet)
    namespace: str = ""

    def leader_query(self) -> tuple[str, dict[str, str]]:
        """The API request that finds the leader pod of a worker's group: (path, params)."""
        base = f"/api/v1/namespaces/{self.namespace}/pods"
        if self.layout == "ray":
            cluster = self.key.rpartition("/")[2]
            return base, {"labelSelector": f"{RAY_CLUSTER}={cluster},{RAY_NODE_TYPE}=head"}
        if self.leader_name:
            return base, {"fieldSelector": f"metadata.name={self.leader_name}"}
        name, index = self.key.split("/")[2:4]
        return base, {"labelSelector": f"{LWS_NAME}={name},{LWS_GROUP_INDEX}={index},{LWS_WORKER_INDEX}=0"}


def group_of(pod: dict[str, Any]) -> PodGroup | None:
    """The group `pod` is in, by its labels; None for a pod that is an engine of its own."""
    meta = pod.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    namespace = str(meta.get("namespace") or "")
    if not isinstance(labels, dict) or not isinstance(annotations, dict):
        return None
    if name := labels.get(LWS_NAME):
        leader = str(labels.get(LWS_WORKER_INDEX, "0")) == "0"
        # A leader is named <lws>-<group index>, a worker <lws>-<group index>-<worker index>.
        index = labels.get(LWS_GROUP_INDEX) or (str(meta.get("name") or "").rpartition("-")[2] if leader else "")
        if not index:
            return None
        key = f"lws/{namespace}/{name}/{index}"
        return PodGroup("leaderworkerset", key, leader, str(annotations.get(LWS_LEADER_NAME) or ""), namespace)
    if cluster := labels.get(RAY_CLUSTER):
        return PodGroup("ray", f"ray/{namespace}/{cluster}", labels.get(RAY_NODE_TYPE) == "head", "", namespace)
    return None
