"""NVIDIA dcgm-exporter's /metrics body (port 9400) read into each GPU's memory, from NVIDIA/dcgm-exporter's source.

Per GPU, known by its `gpu` label (the index): up to 4.8, DCGM_FI_DEV_FB_USED, _FB_FREE and _FB_RESERVED, framebuffer
memory in MiB (the help texts of etc/default-counters.csv and docs/metrics.md; DCGM's dcgm_fields.h says "MB" for the
same fields), turned into bytes; DCGM_FI_DEV_FB_TOTAL, same unit, is a DCGM field but in none of the shipped CSVs; and
DCGM_FI_DEV_GPU_UTIL, a percent, as a ratio. FB_RESERVED is in the default CSV of recent versions only. From 2.x to
4.8 these names keep their unit (the opt-in etc/1.x-compatibility-metrics.csv names them dcgm_fb_used, ...: not read,
such a body is refused); 4.9 renamed them (below). Since PR #655 the hostname label is
`hostname`, `Hostname` before; with --use-old-namespace the UUID label is `uuid`. Not published: what each process
holds. The one split, FB_USED and GPU_UTIL per pod with --kubernetes-virtual-gpus (recent versions, series with a
`pod_uid` label), sums each pod's processes, beside the GPU's own series without pod labels: that one is the GPU's.
Any other family written once per pod (a GPU shared by pods) has one value for all of them.

Pods: `pod`, `namespace`, `container` (`pod_name`, ... with --use-old-namespace) on the series of a GPU in use; 3.x
versions write them empty on a GPU in no pod. Scraped through Prometheus (honor_labels false) the exporter's labels
become `exported_pod`, ... and the bare ones name the scrape target, the exporter's own pod: in a body with any
`exported_pod` label, pods are read from `exported_*` only. MIG: series with a GPU_I_ID label are a GPU instance's
(GPU_I_PROFILE its profile, the pod labels the pods on it, `UUID` its parent's): each instance is a GPU of its own,
as the NVML source reads one; a GPU with instances is read as them alone (a series of its own beside them would be
the whole GPU's aggregate), and those series are counted as skipped.

dcgm-exporter 4.9 (DCGM 4.7) renamed its default fields to DCGM 4.7's names and writes GPU memory in bytes, and
collects DCGM_FI_DEV_FB_CAPACITY_BYTES, the total in bytes, by default (its release notes); its utilization is a
ratio. Which family holds each figure is `Fields` (the configuration's `dcgm.fields`), each list tried in order: by
default the byte names first (DCGM_FI_DEV_FB_USED_BYTES, _FREE_BYTES, _RESERVED_BYTES, CAPACITY_BYTES), then the 4.8
names in MiB, so a body that has both is read in bytes and a fleet half upgraded is read whole, each body in its own
unit (docs/kubernetes.md says which names were confirmed where). A name DCGM defines has its field's unit whatever
the counters CSV's help text says (the CSV is the user's; the value is DCGM's); a family only the user names gets its
unit from its `# HELP` text (MiB or MB, else bytes where it says so), else from its name (`_BYTES`: bytes; else MiB).
No figure, identity or check here reads the driver-version label (DCGM_FI_DRIVER_VERSION, DCGM_FI_SYSTEM_DRIVER_VERSION
from 4.9): it changes with every driver upgrade.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

from oomguard.common.promtext import ExpositionError, FamilyExtractor, LimitExceeded, Limits, Sample

MIB = 1048576
# A GPU's index as NVML and dcgm-exporter number them: a node has a few (MIG instances are no index of their own).
MAX_INDEX = 1023
# Framebuffer memory no GPU has (a petabyte): a value past it is the body's error, not a GPU's figure.
MAX_BYTES = 2.0**50
USED, FREE, RESERVED = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED"
TOTAL, UTIL = "DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_GPU_UTIL"
CAPACITY_BYTES = "DCGM_FI_DEV_FB_CAPACITY_BYTES"  # dcgm-exporter 4.9+, by default: the total, in bytes
USED_BYTES, FREE_BYTES = "DCGM_FI_DEV_FB_USED_BYTES", "DCGM_FI_DEV_FB_FREE_BYTES"
RESERVED_BYTES = "DCGM_FI_DEV_FB_RESERVED_BYTES"
UTIL_RATIO = "DCGM_FI_DEV_GPU_UTIL_RATIO"  # 4.9+: GPU_UTIL as a ratio, 0 to 1
BYTES, MIB_UNIT = "bytes", "MiB"
# The unit DCGM defines for each of its framebuffer fields: 250-253 in MiB ("MB" in dcgm_fields.h), 1625-1628 bytes.
FIELD_UNITS = {
    USED: MIB_UNIT, FREE: MIB_UNIT, RESERVED: MIB_UNIT, TOTAL: MIB_UNIT,
    USED_BYTES: BYTES, FREE_BYTES: BYTES, RESERVED_BYTES: BYTES, CAPACITY_BYTES: BYTES,
}  # fmt: skip
_FRAMEBUFFER_NAMES = re.compile(r"^(DCGM_FI_DEV_FB_\w+)", re.M)  # for the error that names what a body has


@dataclass(frozen=True, slots=True)
class Fields:
    """The families that hold each figure, each list tried in order (the configuration's `dcgm.fields`)."""

    used: tuple[str, ...] = (USED_BYTES, USED)
    free: tuple[str, ...] = (FREE_BYTES, FREE)
    reserved: tuple[str, ...] = (RESERVED_BYTES, RESERVED)
    total: tuple[str, ...] = (CAPACITY_BYTES, TOTAL)

    def roles(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        return (("used", self.used), ("free", self.free), ("reserved", self.reserved), ("total", self.total))


DEFAULT_FIELDS = Fields()
_EXPORTED_PODS = (("exported_namespace", "exported_pod", "exported_container"),)
_PODS = (("namespace", "pod", "container"), ("pod_namespace", "pod_name", "container_name"))


class DcgmBodyError(ValueError):
    """A body that is not dcgm-exporter's; the message names the problem and the fix."""


@dataclass(frozen=True, slots=True)
class DcgmGpu:
    index: int  # label `gpu`: a MIG instance's parent's
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
    gpu_instance: int | None = None  # label `GPU_I_ID`: a MIG GPU instance
    profile: str = ""  # label `GPU_I_PROFILE`


@dataclass(frozen=True, slots=True)
class DcgmBody:
    gpus: tuple[DcgmGpu, ...]  # sorted by index
    mig_series_skipped: int  # series of a GPU in MIG mode without an instance label: its aggregate, not read
    fields: tuple[tuple[str, str, str], ...] = ()  # (figure, family read, its unit): which naming the exporter uses


@functools.lru_cache(maxsize=8)
def _reader(fields: Fields) -> tuple[FamilyExtractor, re.Pattern[str]]:
    """The extractor of the fields' families, and a pattern of their `# HELP` lines (compiled once per Fields)."""
    names = sorted({name for _, role in fields.roles() for name in role} | {UTIL, UTIL_RATIO})
    helps = re.compile(r"^# HELP (" + "|".join(map(re.escape, names)) + r") ([^\n]*)$", re.M)
    return FamilyExtractor(names, Limits()), helps


def unit(name: str, help_text: str) -> str:
    """A framebuffer family's unit: its DCGM field's where DCGM defines the name; else its help text's
    (dcgm-exporter's CSVs say "(in MiB)"; DCGM's own texts "MB" for the same MiB), else its name's (`_BYTES`)."""
    if name in FIELD_UNITS:
        return FIELD_UNITS[name]
    if re.search(r"\bMi?B\b", help_text):
        return MIB_UNIT
    if re.search(r"\bbytes?\b", help_text, re.I) or name.endswith("_BYTES"):
        return BYTES
    return MIB_UNIT


Key = tuple[int, int]  # a GPU, or a MIG instance: (index, GPU instance id or -1 for the whole GPU)
Values = dict[tuple[str, Key], list[tuple[bool, float]]]  # (family, gpu) -> (without pod?, value)


def parse(body: str, *, max_gpus: int = 64, fields: Fields = DEFAULT_FIELDS) -> DcgmBody:
    """The GPUs of a dcgm-exporter body; DcgmBodyError for any body not read, the extractor's refusals included (a
    malformed sample, a series written twice, a body over promtext's default limits, which no setting raises here)."""
    extractor, help_lines = _reader(fields)
    families = _extract(extractor, body)
    # Each figure's family: the first of its names the body has.
    read = {role: next((n for n in names if families.get(n)), None) for role, names in fields.roles()}
    if read["used"] is None and read["free"] is None:
        raise DcgmBodyError(_no_memory(body, fields))
    helps = dict(m.groups() for m in help_lines.finditer(body))
    units = {role: unit(name, helps.get(name, "")) for role, name in read.items() if name is not None}
    exported = any("exported_pod" in s.labels for samples in families.values() for s in samples)
    identity, pods, values = _by_gpu(families, _EXPORTED_PODS if exported else _PODS, max_gpus)
    _one_gpu_each(identity)
    # A GPU with instances is read as them: a series of its own beside them is its aggregate.
    in_mig_mode = {index for index, instance in identity if instance >= 0}
    skipped = sum(len(v) for (_, (index, instance)), v in values.items() if instance < 0 and index in in_mig_mode)
    gpus = tuple(
        _gpu(key, labels, values, read, units, pods.get(key, set()))
        for key, labels in sorted(identity.items())
        if not (key[1] < 0 and key[0] in in_mig_mode)
    )
    fields_read = tuple((role, name, units[role]) for role, name in read.items() if name is not None)
    return DcgmBody(gpus=gpus, mig_series_skipped=skipped, fields=fields_read)


def _extract(extractor: FamilyExtractor, body: str) -> dict[str, list[Sample]]:
    """The body's families of the fields, the extractor's refusals as DcgmBodyError."""
    try:
        return extractor.extract(body)
    except LimitExceeded as exc:  # its advice (raise an engine target's sample_limit) is not for this body
        raise DcgmBodyError(f"{exc.args[0].partition(': raise ')[0]}: is this one node's dcgm-exporter?") from exc
    except ExpositionError as exc:
        raise DcgmBodyError(f"not read as dcgm-exporter's /metrics: {exc}") from exc


def _by_gpu(
    families: dict[str, list[Sample]], schemes: tuple[tuple[str, str, str], ...], max_gpus: int
) -> tuple[dict[Key, dict[str, str]], dict[Key, set[tuple[str, str, str]]], Values]:
    """Each GPU's (and MIG instance's) identity labels, its pods and its families' values; DcgmBodyError for more
    than `max_gpus` of them or a GPU listed as two."""
    identity: dict[Key, dict[str, str]] = {}
    pods: dict[Key, set[tuple[str, str, str]]] = {}
    values: Values = {}
    for name, samples in families.items():
        for sample in samples:
            labels = sample.labels
            key = (_index(name, labels.get("gpu", "")), _instance(name, labels.get("GPU_I_ID", "")))
            if key not in identity:
                if len(identity) >= max_gpus:
                    raise DcgmBodyError(
                        f"more than {max_gpus} GPUs and MIG instances (values of the gpu and GPU_I_ID labels) in one "
                        "body: is this one node's dcgm-exporter? Raise max_gpus if a node has that many"
                    )
                identity[key] = labels
            else:
                _same_gpu(key, identity[key], labels)
            pod = _pod(labels, schemes)
            if pod is not None:
                pods.setdefault(key, set()).add(pod)
            values.setdefault((name, key), []).append((pod is None, sample.value))
    return identity, pods, values


def _same_gpu(key: Key, first: dict[str, str], labels: dict[str, str]) -> None:
    """DcgmBodyError where a series of the same index names another GPU (its UUID or host)."""
    if _uuid(labels) != _uuid(first) or _host(labels) != _host(first):
        raise DcgmBodyError(
            f"gpu {key[0]} is listed as two GPUs ({_uuid(first)[:60]} on "
            f"{_host(first)[:60] or '?'}, {_uuid(labels)[:60]} on {_host(labels)[:60] or '?'}): a "
            "body lists each GPU once; is this one node's dcgm-exporter?"
        )


def _gpu(
    key: Key, labels: dict[str, str], values: Values, read: dict[str, str | None], units: dict[str, str],
    pods: set[tuple[str, str, str]],
) -> DcgmGpu:  # fmt: skip
    """One GPU's (or MIG instance's) figures in bytes and its utilization as a ratio."""
    used, free, reserved, total = (
        _bytes(_value(values, read[role], key), units.get(role, MIB_UNIT)) if read[role] else None
        for role in ("used", "free", "reserved", "total")
    )
    if total is None and used is not None and free is not None:
        total = used + free + (reserved or 0.0)
    if total is not None and total <= 0:
        total = None  # a GPU of no memory: its used ratio would be NaN, and no alert could judge it
    ratio, percent = _valid(_value(values, UTIL_RATIO, key)), _valid(_value(values, UTIL, key))
    util = ratio if ratio is not None else None if percent is None else percent / 100
    instance = key[1] if key[1] >= 0 else None
    return DcgmGpu(
        index=key[0],
        uuid=_uuid(labels),
        name=labels.get("modelName", ""),
        pci_bus_id=labels.get("pci_bus_id", ""),
        hostname=_host(labels),
        used_bytes=used,
        free_bytes=free,
        reserved_bytes=reserved,
        total_bytes=total,
        utilization_ratio=util,
        pods=tuple(sorted(pods)),
        gpu_instance=instance,
        profile=labels.get("GPU_I_PROFILE", "") if instance is not None else "",
    )


def _no_memory(body: str, fields: Fields) -> str:
    """The error of a body without a used or free figure: what it has instead, and where to name it."""
    names = [*fields.used, *fields.free]
    wanted = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    found = sorted(set(_FRAMEBUFFER_NAMES.findall(body)))
    if not found:
        return (
            f"no {wanted}: is this dcgm-exporter's /metrics (port 9400), and are the framebuffer fields in its "
            "counters CSV?"
        )
    return (
        f"no {wanted}, but {', '.join(n[:60] for n in found[:6])}: a dcgm-exporter whose framebuffer fields "
        "have other names (a counters CSV of its own): name its used and free families in dcgm.fields "
        '(docs/kubernetes.md, "dcgm-exporter 4.9 and later")'
    )


def _index(name: str, text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise DcgmBodyError(
            f"{name} has gpu={text[:40]!r}: dcgm-exporter's gpu label is the GPU's index, a non-negative integer; "
            "is this dcgm-exporter's /metrics (port 9400)?"
        )
    if len(text) > 4 or int(text) > MAX_INDEX:
        raise DcgmBodyError(
            f"{name} has gpu={text[:40]!r}: no GPU has an index over {MAX_INDEX}; is this dcgm-exporter's /metrics?"
        )
    return int(text)


def _instance(name: str, text: str) -> int:
    """A MIG GPU instance's id (GPU_I_ID), -1 for a whole GPU's series."""
    if not text:
        return -1
    if not (text.isascii() and text.isdigit()) or len(text) > 4 or int(text) > MAX_INDEX:
        raise DcgmBodyError(
            f"{name} has GPU_I_ID={text[:40]!r}: a MIG GPU instance's id is a small non-negative integer; is this "
            "dcgm-exporter's /metrics?"
        )
    return int(text)


def _uuid(labels: dict[str, str]) -> str:
    return labels.get("UUID") or labels.get("uuid", "")


def _host(labels: dict[str, str]) -> str:
    return labels.get("hostname") or labels.get("Hostname", "")


def _one_gpu_each(identity: dict[tuple[int, int], dict[str, str]]) -> None:
    """One node's GPUs, each once: no UUID under two indices (a GPU's MIG instances share its UUID and index), one
    hostname for the body. A body that says otherwise is refused whole (taken, one GPU under two indices doubled the
    node's memory and halved its used ratio)."""
    indices: dict[str, int] = {}
    hosts = set()
    for (index, _instance_id), labels in identity.items():
        uuid = _uuid(labels)
        if uuid and indices.setdefault(uuid, index) != index:
            raise DcgmBodyError(
                f"GPU {uuid[:60]} is listed as gpu {indices[uuid]} and gpu {index}: a body lists each GPU once; is "
                "this one node's dcgm-exporter?"
            )
        hosts.add(_host(labels))
    if len(hosts - {""}) > 1:
        names = ", ".join(sorted(h[:60] for h in hosts - {""})[:3])
        raise DcgmBodyError(f"GPUs of several hosts in one body ({names}): is this one node's dcgm-exporter?")


def _pod(labels: dict[str, str], schemes: tuple[tuple[str, str, str], ...]) -> tuple[str, str, str] | None:
    for namespace, pod, container in schemes:
        if labels.get(pod):
            return labels.get(namespace, ""), labels[pod], labels.get(container, "")
    return None


def _value(
    values: dict[tuple[str, tuple[int, int]], list[tuple[bool, float]]], name: str, key: tuple[int, int]
) -> float | None:
    """The GPU's series without pod labels where there is one (beside per-pod series), else the largest: the
    copies of a value written once per pod are equal."""
    found = values.get((name, key))
    return max(found)[1] if found else None


def _valid(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def _bytes(value: float | None, unit_name: str) -> float | None:
    """In bytes, checked after the conversion (1e308 MiB is no finite number of bytes)."""
    if value is None:
        return None
    converted = _valid(value * MIB if unit_name == MIB_UNIT else value)
    return converted if converted is not None and converted <= MAX_BYTES else None
