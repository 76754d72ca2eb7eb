"""Which pods the cluster mode takes as a node's dcgm-exporter: one per node, and only the GPU Operator's.

A node's GPU memory is what its dcgm-exporter says, so a pod that poses as one decides that node's pages: it can
hide real pressure (GPUs at 2 % where they are at 98 %) or fake it. Any tenant can create a pod with the label
`app=nvidia-dcgm-exporter`. So a pod is taken only when a DaemonSet of a configured name controls it (its
controller `ownerReference`; `dcgm.daemonsets`, the GPU Operator's `nvidia-dcgm-exporter` by default), on top of
the namespaces the watch is given (`dcgm.namespaces`: the shipped manifests name the GPU Operator's). And a node
claimed by two pods is read from neither: which of them is the real one cannot be told from here, and one node's
GPUs merged from two bodies, or taken from whichever was listed last, is a figure nobody can trust. Each refusal is
said once, at WARNING, and counted by node, pod and reason (`oomguard_dcgm_pods_refused_total`), which the
`OomGuardDcgmPodRefused` alert watches.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from oomguard.exporter.sources.dcgm import DcgmEndpoint

log = logging.getLogger(__name__)
OWNER, CONFLICT = "owner", "conflict"  # the reasons a pod is refused
MAX_REFUSED = 256  # refused pods counted by name; beyond, under pod "" (a tenant who makes pods makes series)
Key = tuple[str, str]  # (namespace, name) of a pod


def controller(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the pod's controller (its ownerReference with `controller: true`), or None."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, dict) and ref.get("controller") is True:
            return str(ref.get("kind", "")), str(ref.get("name", ""))
    return None


class TrustedDcgm:
    def __init__(self, daemonsets: tuple[str, ...]) -> None:
        self.daemonsets = daemonsets
        self.refusals: dict[tuple[str, str, str, str], int] = {}  # (node, namespace, pod, reason) -> times
        self._refused: dict[Key, str] = {}  # the pods refused now, and why: counted once while they stay so

    def owned(self, obj: Mapping[str, Any], key: Key, node: str) -> bool:
        """Whether a DaemonSet of a configured name controls the pod; a refusal is said and counted once."""
        owner = controller(obj)
        if not self.daemonsets or (owner is not None and owner[0] == "DaemonSet" and owner[1] in self.daemonsets):
            if self._refused.get(key) == OWNER:
                del self._refused[key]
            return True
        what = "no controller" if owner is None else f"controlled by {owner[0]} {owner[1][:80]!r}"
        self._refuse(key, node, OWNER, "%s, not by a DaemonSet named %s (dcgm.daemonsets)", what,
                     " or ".join(self.daemonsets))  # fmt: skip
        return False

    def forget(self, key: Key) -> None:
        """The pod is gone: refused again, it is counted again."""
        self._refused.pop(key, None)

    def endpoints(self, taken: Mapping[Key, DcgmEndpoint]) -> list[DcgmEndpoint]:
        """The endpoints of the nodes one pod claims; those of a node two or more claim are refused, all of them."""
        claims: dict[str, list[Key]] = {}
        for key, endpoint in taken.items():
            claims.setdefault(endpoint.node, []).append(key)
        out = []
        for node, keys in claims.items():
            if len(keys) == 1:
                if self._refused.get(keys[0]) == CONFLICT:
                    del self._refused[keys[0]]
                out.append(taken[keys[0]])
                continue
            others = ", ".join(f"{ns}/{name}" for ns, name in sorted(keys))
            for key in keys:
                self._refuse(key, node, CONFLICT, "node %s is claimed by %d pods (%s): its GPUs are read from none of "
                             "them until one is gone", node, len(keys), others)  # fmt: skip
        return out

    def _refuse(self, key: Key, node: str, reason: str, why: str, *args: object) -> None:
        if self._refused.get(key) == reason:
            return
        self._refused[key] = reason
        named = (node, *key) if len({k[:3] for k in self.refusals}) < MAX_REFUSED else (node, "", "")
        self.refusals[(*named, reason)] = self.refusals.get((*named, reason), 0) + 1
        log.warning("kubernetes: pod %s/%s refused as the dcgm-exporter of node %s: " + why, *key, node, *args)


__all__ = ["CONFLICT", "OWNER", "TrustedDcgm", "controller"]
