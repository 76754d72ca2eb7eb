"""Which pods the cluster mode takes as a node's dcgm-exporter: one per node, and only the GPU Operator's.

A node's GPU memory is what its dcgm-exporter says, so a pod that poses as one decides that node's pages: it can
hide real pressure (GPUs at 2 % where they are at 98 %) or fake it. Any tenant can create a pod with the label
`app=nvidia-dcgm-exporter`, and a DaemonSet of any name in its own namespace (or a pod with a hand-written
ownerReference naming one). So a pod is taken only when it runs in a namespace the exporter is told
(`dcgm.namespaces`: required, the GPU Operator's) and a DaemonSet of a configured name controls it (its controller
`ownerReference`, which names an owner of the pod's own namespace; `dcgm.daemonsets`, the GPU Operator's
`nvidia-dcgm-exporter` by default). The watch lists those namespaces only; the pod's namespace is checked here
again, whatever a listing returns. And a node claimed by two pods is read from neither: which of them is the real
one cannot be told from here, and one node's GPUs merged from two bodies, or taken from whichever was listed last,
is a figure nobody can trust. Such a node has no GPU figure at all, so its memory alerts cannot fire:
`oomguard_dcgm_node_pods{node}` (the pods taken for each node, 2 and more a conflict) is what a page reads. Each
refusal is said once, at WARNING, and counted by node, pod and reason (`oomguard_dcgm_pods_refused_total`).
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
    def __init__(self, daemonsets: tuple[str, ...], namespaces: tuple[str, ...]) -> None:
        """Nothing is trusted where either is empty (the configuration refuses that: config.py)."""
        self.daemonsets = daemonsets
        self.namespaces = namespaces
        self.refusals: dict[tuple[str, str, str, str], int] = {}  # (node, namespace, pod, reason) -> times
        self.claims: dict[str, int] = {}  # node -> the pods taken for it at the last round (2 and more: read from none)
        self._refused: dict[Key, str] = {}  # the pods refused now, and why: counted once while they stay so

    def owned(self, obj: Mapping[str, Any], key: Key, node: str) -> bool:
        """Whether the pod runs in a configured namespace under a DaemonSet of a configured name (an ownerReference
        names an owner in the pod's own namespace); a refusal is said and counted once."""
        owner = controller(obj)
        if key[0] not in self.namespaces:
            what = f"in namespace {key[0][:80]!r}, not one of {', '.join(self.namespaces)} (dcgm.namespaces)"
            self._refuse(key, node, OWNER, "%s", what)
            return False
        if owner is not None and owner[0] == "DaemonSet" and owner[1] in self.daemonsets:
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
        self.claims = {node: len(keys) for node, keys in claims.items()}
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
