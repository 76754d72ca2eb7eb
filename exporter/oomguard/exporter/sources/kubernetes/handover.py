"""A node moving between shards takes its log positions with it: the sharded cluster mode's hand-over.

Each shard keeps its counts and log positions on a volume of its own (the StatefulSet's claim), and a node belongs
to the shard its name hashes to (shards.py). Change the shard count and most nodes change shard: the new shard had
no position for their pods (it read them "from now", and what they logged during the roll was lost), and while the
StatefulSet rolls, a node can be read by its shard of the old count and of the new one at once (counted twice).
Nothing else the shards share outlives a shard that is gone (scaling down removes its pod; its volume stays
unmounted), so the positions go through the API: one ConfigMap (`kubernetes.handover`, shipped empty by
deploy/kubernetes-sharded, in the exporter's own namespace), where each exporter writes one key of its own (its pod
name), a record of the nodes it reads and of those it let go:

- a node it reads is `held`; a node it stops reading (its pod stopping, or restarted under another shard count) is
  `released` with the state of each of its pods' sources (log positions and open incidents, the last container
  end counted), by pod UID, after the last line it read;
- each hand-over of a node raises its `seq`: a node is taken from the record that has the highest seq for it, so
  a shard that read a node long ago does not go on from its own stale position;
- a shard takes a node only when no shard of another count holds it: until then the old shard reads it, and the
  new one waits (it neither reads the node's pods nor counts them). A holder whose ordinal is past the new count
  (a shard scaled away) that never released (it was killed) is waited for GRACE_SECONDS, any other for
  WAIT_MAX_SECONDS (a roll that stalls, a record it cannot write), then its pods are read as if no position
  existed, and each says so (a read error of its log);
- a pod of a released node that the release does not name was never read by the releaser: read from its start.

So a node is read by one shard at a time, and the next one goes on from the last line the previous one took:
nothing lost, nothing counted twice (tests/sources/kubernetes/test_reshard.py, 2 -> 3 -> 2 shards). Each writer
writes only its own key (a JSON merge patch of that key), so writers never conflict. A record is compressed JSON
(zlib, base64 in binaryData): a pod's states take about 500 bytes, 150 once compressed (its UIDs and container ID
do not compress), so the ConfigMap's 1 MiB holds the releases of about 7,000 pods at once; a write refused is
said and counted (oomguard_source_success{source="shard_handover"} 0). What is read is bounded
(what the API serves of a ConfigMap, at most 1 MiB, inflated to at most MAX_RECORD_BYTES) and checked before use,
as a state file is (events/runner.py's check_state): whoever may write the ConfigMap (the exporter's own namespace's
admins) could otherwise skip lines; that is the same trust as the state volume's.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from oomguard.exporter.sources.kubernetes.api import ApiClient
from oomguard.exporter.sources.kubernetes.shards import Shard

log = logging.getLogger(__name__)
SOURCE = "shard_handover"  # the `source` label of oomguard_source_success
GRACE_SECONDS = 120.0  # how long a holder scaled away is waited for (its pod's termination takes 30 s by default)
WAIT_MAX_SECONDS = 600.0  # how long any other holder is: a StatefulSet's roll replaces each shard in a minute or two
MAX_RECORD_BYTES = 16 * 1024 * 1024  # one record inflated: a shard of 10,000 pods takes about 5 MB
REFRESH_SECONDS = 30.0  # the records read again this often (superseded releases dropped), more often while waiting

PodStates = dict[str, dict[str, Any]]  # a pod's sources: source name -> its state (sections, as a state file has)


@dataclass
class Entry:
    """One node in a record: held (read now), or released with its pods' states by UID."""

    seq: int
    held: bool
    pods: dict[str, PodStates] = field(default_factory=dict)

    def json(self) -> dict[str, Any]:
        return {"seq": self.seq, "held": True} if self.held else {"seq": self.seq, "held": False, "pods": self.pods}


@dataclass
class Record:
    shards: int
    shard: int
    nodes: dict[str, Entry] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """How a node is taken: `wait` (another shard count's shard holds it), `take` (a release: `pods`), `own` (this
    exporter's own positions go on), `new` (no shard has held it), `lost` (its holder is gone without a release)."""

    kind: str
    seq: int = 0
    pods: dict[str, PodStates] = field(default_factory=dict)
    holder: str = ""  # whose release or hold it follows


def record_key(pod_name: str, shard: int) -> str:
    """The exporter's key: its pod's name in a StatefulSet (`oomguard-2`, `oomguard-a-2`), else `shard-<n>`."""
    return pod_name if re.search(r"-\d+$", pod_name) else f"shard-{shard}"


def group_of(key: str) -> str:
    """The StatefulSet a key belongs to (`oomguard-a-2` -> `oomguard-a`): hand-overs stay within one (the two
    replicas of a shard pair each read every node)."""
    return re.sub(r"-\d+$", "", key)


def encode(record: Record) -> str:
    nodes = {n: e.json() for n, e in sorted(record.nodes.items())}
    text = json.dumps({"shards": record.shards, "shard": record.shard, "nodes": nodes}, separators=(",", ":"))
    return base64.b64encode(zlib.compress(text.encode(), 6)).decode()


def decode(text: Any) -> Record:
    """A record as written by encode(), checked; ValueError naming what is wrong."""
    if not isinstance(text, str):
        raise ValueError("not a string")
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(base64.b64decode(text, validate=True), MAX_RECORD_BYTES)
        if inflater.unconsumed_tail:
            raise ValueError(f"more than {MAX_RECORD_BYTES} bytes inflated")
        data = json.loads(raw)
    except (binascii.Error, zlib.error, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"not a record: {type(exc).__name__}") from None
    if not isinstance(data, dict):
        raise ValueError("not a record")
    shards, shard, nodes = data.get("shards"), data.get("shard"), data.get("nodes")
    if type(shards) is not int or shards < 1 or type(shard) is not int or shard < 0 or not isinstance(nodes, dict):
        raise ValueError("no shards, shard and nodes")
    out = Record(shards, shard)
    for node, entry in nodes.items():
        if not isinstance(entry, dict) or type(entry.get("seq")) is not int or entry["seq"] < 0:
            raise ValueError(f"node {str(node)[:80]!r}: no seq")
        pods = entry.get("pods", {})
        if not isinstance(pods, dict) or not all(
            isinstance(states, dict) and all(isinstance(s, dict) for s in states.values()) for states in pods.values()
        ):
            raise ValueError(f"node {str(node)[:80]!r}: pods of a wrong shape")
        out.nodes[str(node)] = Entry(entry["seq"], entry.get("held") is True, {str(u): s for u, s in pods.items()})
    return out


class Handover:
    """The records of this exporter's StatefulSet in the hand-over ConfigMap, and its own."""

    def __init__(self, client: ApiClient, *, namespace: str, name: str, key: str, shard: Shard) -> None:
        self.client = client
        self.path = f"/api/v1/namespaces/{namespace}/configmaps/{name}"
        self.where = f"ConfigMap {namespace}/{name}"
        self.key = key
        self.group = group_of(key)
        self.shard = shard
        self.records: dict[str, Record] = {}  # the group's, as last read (this exporter's own as it was at start)
        self.mine = Record(shard.count, shard.index)  # as this exporter writes it
        self.usable = False  # the ConfigMap was read: waits and hand-overs apply
        self._written = ""
        self._blocking_since: dict[str, float] = {}  # a holder past the shard count -> first seen holding (monotonic)
        self._said: set[str] = set()

    # -- reading ---------------------------------------------------------------------------------------------
    async def load(self) -> None:
        """Read the records (ApiError when the ConfigMap cannot be read); the first read takes this exporter's
        own record of its last run as where it stands."""
        found = await self.client.list(self.path, {})
        records: dict[str, Record] = {}
        for key, text in ((found.get("binaryData") or {}) if isinstance(found, dict) else {}).items():
            if group_of(key) != self.group:
                continue
            try:
                records[key] = decode(text)
            except ValueError as exc:
                self._once(f"bad {key}", "kubernetes: %s: the record %r is refused (%s): its nodes are taken as if it "
                           "had none", self.where, key, exc)  # fmt: skip
        if not self.usable:
            previous = records.get(self.key)
            if previous is not None:
                self.mine.nodes = dict(previous.nodes)  # held and released as the last run left them
            self.usable = True
        self.records = records

    def previously_held(self) -> list[str]:
        """The nodes this exporter held when it last ran and does not read now (another shard count): to release."""
        return [n for n, e in self.mine.nodes.items() if e.held and not self.shard.owns(n)]

    def decide(self, node: str) -> Decision:
        """How this exporter takes `node`, one of its shard's (Decision)."""
        now = time.monotonic()
        entries = [(k, r, r.nodes[node]) for k, r in self.records.items() if k != self.key and node in r.nodes]
        blockers = []
        for key, record, entry in entries:
            if not entry.held or record.shards == self.shard.count:
                continue  # released, or a stale hold of this shard count (it would not hold another shard's node)
            # A shard scaled away releases as it stops, unless it was killed: waited for GRACE_SECONDS; another, as it
            # restarts under the new count, unless its roll stalls or its record cannot be written: WAIT_MAX_SECONDS.
            limit = GRACE_SECONDS if record.shard >= self.shard.count else WAIT_MAX_SECONDS
            if now - self._blocking_since.setdefault(key, now) > limit:
                continue
            blockers.append(key)
        if blockers:
            return Decision("wait", holder=", ".join(sorted(blockers)))
        # The newest word on the node: the highest seq; at the same seq a hold is newer than the release it took.
        mine = self.mine.nodes.get(node)
        latest = max(((e.seq, e.held, k, e) for k, _, e in entries), default=None, key=lambda t: t[:2])
        if mine is not None and (latest is None or (mine.seq, mine.held) >= latest[:2]):
            if mine.held:
                return Decision("own", mine.seq)
            return Decision("take", mine.seq, mine.pods, self.key)
        if latest is None:
            return Decision("new")
        seq, held, key, entry = latest
        if not held:
            return Decision("take", seq, entry.pods, key)
        return Decision("lost", seq + 1, holder=key)

    # -- writing ---------------------------------------------------------------------------------------------
    def hold(self, node: str, seq: int) -> None:
        self.mine.nodes[node] = Entry(seq, True)

    def release(self, node: str, pods: dict[str, PodStates]) -> None:
        held = self.mine.nodes.get(node)
        self.mine.nodes[node] = Entry((held.seq if held is not None else 0) + 1, False, pods)

    def drop_superseded(self) -> None:
        """Released nodes that another shard has taken since (or released again): no longer needed."""
        for node, entry in list(self.mine.nodes.items()):
            if entry.held:
                continue
            if any(node in r.nodes and r.nodes[node].seq >= entry.seq and (r.nodes[node].held or
                   r.nodes[node].seq > entry.seq) for k, r in self.records.items() if k != self.key):  # fmt: skip
                del self.mine.nodes[node]

    async def write(self) -> None:
        """This exporter's record, if it changed (ApiError when the API refuses it)."""
        self.mine.shards, self.mine.shard = self.shard.count, self.shard.index
        text = encode(self.mine)
        if text == self._written:
            return
        await self.client.patch(self.path, {"binaryData": {self.key: text}})
        self._written = text

    def _once(self, key: str, message: str, *args: object) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning(message, *args)


__all__ = [
    "GRACE_SECONDS",
    "SOURCE",
    "WAIT_MAX_SECONDS",
    "Decision",
    "Entry",
    "Handover",
    "Record",
    "decode",
    "encode",
    "record_key",
]
