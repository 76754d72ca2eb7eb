"""dcgm-exporter /metrics bodies read into GPUs: the bodies in tests/fixtures/dcgm/ (its README.md cites the
dcgm-exporter source each is reproduced from), a few written inline, and the bodies that are refused."""

from __future__ import annotations

import math
import re
from pathlib import Path
from unittest.mock import ANY

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import FIXTURES, fixture_body, vllm_body

from oomguard.common.promtext import LimitExceeded
from oomguard.exporter.sources.dcgm_body import CAPACITY_BYTES as CAPACITY
from oomguard.exporter.sources.dcgm_body import (
    FREE_BYTES,
    RESERVED_BYTES,
    USED_BYTES,
    DcgmBody,
    DcgmBodyError,
    DcgmGpu,
    parse,
)

MIB = 1048576
BODIES = sorted(path.name for path in (FIXTURES / "dcgm").glob("*.prom"))
A100_80 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"


def gpu(
    index: int,
    uuid: str,
    name: str,
    pci: str,
    host: str,
    used: int,
    free: int,
    reserved: int | None,
    util: float,
    pods: tuple[tuple[str, str, str], ...] = (),
) -> DcgmGpu:
    """A GPU as expected, its memory in MiB (as the body has it); total is used + free + reserved."""
    return DcgmGpu(
        index=index,
        uuid=uuid,
        name=name,
        pci_bus_id=pci,
        hostname=host,
        used_bytes=used * MIB,
        free_bytes=free * MIB,
        reserved_bytes=None if reserved is None else reserved * MIB,
        total_bytes=(used + free + (reserved or 0)) * MIB,
        utilization_ratio=util,
        pods=pods,
    )


@pytest.mark.parametrize("name", BODIES)
def test_fixture_is_exposition_with_help_and_type(name: str) -> None:
    body = fixture_body("dcgm", name)
    families = list(text_string_to_metric_families(body))  # the full parser reads it whole
    names = {family.name for family in families}
    # Up to 4.8 the figures in MiB; 4.9 and later in bytes, under DCGM 4.7's names.
    assert names >= {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"} or names >= {USED_BYTES, FREE_BYTES}
    for family in families:
        assert f"# HELP {family.name} " in body and f"# TYPE {family.name} {family.type}\n" in body


def test_default_counters_two_gpus_hostname() -> None:
    assert parse(fixture_body("dcgm", "dcgm-3.x-default-2gpu.prom")) == DcgmBody(
        gpus=(
            gpu(0, "GPU-8f2c1d90-5b7e-4c3a-9e61-2d4f7a0b3c18", A100_80, "", "gpu-node-07", 74137, 7115, None, 0.97),
            gpu(1, "GPU-3a9e7c42-1f08-4d6b-b2c5-7e91d0a4f653", A100_80, "", "gpu-node-07", 4, 81248, None, 0.0),
        ),
        mig_series_skipped=0,
        fields=ANY,
    )


def test_kubernetes_labels_empty_on_the_gpu_in_no_pod() -> None:
    body = fixture_body("dcgm", "dcgm-3.x-kubernetes-2gpu.prom")
    assert 'gpu="1",' in body and 'container="",namespace="",pod=""} 81248' in body
    (first, second) = parse(body).gpus
    assert first == gpu(
        0,
        "GPU-8f2c1d90-5b7e-4c3a-9e61-2d4f7a0b3c18",
        A100_80,
        "",
        "gpu-node-07",
        74137,
        7115,
        None,
        0.97,
        (("llm", "vllm-mistral-7b-5f7d9c6b8-qtz4n", "vllm"),),
    )
    assert second.pods == () and second.used_bytes == 4 * MIB


def test_lowercase_hostname_reserved_and_gpus_sorted_by_index() -> None:
    body = fixture_body("dcgm", "dcgm-main-lowercase-hostname-2gpu.prom")
    assert body.index('gpu="1"') < body.index('gpu="0"')  # the expfmt renderer sorts by UUID
    assert "Hostname=" not in body
    assert parse(body) == DcgmBody(
        gpus=(
            gpu(
                0,
                "GPU-e4b1c7d2-9a30-4f85-8c16-b0d2e9f4a751",
                "NVIDIA H200",
                "00000000:19:00.0",
                "gpu-node-21",
                126880,
                16239,
                652,
                0.99,
            ),
            gpu(
                1,
                "GPU-1c6f0a3e-72d4-4b19-a5e8-3f9d6c2b0e47",
                "NVIDIA H200",
                "00000000:3B:00.0",
                "gpu-node-21",
                9,
                143110,
                652,
                0.0,
            ),
        ),
        mig_series_skipped=0,
        fields=ANY,
    )


def test_relabelled_body_reads_exported_pod_labels_not_the_exporters_own_pod() -> None:
    body = fixture_body("dcgm", "dcgm-4.x-relabelled-exported.prom")
    assert 'pod="nvidia-dcgm-exporter-7xk2p"' in body
    a100_40 = "NVIDIA A100-SXM4-40GB"
    assert parse(body) == DcgmBody(
        gpus=(
            gpu(
                0,
                "GPU-f1a3c5e7-2b4d-4f68-9a0c-e2d4f6a8b0c1",
                a100_40,
                "00000000:10:00.0",
                "gpu-node-05",
                36104,
                4017,
                839,
                0.92,
                (("team-a", "vllm-llama-3-8b-7f6d5c4b3-h9j2k", "vllm"),),
            ),
            gpu(
                1,
                "GPU-0c2e4a6b-8d1f-4a3c-b5e7-9f1b3d5a7c9e",
                a100_40,
                "00000000:16:00.0",
                "gpu-node-05",
                0,
                40121,
                839,
                0.0,
            ),
        ),
        mig_series_skipped=0,
        fields=ANY,
    )


def test_exported_labels_alone() -> None:
    body = (
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1",exported_namespace="ns",exported_pod="p",exported_container="c"} 10\n'
        'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-1",exported_namespace="ns",exported_pod="p",exported_container="c"} 20\n'
    )
    (only,) = parse(body).gpus
    assert only.pods == (("ns", "p", "c"),) and only.total_bytes == 30 * MIB


def test_mig_instances_are_gpus_of_their_own_with_their_pods() -> None:
    """GPU 0 of an A100 in MIG mode, two 3g.40gb instances (one with a Triton pod), beside GPU 1 whole: each
    instance is read as a GPU of its own, its memory and its pods; the UUID label is its parent's."""
    parent = "GPU-9b4e2f71-3c8a-4d06-b5e9-0a7d1c6f2e38"
    body = parse(fixture_body("dcgm", "dcgm-4.x-mig-kubernetes.prom"))
    assert [(g.index, g.gpu_instance, g.profile) for g in body.gpus] == [
        (0, 1, "3g.40gb"), (0, 2, "3g.40gb"), (1, None, ""),
    ]  # fmt: skip
    first, second, whole = body.gpus
    assert (first.used_bytes, first.free_bytes, first.total_bytes) == (35811 * MIB, 4381 * MIB, 40192 * MIB)
    assert first.pods == (("ml", "triton-resnet-7c9d8b6f4-p8m2v", "triton"),) and second.pods == ()
    assert (second.used_bytes, second.total_bytes) == (13 * MIB, 40192 * MIB)
    assert first.uuid == second.uuid == parent and first.utilization_ratio == 0.0
    assert whole == gpu(1, "GPU-47c1a8d3-e25b-4f9a-8d07-6b3e9f0c2a15", A100_80, "00000000:0F:00.0", "gpu-node-12",
                        52340, 28912, 668, 0.71, (("ml", "vllm-phi-3-mini-5d8c7b9f6-r3t6k", "vllm"),))  # fmt: skip
    assert body.mig_series_skipped == 0  # dcgm-exporter writes no series of the whole GPU beside its instances


def test_a_gpus_own_series_beside_its_instances_are_skipped_as_its_aggregate() -> None:
    body = parse(
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1",GPU_I_PROFILE="1g.10gb",GPU_I_ID="7"} 5\n'
        'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-1",GPU_I_PROFILE="1g.10gb",GPU_I_ID="7"} 9000\n'
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1"} 70000\n'
    )
    (only,) = body.gpus
    assert (only.gpu_instance, only.used_bytes, only.total_bytes) == (7, 5 * MIB, 9005 * MIB)
    assert body.mig_series_skipped == 1


def test_a_mig_instance_id_that_is_no_id_refuses_the_body() -> None:
    with pytest.raises(DcgmBodyError, match="GPU_I_ID='x'"):
        parse('DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1",GPU_I_ID="x"} 5\n')


def test_eight_gpus_two_pods() -> None:
    body = parse(fixture_body("dcgm", "dcgm-4.x-kubernetes-8gpu-2pods.prom"))
    vllm = (("inference", "vllm-llama-3-70b-6d9f7c8b5-x2x9q", "vllm"),)
    sglang = (("inference", "sglang-qwen2-5-32b-84b6c9d7f-7lk5w", "sglang"),)
    used = [73412, 73398, 73398, 73406, 69322, 69310, 0, 0]
    util = [0.96, 0.95, 0.97, 0.94, 0.88, 0.9, 0.0, 0.0]
    pods = [vllm] * 4 + [sglang] * 2 + [()] * 2
    assert [(g.index, g.used_bytes, g.free_bytes, g.utilization_ratio, g.pods) for g in body.gpus] == [
        (i, used[i] * MIB, (81014 - used[i]) * MIB, util[i], pods[i]) for i in range(8)
    ]
    assert {(g.name, g.hostname, g.reserved_bytes, g.total_bytes) for g in body.gpus} == {
        (H100, "gpu-node-03", 545 * MIB, 81559 * MIB)
    }
    assert body.gpus[7].uuid == "GPU-2e5c7b98-9d1a-4f36-8b7e-4a0c6d2f9e15"
    assert body.gpus[7].pci_bus_id == "00000000:DB:00.0"
    assert body.mig_series_skipped == 0


def test_shared_gpu_per_process_series_beside_the_gpus_own() -> None:
    """--kubernetes-virtual-gpus, recent versions: FB_USED and GPU_UTIL have the GPU's series and one per pod
    (its processes' memory); the GPU's series gives the value, every series gives a pod."""
    l40s = "NVIDIA L40S"
    both = (
        ("serving", "tei-embed-6c8f9d7b4-2kq8x", "tei"),
        ("serving", "vllm-qwen2-5-1-5b-7b9c4d6f5-m4n7p", "vllm"),
    )
    assert parse(fixture_body("dcgm", "dcgm-main-virtual-gpus-shared.prom")) == DcgmBody(
        gpus=(
            gpu(
                0,
                "GPU-b83d6f1a-4c29-4e7b-9a05-d1e3f5a7c9b2",
                l40s,
                "00000000:41:00.0",
                "gpu-node-30",
                30514,
                15082,
                472,
                0.87,
                both,
            ),
            gpu(
                1,
                "GPU-63a0e9c4-1b7d-4f25-8e3a-c5f7b9d1e3a8",
                l40s,
                "00000000:C1:00.0",
                "gpu-node-30",
                0,
                45596,
                472,
                0.0,
            ),
        ),
        mig_series_skipped=0,
        fields=ANY,
    )


def test_shared_gpu_one_series_per_pod_value_taken_once() -> None:
    """A GPU shared by pods, every family copied once per pod with the same value: read once, every pod kept."""
    labels = 'gpu="0",UUID="GPU-1",device="nvidia0",modelName="NVIDIA L4",Hostname="n1"'
    pod_a = 'container="a",namespace="ns",pod="pod-a",vgpu="0"'
    pod_b = 'container="b",namespace="ns",pod="pod-b",vgpu="1"'
    pod_a_again = 'container="a",namespace="ns",pod="pod-a",vgpu="2"'  # a pod holding two replicas of the GPU
    body = "".join(
        f"{name}{{{labels},{pod}}} {value}\n"
        for name, value in (("DCGM_FI_DEV_FB_USED", 9000), ("DCGM_FI_DEV_FB_FREE", 13000), ("DCGM_FI_DEV_GPU_UTIL", 40))
        for pod in (pod_a, pod_b, pod_a_again)
    )
    (only,) = parse(body).gpus
    assert (only.used_bytes, only.free_bytes, only.total_bytes) == (9000 * MIB, 13000 * MIB, 22000 * MIB)
    assert only.utilization_ratio == 0.4
    assert only.pods == (("ns", "pod-a", "a"), ("ns", "pod-b", "b"))


def test_use_old_namespace_labels() -> None:
    pod = 'container_name="c",pod_namespace="ns",pod_name="p"'
    labels = f'gpu="0",uuid="GPU-1",device="nvidia0",modelName="Tesla T4",{pod}'
    body = f"DCGM_FI_DEV_FB_USED{{{labels}}} 100\nDCGM_FI_DEV_FB_FREE{{{labels}}} 15000\n"
    (only,) = parse(body).gpus
    assert (only.uuid, only.hostname, only.pods) == ("GPU-1", "", (("ns", "p", "c"),))


def test_fb_total_wins_where_published_and_fields_absent_are_none() -> None:
    body = (
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1"} 100\n'
        'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-1"} 200\n'
        'DCGM_FI_DEV_FB_TOTAL{gpu="0",UUID="GPU-1"} 512\n'
        'DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-2"} 200\n'
    )
    first, second = parse(body).gpus
    assert first.total_bytes == 512 * MIB and first.reserved_bytes is None
    assert (second.used_bytes, second.total_bytes, second.utilization_ratio) == (None, None, None)
    assert (second.name, second.pci_bus_id, second.hostname) == ("", "", "")


def test_negative_and_non_finite_values_are_none_not_errors() -> None:
    body = (
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1"} NaN\n'
        'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-1"} -1\n'
        'DCGM_FI_DEV_FB_RESERVED{gpu="0",UUID="GPU-1"} +Inf\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1"} NaN\n'
        'DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-2"} 10\n'
        'DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-2"} 20\n'
        'DCGM_FI_DEV_FB_RESERVED{gpu="1",UUID="GPU-2"} -Inf\n'
    )
    first, second = parse(body).gpus
    assert (first.used_bytes, first.free_bytes, first.reserved_bytes, first.total_bytes) == (None, None, None, None)
    assert first.utilization_ratio is None
    assert (second.reserved_bytes, second.total_bytes) == (None, 30 * MIB)


NOT_DCGM = (
    "no DCGM_FI_DEV_FB_USED_BYTES, DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_FB_FREE_BYTES or DCGM_FI_DEV_FB_FREE: is this "
    "dcgm-exporter's /metrics (port 9400), and are the framebuffer fields in its counters CSV?"
)


@pytest.mark.parametrize(
    "body",
    [
        vllm_body("vllm-0.32.0-cpu-idle.txt"),
        "",
        'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 5\n',
        'dcgm_fb_used{gpu="0",UUID="GPU-1"} 5\n',  # etc/1.x-compatibility-metrics.csv's names: not read
    ],
)
def test_not_dcgm_exporter(body: str) -> None:
    with pytest.raises(DcgmBodyError, match=f"^{re.escape(NOT_DCGM)}$"):
        parse(body)


@pytest.mark.parametrize("value", ["GPU-0", "-1", "0.5", "", "²"])
def test_gpu_label_not_an_index(value: str) -> None:
    body = f'DCGM_FI_DEV_FB_USED{{gpu="{value}",UUID="GPU-1"}} 5\n'
    message = (
        f"DCGM_FI_DEV_FB_USED has gpu={value!r}: dcgm-exporter's gpu label is the GPU's index, a non-negative "
        "integer; is this dcgm-exporter's /metrics (port 9400)?"
    )
    with pytest.raises(DcgmBodyError, match=f"^{re.escape(message)}$"):
        parse(body)


def test_a_sample_without_gpu_label() -> None:
    with pytest.raises(DcgmBodyError, match=r"^DCGM_FI_DEV_FB_FREE has gpu='': "):
        parse('DCGM_FI_DEV_FB_FREE{UUID="GPU-1"} 5\n')


def test_more_gpus_than_max_gpus() -> None:
    body = fixture_body("dcgm", "dcgm-4.x-kubernetes-8gpu-2pods.prom")
    assert len(parse(body, max_gpus=8).gpus) == 8
    message = (
        "more than 7 GPUs and MIG instances (values of the gpu and GPU_I_ID labels) in one body: is this one "
        "node's dcgm-exporter? "
        "Raise max_gpus if a node has that many"
    )
    with pytest.raises(DcgmBodyError, match=f"^{re.escape(message)}$"):
        parse(body, max_gpus=7)


def test_body_over_the_sample_limit() -> None:
    body = "".join(f'DCGM_FI_DEV_FB_USED{{gpu="{i}",UUID="GPU-{i}"}} 1\n' for i in range(5001))
    message = (
        "more than 5000 samples in the families oomguard reads, over the sample limit: is this one node's "
        "dcgm-exporter?"
    )
    with pytest.raises(DcgmBodyError, match=f"^{re.escape(message)}$") as raised:
        parse(body, max_gpus=10_000)
    assert isinstance(raised.value.__cause__, LimitExceeded)


def test_malformed_body() -> None:
    body = 'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1"} 5\nDCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1"} 6\n'
    message = (
        'not read as dcgm-exporter\'s /metrics: the series DCGM_FI_DEV_FB_USED{UUID="GPU-1",gpu="0"} is written '
        "more than once"
    )
    with pytest.raises(DcgmBodyError, match=f"^{re.escape(message)}$"):
        parse(body)


def test_fixtures_readme_names_every_body() -> None:
    readme = Path(FIXTURES / "dcgm" / "README.md").read_text(encoding="utf-8")
    assert len(BODIES) == 8
    assert all(f"`{name}`" in readme for name in BODIES)


def test_values_are_checked_after_the_unit_conversion() -> None:
    """`FB_USED 1e308` (MiB) exported an infinite total and a NaN ratio: that GPU could never page. Now a figure no
    GPU has is none, and a GPU of no memory has no total."""
    body = (
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1"} 1e308\n'
        'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-1"} 100\n'
        'DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-2"} 0\n'
        'DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-2"} 0\n'
        'DCGM_FI_DEV_FB_USED{gpu="2",UUID="GPU-3"} 1073741825\n'  # a petabyte and a MiB
        'DCGM_FI_DEV_FB_FREE{gpu="2",UUID="GPU-3"} 10\n'
    )
    huge, empty, over = parse(body).gpus
    assert (huge.used_bytes, huge.total_bytes) == (None, None)
    assert (empty.used_bytes, empty.total_bytes) == (0.0, None)
    assert (over.used_bytes, over.total_bytes) == (None, None)
    for gpu in (huge, empty, over):
        assert all(v is None or math.isfinite(v) for v in (gpu.used_bytes, gpu.free_bytes, gpu.total_bytes))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1",Hostname="a"} 5\n'
         'DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-1",Hostname="a"} 5\n', "GPU GPU-1 is listed as gpu 0 and gpu 1"),
        ('DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1",Hostname="a"} 5\n'
         'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-9",Hostname="a"} 5\n', "gpu 0 is listed as two GPUs"),
        ('DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1",Hostname="a"} 5\n'
         'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-1",Hostname="b"} 5\n', "gpu 0 is listed as two GPUs"),
        ('DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1",Hostname="a"} 5\n'
         'DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-2",Hostname="b"} 5\n', r"GPUs of several hosts in one body \(a, b\)"),
        ('DCGM_FI_DEV_FB_USED{gpu="1000000000000000000000000000000",UUID="GPU-1"} 5\n', "no GPU has an index over"),
        ('DCGM_FI_DEV_FB_USED{gpu="1024",UUID="GPU-1"} 5\n', "no GPU has an index over 1023"),
    ],
    ids=["one UUID, two indices", "one index, two UUIDs", "one index, two hosts", "two hosts", "index 10^30",
         "index 1024"],
)  # fmt: skip
def test_a_body_that_lists_a_gpu_twice_or_out_of_range_is_refused_whole(body: str, message: str) -> None:
    """One GPU under two hostnames or UUIDs doubled its total (a used ratio of 0.5); a GPU index of 10^30 was taken."""
    with pytest.raises(DcgmBodyError, match=message):
        parse(body)


def test_the_configured_fields_defaults_are_the_parsers() -> None:
    from oomguard.exporter.config import DcgmFieldsConfig
    from oomguard.exporter.sources.dcgm_body import DEFAULT_FIELDS, Fields

    assert Fields(**DcgmFieldsConfig().model_dump()) == DEFAULT_FIELDS


def _family(name: str, help_text: str | None, values: dict[int, float]) -> str:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"] if help_text is not None else []
    lines += [f'{name}{{gpu="{i}",UUID="GPU-{i}",modelName="NVIDIA H100 80GB HBM3",hostname="n"}} {v}' for i, v in
              values.items()]  # fmt: skip
    return "\n".join(lines) + "\n"


def test_dcgm_exporter_4_9s_total_in_bytes_beside_the_used_in_mib() -> None:
    """4.9 and later collect DCGM_FI_DEV_FB_CAPACITY_BYTES (the total, bytes) by default: read as the total beside a
    used figure in MiB, each in its own unit, and the body says which families it was read by."""
    total = 85_520_809_984  # an H100 80GB's framebuffer, bytes
    body = _family(CAPACITY, "Total framebuffer memory (in bytes).", {0: total, 1: total}) + _family(
        "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", {0: 73_000, 1: 1_000}
    )
    parsed = parse(body)
    assert [(g.used_bytes, g.total_bytes) for g in parsed.gpus] == [(73_000 * MIB, total), (1_000 * MIB, total)]
    assert parsed.fields == (("used", "DCGM_FI_DEV_FB_USED", "MiB"), ("total", CAPACITY, "bytes"))


@pytest.mark.parametrize(
    ("help_text", "unit"),
    [("Framebuffer memory used (in MiB).", "MiB"), ("Framebuffer memory used (in MB).", "MiB"),
     ("Framebuffer memory used (in bytes).", "bytes"), (None, "MiB")],
)  # fmt: skip
def test_a_configured_familys_unit_from_its_help_else_its_name(help_text: str | None, unit: str) -> None:
    """A family of the user's (dcgm.fields) whose unit DCGM does not fix by its name: its help text says."""
    from oomguard.exporter.sources.dcgm_body import Fields

    fields = Fields(used=("SITE_FB_USED",))
    parsed = parse(_family("SITE_FB_USED", help_text, {0: 2048}) + _family("DCGM_FI_DEV_FB_FREE", None, {0: 0}),
                   fields=fields)  # fmt: skip
    assert parsed.gpus[0].used_bytes == (2048 * MIB if unit == "MiB" else 2048)
    assert ("used", "SITE_FB_USED", unit) in parsed.fields


@pytest.mark.parametrize("help_text", ["Framebuffer memory used (in bytes).", "Framebuffer memory used (in MiB).",
                                       None])  # fmt: skip
def test_dcgms_own_names_have_their_fields_unit_whatever_the_help_says(help_text: str | None) -> None:
    """DCGM_FI_DEV_FB_USED (252) is MiB and DCGM_FI_DEV_FB_USED_BYTES (1627) bytes, as DCGM defines the fields: a
    custom counters CSV's help text, copied from a row of the other kind, does not change what DCGM sends."""
    old = parse(_family("DCGM_FI_DEV_FB_USED", help_text, {0: 2048}) + _family("DCGM_FI_DEV_FB_FREE", None, {0: 0}))
    new = parse(_family(USED_BYTES, help_text, {0: 2048}) + _family(FREE_BYTES, None, {0: 0}))
    assert (old.gpus[0].used_bytes, new.gpus[0].used_bytes) == (2048 * MIB, 2048)
    assert old.fields[0] == ("used", "DCGM_FI_DEV_FB_USED", "MiB") and new.fields[0] == ("used", USED_BYTES, "bytes")


def test_dcgm_exporter_4_10_body_reads_exactly_by_default() -> None:
    """A 4.10 body (tests/fixtures/dcgm/README.md: the expfmt renderer's labels and order, `hostname`, the driver
    label DCGM_FI_SYSTEM_DRIVER_VERSION, memory in bytes under DCGM 4.7's names, utilization a ratio), read with no
    configuration: every figure to the byte, none rounded to a MiB."""
    cap, reserved = 143771 * MIB, 652 * MIB
    h200, host = "NVIDIA H200", "gpu-node-21"
    parsed = parse(fixture_body("dcgm", "dcgm-4.10-bytes-2gpu.prom"))
    assert parsed == DcgmBody(
        gpus=(
            DcgmGpu(0, "GPU-e4b1c7d2-9a30-4f85-8c16-b0d2e9f4a751", h200, "00000000:19:00.0", host,
                    used_bytes=133_041_528_889, free_bytes=cap - 133_041_528_889 - reserved, reserved_bytes=reserved,
                    total_bytes=cap, utilization_ratio=0.99, pods=(("llm", "vllm-0", "vllm"),)),
            DcgmGpu(1, "GPU-1c6f0a3e-72d4-4b19-a5e8-3f9d6c2b0e47", h200, "00000000:3B:00.0", host,
                    used_bytes=9_438_418, free_bytes=cap - 9_438_418 - reserved, reserved_bytes=reserved,
                    total_bytes=cap, utilization_ratio=0.0, pods=()),
        ),
        mig_series_skipped=0,
        fields=(("used", USED_BYTES, "bytes"), ("free", FREE_BYTES, "bytes"), ("reserved", RESERVED_BYTES, "bytes"),
                ("total", CAPACITY, "bytes")),
    )  # fmt: skip


def test_a_body_with_both_namings_reads_the_new_ones_first() -> None:
    """A counters CSV that lists a figure under both names (4.9's rows added to a 4.8 CSV): the bytes are read, not
    the MiB rounded down; a figure only the old name has is read in MiB beside them."""
    body = (
        _family("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", {0: 40_000})
        + _family(USED_BYTES, "Framebuffer memory used (in bytes).", {0: 41_943_040_123})
        + _family("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", {0: 41_000})
        + _family(FREE_BYTES, "Framebuffer memory free (in bytes).", {0: 42_991_616_000})
        + _family("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", {0: 500})
        + _family("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", {0: 50})
        + _family("DCGM_FI_DEV_GPU_UTIL_RATIO", "GPU utilization (ratio, 0 to 1).", {0: 0.25})
    )
    parsed = parse(body)
    (gpu,) = parsed.gpus
    assert (gpu.used_bytes, gpu.free_bytes, gpu.reserved_bytes) == (41_943_040_123, 42_991_616_000, 500 * MIB)
    assert gpu.total_bytes == 41_943_040_123 + 42_991_616_000 + 500 * MIB
    assert gpu.utilization_ratio == 0.25
    assert parsed.fields == (("used", USED_BYTES, "bytes"), ("free", FREE_BYTES, "bytes"),
                             ("reserved", "DCGM_FI_DEV_FB_RESERVED", "MiB"))  # fmt: skip


def test_renamed_fields_are_named_in_the_error_and_read_once_configured() -> None:
    """Framebuffer families under names the defaults do not list (a site's own counters CSV): the body's own
    framebuffer families are named in the error, with the key that takes them (dcgm.fields). `EXAMPLE_*` below are
    placeholders for whatever a user's exporter writes, not NVIDIA's names."""
    from oomguard.exporter.sources.dcgm_body import Fields

    gib = 2**30
    body = (
        _family(CAPACITY, "Total framebuffer memory (in bytes).", {0: 80 * gib})
        + _family("DCGM_FI_DEV_FB_EXAMPLE_USED_BYTES", "Framebuffer memory used (in bytes).", {0: 60 * gib})
        + _family("DCGM_FI_DEV_FB_EXAMPLE_FREE_BYTES", "Framebuffer memory free (in bytes).", {0: 20 * gib})
    )
    with pytest.raises(DcgmBodyError) as refused:
        parse(body)
    message = str(refused.value)
    assert "DCGM_FI_DEV_FB_EXAMPLE_USED_BYTES" in message and "dcgm.fields" in message
    fields = Fields(used=("DCGM_FI_DEV_FB_EXAMPLE_USED_BYTES", "DCGM_FI_DEV_FB_USED"),
                    free=("DCGM_FI_DEV_FB_EXAMPLE_FREE_BYTES", "DCGM_FI_DEV_FB_FREE"))  # fmt: skip
    (gpu,) = parse(body, fields=fields).gpus
    assert (gpu.used_bytes, gpu.free_bytes, gpu.total_bytes) == (60 * gib, 20 * gib, 80 * gib)
    # The same configuration reads a 4.8 exporter of the same fleet, in MiB.
    (old,) = parse(fixture_body("dcgm", "dcgm-3.x-default-2gpu.prom"), fields=fields).gpus[:1]
    assert old.used_bytes is not None and old.used_bytes % MIB == 0


def test_a_bytes_figure_past_any_gpu_is_refused_as_a_mib_one_is() -> None:
    body = _family(CAPACITY, "(in bytes)", {0: 2.0**51}) + _family("DCGM_FI_DEV_FB_USED", None, {0: 10})
    (gpu,) = parse(body).gpus
    assert gpu.total_bytes is None and gpu.used_bytes == 10 * MIB  # no total rather than a petabyte's
