"""Which exporter reads which node, when the cluster mode is split over a StatefulSet (`kubernetes.shards`).

A node belongs to one shard: its name's hash modulo the shard count, so that a node's engine pods, its
dcgm-exporter and its kubelet's Events are all read by the same exporter (a pod is judged on its node's GPUs).
The hash is BLAKE2b's first 8 bytes: the same in every process and version (Python's `hash()` is salted per
process), and spread evenly whatever the node names look like (`gpu-node-001`..`-500` differ in a few digits).
A node's shard changes only when the shard count does.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


def shard_of(node: str, shards: int) -> int:
    digest = hashlib.blake2b(node.encode("utf-8", errors="replace"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


@dataclass(frozen=True, slots=True)
class Shard:
    index: int = 0
    count: int = 1

    def owns(self, node: str) -> bool:
        """Whether this shard reads `node`; every node when unsharded, none without a name (an unscheduled pod)."""
        if self.count == 1:
            return True
        return bool(node) and shard_of(node, self.count) == self.index
