"""GPU memory from NVIDIA's dcgm-exporter, where NVML may not be read: the cluster mode (one exporter, every node's
dcgm-exporter found through the API) and a node agent without the driver's devices.

Each endpoint is a dcgm-exporter's /metrics on one node; its GPUs become `GpuReading`s of that node, in bytes, with
the pods dcgm-exporter names on each (its Kubernetes mapping), which is how a pod finds its GPUs here (join.py). What
dcgm-exporter does not publish is absent, never guessed: no per-process memory (so `processes` is None: the
figures that need it, the engines' own use and the use beyond their reservation, are absent, and
oomguard_gpu_process_query_success says 0), no driver version. An endpoint that fails leaves its node's GPUs out of
the reading, is logged, and makes the source's success 0 (`oomguard_source_success{source="dcgm"}`): the other
nodes are read as usual. Bodies are parsed off the event loop, all of a read's in one thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from oomguard.common.engine_client import BodyTooLarge, EngineClient, EngineHttpError, get
from oomguard.exporter.model import GpuReading, GpuReadings, MigInstance, gpu_order
from oomguard.exporter.sources.dcgm_body import DEFAULT_FIELDS, DcgmBody, DcgmBodyError, Fields, parse

log = logging.getLogger(__name__)
SOURCE = "dcgm"  # the `source` label of oomguard_source_success


@dataclass(frozen=True, slots=True)
class DcgmEndpoint:
    url: str  # dcgm-exporter's /metrics
    node: str  # the node it runs on: its GPUs'


@dataclass(frozen=True, slots=True)
class _Fetched:
    endpoint: DcgmEndpoint
    body: bytes = b""
    error: str = ""


class DcgmReader:
    """Reads every dcgm-exporter endpoint at once: a GPU source (sources/gpu_source.py), as NVML's reader is."""

    name = SOURCE

    def __init__(
        self,
        client: EngineClient,
        endpoints: Callable[[], Sequence[DcgmEndpoint]],
        *,
        timeout_seconds: float,
        max_body_bytes: int,
        fields: Fields = DEFAULT_FIELDS,
    ) -> None:
        """`endpoints`: the dcgm-exporters as they stand (configured, or discovered by sources/kubernetes/)."""
        self.client = client
        self.endpoints = endpoints
        self.timeout_seconds = timeout_seconds
        self.max_body_bytes = max_body_bytes
        self.fields = fields
        self._naming: dict[DcgmEndpoint, tuple[tuple[str, str, str], ...]] = {}  # the families each was read by
        self._failing: set[str] = set()  # endpoints whose failure was logged: logged again only once they recover
        # Each endpoint's last body, by its digest (what is held does not grow with the bodies), and its GPUs:
        # dcgm-exporter samples every 30 s by default, so most scrapes get the body of the last one again, which is
        # not parsed twice (100 nodes: 6 % of a scrape's CPU).
        self._parsed: dict[DcgmEndpoint, tuple[bytes, list[GpuReading]]] = {}
        # The GPUs each endpoint has listed: one it stops listing while it answers is lost (dcgm-exporter stops
        # writing a GPU it cannot read), and is read as NVML reads a lost GPU, down, rather than gone without a word.
        self._seen: dict[DcgmEndpoint, dict[str, GpuReading]] = {}
        self._said_mig: set[str] = set()  # nodes whose MIG instances were said to be skipped
        self._in_flight: asyncio.Future[GpuReadings] | None = None

    async def read(self) -> GpuReadings:
        """Every endpoint's GPUs; a scrape and a trend tick at once share one round of requests."""
        if self._in_flight is None:
            self._in_flight = asyncio.ensure_future(self._read())
            self._in_flight.add_done_callback(self._clear)
        return await asyncio.shield(self._in_flight)  # one caller cancelled does not cancel the others' read

    def close(self) -> None:
        """Nothing of its own to let go: its client is the runtime's, closed by it."""

    def _clear(self, _: asyncio.Future[GpuReadings]) -> None:
        self._in_flight = None

    async def _read(self) -> GpuReadings:
        endpoints = list(self.endpoints())
        if not endpoints:
            return GpuReadings(up=False, error="no dcgm-exporter found (see docs/kubernetes.md)")
        fetched = await asyncio.gather(*(self._fetch(e) for e in endpoints))
        return await asyncio.to_thread(self._reading, fetched)

    async def _fetch(self, endpoint: DcgmEndpoint) -> _Fetched:
        try:
            answer = await get(self.client, endpoint.url, timeout=self.timeout_seconds, cap=self.max_body_bytes)
        except TimeoutError:
            return _Fetched(endpoint, error=f"no answer within {self.timeout_seconds:g}s")
        except BodyTooLarge:
            return _Fetched(endpoint, error=f"body over {self.max_body_bytes} bytes (dcgm.max_body_bytes)")
        except (EngineHttpError, OSError) as exc:
            return _Fetched(endpoint, error=str(exc) or type(exc).__name__)
        if answer.status != 200:
            return _Fetched(endpoint, error=f"HTTP {answer.status}")
        return _Fetched(endpoint, answer.body)

    def _reading(self, fetched: list[_Fetched]) -> GpuReadings:
        """The bodies parsed and put together (blocking: runs in a thread)."""
        gpus: list[GpuReading] = []
        errors: list[str] = []
        parsed: dict[DcgmEndpoint, tuple[bytes, list[GpuReading]]] = {}
        for f in fetched:
            url, error = f.endpoint.url, f.error
            if not error:
                last = self._parsed.get(f.endpoint)
                digest = hashlib.blake2b(f.body, digest_size=16).digest()
                try:
                    if last is None or last[0] != digest:
                        body = parse(f.body.decode("utf-8", errors="replace"), fields=self.fields)
                        self._say_mig(f.endpoint, body)
                        self._say_naming(f.endpoint, body)
                        last = (digest, _gpus(body, f.endpoint.node))
                    parsed[f.endpoint] = last
                    gpus += last[1] + self._lost(f.endpoint, last[1])
                except DcgmBodyError as exc:
                    error = str(exc)
            if error:
                errors.append(f"{url} (node {f.endpoint.node or '?'}): {error}")
                if url not in self._failing:
                    log.warning("dcgm-exporter %s (node %s): %s", url, f.endpoint.node or "?", error)
                self._failing.add(url)
            elif url in self._failing:
                self._failing.discard(url)
                log.info("dcgm-exporter %s answers again", url)
        self._parsed = parsed  # the endpoints gone or failing are forgotten
        current = {f.endpoint for f in fetched}  # a failing endpoint keeps what it listed; one gone is forgotten
        self._seen = {endpoint: seen for endpoint, seen in self._seen.items() if endpoint in current}
        self._naming = {endpoint: fields for endpoint, fields in self._naming.items() if endpoint in current}
        families = tuple(
            (endpoint.node, *field) for endpoint in sorted(parsed, key=lambda e: e.node)
            for field in self._naming.get(endpoint, ())
        )  # fmt: skip
        gpus.sort(key=lambda g: gpu_order(g.key))
        # Up while any node answers: a failing one is the source's failure (its success 0), not every GPU's.
        return GpuReadings(up=len(errors) < len(fetched), gpus=tuple(gpus), error="; ".join(errors),
                           dcgm_families=families)  # fmt: skip

    def _say_mig(self, endpoint: DcgmEndpoint, body: DcgmBody) -> None:
        """A GPU in MIG mode is read as its instances, its own series beside them skipped: said once a node."""
        if body.mig_series_skipped and endpoint.node not in self._said_mig:
            self._said_mig.add(endpoint.node)
            log.info(
                "dcgm-exporter %s (node %s): GPUs in MIG mode read as their instances; %d series of the whole GPU "
                "beside them skipped", endpoint.url, endpoint.node or "?", body.mig_series_skipped,
            )  # fmt: skip

    def _say_naming(self, endpoint: DcgmEndpoint, body: DcgmBody) -> None:
        """Which families, in which unit, a node's dcgm-exporter is read by (4.8's MiB or 4.9's bytes: a fleet
        upgrading has both): said when first read and when it changes."""
        if self._naming.get(endpoint) != body.fields:
            self._naming[endpoint] = body.fields
            log.info(
                "dcgm-exporter %s (node %s): GPU memory from %s", endpoint.url, endpoint.node or "?",
                ", ".join(f"{name} ({unit})" for _, name, unit in body.fields),
            )  # fmt: skip

    def _lost(self, endpoint: DcgmEndpoint, listed: list[GpuReading]) -> list[GpuReading]:
        """The GPUs the endpoint listed before and not now, down; remembers what it lists."""
        seen = self._seen.setdefault(endpoint, {})
        seen.update((g.label, g) for g in listed)
        now = {g.label for g in listed}
        return [
            GpuReading(
                index=g.index,
                up=False,
                uuid=g.uuid,
                name=g.name,
                pci_bus_id=g.pci_bus_id,
                node=g.node,
                error="no longer in dcgm-exporter's body: lost, or taken off the node",
                mig=g.mig,
            )
            for label, g in sorted(seen.items(), key=lambda item: gpu_order(item[1].key))
            if label not in now
        ]


def _gpus(body: DcgmBody, node: str) -> list[GpuReading]:
    return [
        GpuReading(
            index=g.index,
            up=True,
            uuid=g.uuid,
            name=g.name,
            pci_bus_id=g.pci_bus_id,
            total_bytes=g.total_bytes,
            used_bytes=g.used_bytes,
            free_bytes=g.free_bytes,
            reserved_bytes=g.reserved_bytes,
            utilization_ratio=g.utilization_ratio,
            processes=None,  # not published by dcgm-exporter: absent, not "no processes"
            # A configured endpoint's GPUs are the exporter's own node's, as its configured targets are: its node,
            # not dcgm-exporter's hostname label (its own pod's name, unless it was given NODE_NAME).
            node=node,
            pods=tuple(sorted({(namespace, pod) for namespace, pod, _container in g.pods})),
            # dcgm-exporter's UUID label of an instance is its parent's; it names no compute instance.
            mig=MigInstance(g.uuid, g.gpu_instance, None, g.profile) if g.gpu_instance is not None else None,
        )
        for g in body.gpus
    ]
