"""Hostile tenants of a cluster watched by the cluster mode: their pods, and what those pods claim to be.

Each case runs the real Runtime in the cluster mode against the API stand-in (simulate/kubernetes_api.py), with
dcgm-exporter stand-ins and engines at pod IPs (127.0.0.x), or the real configuration loader. The table of cases is
`CASES`; docs/faults.md prints it, and `test_docs_table_is_current` keeps the two equal. Each case failed on the
code before its fix. Waits are on conditions with a deadline, never a bare sleep.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hostile_cases import Case, assert_documented

from oomguard.exporter.config import ConfigError
from oomguard.exporter.config_loader import load_config
from oomguard.exporter.sources.kubernetes.trusted_dcgm import TrustedDcgm
from oomguard.simulate import kubernetes_objects as objects
from tests.sources.kubernetes.k8s_harness import Cluster, Dcgm, Engine, dcgm_pod, free_port, wait_for
from tests.sources.kubernetes.test_cluster_mode import MIB, dcgm_body

CASES = [
    Case("dcgm-exporter", "a tenant's pod labelled `app=nvidia-dcgm-exporter` in its own namespace, under its own "
         "DaemonSet named `nvidia-dcgm-exporter` (or a hand-written ownerReference naming one), serving GPUs at "
         "99 % on a node without a real dcgm-exporter and beside the real one, under a configuration that names no "
         "`dcgm.namespaces` (it meant every namespace)",
         "the cluster mode refuses to start without `dcgm.namespaces`, naming the key; named, only those "
         "namespaces are watched and a pod is taken only from one of them under a DaemonSet of `dcgm.daemonsets`: "
         "the node without an exporter stays without GPU figures, the other keeps the real one, no conflict",
         "test_a_tenants_daemonset_named_as_the_gpu_operators_decides_no_figure"),
]  # fmt: skip


def test_docs_table_is_current() -> None:
    assert_documented(CASES, globals())


def _settings(dcgm_port: int, **dcgm: Any) -> dict[str, Any]:
    return {
        "scope": "cluster",
        "top": {"dcgm": {"discover": True, "port": dcgm_port, "timeout_seconds": 1.0, **dcgm}},
    }


async def test_a_tenants_daemonset_named_as_the_gpu_operators_decides_no_figure(tmp_path: Path) -> None:
    port, dcgm_port = free_port("127.0.0.2"), free_port("127.0.0.4")
    # gpu-a: the GPU Operator's dcgm-exporter (92 % used) and vllm-a; gpu-b: vllm-b, no dcgm-exporter (its
    # GPU Operator pod not scheduled yet). The tenant's exporters say 99 % used on both.
    real = Dcgm("127.0.0.4", dcgm_port, dcgm_body("gpu-a", [(0, 74 * 1024, 6 * 1024, "vllm-a")]))
    fakes = [
        Dcgm("127.0.0.6", dcgm_port, dcgm_body("gpu-a", [(0, 79 * 1024, 1 * 1024 - 200, "vllm-a")])),
        Dcgm("127.0.0.7", dcgm_port, dcgm_body("gpu-b", [(0, 79 * 1024, 1 * 1024 - 200, "vllm-b")])),
    ]
    engines = [Engine("127.0.0.2", port), Engine("127.0.0.3", port)]
    servers = [real.server, *(f.server for f in fakes), *(e.server for e in engines)]
    poses = [  # the tenant's own DaemonSet's pods, and one with an ownerReference written by hand
        dcgm_pod("nvidia-dcgm-exporter-x1", "127.0.0.6", "gpu-a", namespace="tenant"),
        dcgm_pod("nvidia-dcgm-exporter-x2", "127.0.0.7", "gpu-b", namespace="tenant"),
    ]
    poses[1]["metadata"]["ownerReferences"][0]["uid"] = "written-by-hand"

    # No namespaces named: the cluster mode does not start, and says which key to set.
    unnamed = {"kubernetes": {"scope": "cluster", "port": "http"}, "dcgm": {"discover": True}}
    with pytest.raises(ConfigError, match=r"dcgm\.namespaces: is empty: name the namespaces"):
        load_config(None, unnamed)

    for server in servers:
        await server.start()
    try:
        async with Cluster(tmp_path, **_settings(dcgm_port, namespaces=["gpu-operator"])) as k8s:
            for pod in (*poses, dcgm_pod("dcgm-a", "127.0.0.4", "gpu-a")):
                await k8s.api.put("pods", pod)
            await k8s.api.put("pods", objects.pod("vllm-a", "127.0.0.2", port, node="gpu-a"))
            await k8s.api.put("pods", objects.pod("vllm-b", "127.0.0.3", port, node="gpu-b"))
            await wait_for(lambda: k8s.targets() == ["llm/vllm-a", "llm/vllm-b"], "both engines")
            await wait_for(lambda: k8s.value("oomguard_gpu_memory_used_bytes", node="gpu-a", gpu="0"), "gpu-a read")
            for _ in range(3):  # several collections: the poses are never taken, in between either
                assert await k8s.value("oomguard_gpu_memory_used_bytes", node="gpu-a", gpu="0") == 74 * 1024 * MIB
                assert await k8s.value("oomguard_gpu_memory_used_bytes", node="gpu-b", gpu="0") is None
                assert await k8s.value("oomguard_dcgm_node_pods", node="gpu-a") == 1.0
                assert await k8s.value("oomguard_dcgm_node_pods", node="gpu-b") is None
            # Only the GPU Operator's namespace is listed: the tenant's is not even read.
            dcgm_paths = [r for r in k8s.api.requests if "nvidia-dcgm-exporter" in r]
            assert dcgm_paths and all(r.startswith("/api/v1/namespaces/gpu-operator/pods") for r in dcgm_paths)
    finally:
        for server in servers:
            await server.stop()

    # Whatever a listing returns, the pod's own namespace is checked too: the trust is not the watch's alone.
    trusted = TrustedDcgm(("nvidia-dcgm-exporter",), ("gpu-operator",))
    assert not trusted.owned(poses[0], ("tenant", "nvidia-dcgm-exporter-x1"), "gpu-a")
    assert trusted.refusals == {("gpu-a", "tenant", "nvidia-dcgm-exporter-x1", "owner"): 1}
    real_pod = dcgm_pod("dcgm-a", "127.0.0.4", "gpu-a")
    assert trusted.owned(real_pod, ("gpu-operator", "dcgm-a"), "gpu-a")
    # Nothing named, nothing trusted (the configuration refuses it; this holds without it).
    assert not TrustedDcgm((), ()).owned(real_pod, ("gpu-operator", "dcgm-a"), "gpu-a")
