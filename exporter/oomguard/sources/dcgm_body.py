"""NVIDIA dcgm-exporter's /metrics body (port 9400) read into each GPU's memory, from NVIDIA/dcgm-exporter's source.

Per GPU, known by its `gpu` label (the index): DCGM_FI_DEV_FB_USED, _FB_FREE and _FB_RESERVED, framebuffer memory in
MiB (the help texts of etc/default-counters.csv and docs/metrics.md; DCGM's dcgm_fields.h says "MB" for the same
fields), turned into bytes; DCGM_FI_DEV_FB_TOTAL, same unit, is a DCGM field but in none of the shipped CSVs; and
DCGM_FI_DEV_GPU_UTIL, a percent, as a ratio. FB_RESERVED is in the default CSV of recent versions only. No version
renames these fields or changes their unit (2.x to main, MiB throughout; the opt-in etc/1.x-compatibility-metrics.csv
names them dcgm_fb_used, ...: not read, such a body is refused). Since PR #655 the hostname label is
`hostname`, `Hostname` before; with --use-old-namespace the UUID label is `uuid`. Not published: what each process
holds. The one split, FB_USED and GPU_UTIL per pod with --kubernetes-virtual-gpus (recent versions, series with a
`pod_uid` label), sums each pod's processes, beside the GPU's own series without pod labels: that one is the GPU's.
Any other family written once per pod (a GPU shared by pods) has one value for all of them.

Pods: `pod`, `namespace`, `container` (`pod_name`, ... with --use-old-namespace) on the series of a GPU in use; 3.x
versions write them empty on a GPU in no pod. Scraped through Prometheus (honor_labels false) the exporter's labels
become `exported_pod`, ... and the bare ones name the scrape target, the exporter's own pod: in a body with any
`exported_pod` label, pods are read from `exported_*` only. MIG: series with a GPU_I_ID label are a GPU instance's,
its memory; skipped and counted (by default a GPU in MIG mode has instance series only, so it is not listed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from oomguard.promtext import ExpositionError, FamilyExtractor, LimitExceeded, Limits

MIB = 1048576
USED, FREE, RESERVED = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED"
TOTAL, UTIL = "DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_GPU_UTIL"
_EXTRACTOR = FamilyExtractor((USED, FREE, RESERVED, TOTAL, UTIL), Limits())
_EXPORTED_PODS = (("exported_namespace", "exported_pod", "exported_container"),)
_PODS = (("namespace", "pod", "container"), ("pod_namespace", "pod_name", "container_name"))


class DcgmBodyError(ValueError):
    """A body that is not dcgm-exporter's; the message names the problem and the fix."""


@dataclass(frozen=True, slots=True)
class DcgmGpu:
    index: int  # label `gpu`
    uuid: str  # label `UUID`
    name: str  # label `modelName`
    pci_bus_id: str  # "" when absent (older versions)
    hostname: str  # label `Hostname` or `hostname`; "" when absent (--no-hostname)
    used_bytes: float | None
    free_bytes: float | None
    reserved_bytes: float | None  # None when DCGM_FI_DEV_FB_RESERVED is not published
    total_bytes: float | None  # FB_TOTAL when published, else used + free + reserved (0 when absent)
    utilization_ratio: float | None
    pods: tuple[tuple[str, str, str], ...]  # sorted, unique (namespace, pod, container)


@dataclass(frozen=True, slots=True)
class DcgmBody:
    gpus: tuple[DcgmGpu, ...]  # sorted by index
    mig_series_skipped: int  # series of MIG instances (a non-empty GPU_I_ID label): per instance, not the GPU's


def parse(body: str, *, max_gpus: int = 64) -> DcgmBody:
    """The GPUs of a dcgm-exporter body; DcgmBodyError for any body not read, the extractor's refusals included (a
    malformed sample, a series written twice, a body over promtext's default limits, which no setting raises here)."""
    try:
        families = _EXTRACTOR.extract(body)
    except LimitExceeded as exc:  # its advice (raise an engine target's sample_limit) is not for this body
        raise DcgmBodyError(f"{exc.args[0].partition(': raise ')[0]}: is this one node's dcgm-exporter?") from exc
    except ExpositionError as exc:
        raise DcgmBodyError(f"not read as dcgm-exporter's /metrics: {exc}") from exc
    if not families.get(USED) and not families.get(FREE):
        raise DcgmBodyError(
            f"no {USED} or {FREE}: is this dcgm-exporter's /metrics (port 9400), and are the framebuffer fields "
            "in its counters CSV?"
        )
    exported = any("exported_pod" in s.labels for samples in families.values() for s in samples)
    schemes = _EXPORTED_PODS if exported else _PODS
    identity: dict[int, dict[str, str]] = {}
    pods: dict[int, set[tuple[str, str, str]]] = {}
    values: dict[tuple[str, int], list[tuple[bool, float]]] = {}  # (family, gpu) -> (series without pod?, value)
    skipped = 0
    for name, samples in families.items():
        for sample in samples:
            labels = sample.labels
            if labels.get("GPU_I_ID"):
                skipped += 1
                continue
            index = _index(name, labels.get("gpu", ""))
            if index not in identity:
                if len(identity) >= max_gpus:
                    raise DcgmBodyError(
                        f"more than {max_gpus} GPUs (values of the gpu label) in one body: is this one node's "
                        "dcgm-exporter? Raise max_gpus if a node has that many"
                    )
                identity[index] = labels
            pod = _pod(labels, schemes)
            if pod is not None:
                pods.setdefault(index, set()).add(pod)
            values.setdefault((name, index), []).append((pod is None, sample.value))
    gpus = []
    for index, labels in sorted(identity.items()):
        used, free, reserved, total = (_mib(_value(values, f, index)) for f in (USED, FREE, RESERVED, TOTAL))
        if total is None and used is not None and free is not None:
            total = used + free + (reserved or 0.0)
        util = _valid(_value(values, UTIL, index))
        gpus.append(
            DcgmGpu(
                index=index,
                uuid=labels.get("UUID") or labels.get("uuid", ""),
                name=labels.get("modelName", ""),
                pci_bus_id=labels.get("pci_bus_id", ""),
                hostname=labels.get("hostname") or labels.get("Hostname", ""),
                used_bytes=used,
                free_bytes=free,
                reserved_bytes=reserved,
                total_bytes=total,
                utilization_ratio=None if util is None else util / 100,
                pods=tuple(sorted(pods.get(index, ()))),
            )
        )
    return DcgmBody(gpus=tuple(gpus), mig_series_skipped=skipped)


def _index(name: str, text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise DcgmBodyError(
            f"{name} has gpu={text[:40]!r}: dcgm-exporter's gpu label is the GPU's index, a non-negative integer; "
            "is this dcgm-exporter's /metrics (port 9400)?"
        )
    return int(text)


def _pod(labels: dict[str, str], schemes: tuple[tuple[str, str, str], ...]) -> tuple[str, str, str] | None:
    for namespace, pod, container in schemes:
        if labels.get(pod):
            return labels.get(namespace, ""), labels[pod], labels.get(container, "")
    return None


def _value(values: dict[tuple[str, int], list[tuple[bool, float]]], name: str, index: int) -> float | None:
    """The GPU's series without pod labels where there is one (beside per-pod series), else the largest: the
    copies of a value written once per pod are equal."""
    found = values.get((name, index))
    return max(found)[1] if found else None


def _valid(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def _mib(value: float | None) -> float | None:
    return None if (valid := _valid(value)) is None else valid * MIB
