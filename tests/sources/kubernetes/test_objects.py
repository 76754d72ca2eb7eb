"""The stand-in's objects validate against the official schema; a pod object -> its target, probes, cgroups."""

from __future__ import annotations

import kubernetes_validate
import pytest

from oomguard.common.kubelet_cgroups import pod_of
from oomguard.exporter.events.kubernetes import probe_kind
from oomguard.exporter.sources.kubernetes.cgroup import attribute
from oomguard.exporter.sources.kubernetes.pods import container_settings, pod_target
from oomguard.exporter.sources.kubernetes.probes import grace_seconds
from oomguard.simulate import kubernetes_objects as objects

UID = "0f1e2d3c-4b5a-4987-8654-3210fedcba98"
CID = "d" * 64


def _served() -> list[dict]:
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5, "failureThreshold": 2}
    ended = objects.terminated("OOMKilled", 137, "2026-12-03T12:05:00Z")
    pod = objects.pod("vllm-0", "127.0.0.2", 8000, startup_probe=probe, liveness_probe=probe, last_terminated=ended)
    return [
        pod,
        objects.pod("vllm-1", None, 8000, phase="Pending"),
        objects.event(pod, "Unhealthy", "Startup probe failed: Get ...: connect: connection refused", count=3),
        objects.event(pod, "Killing", "Container vllm failed startup probe, will be restarted"),
    ]


@pytest.mark.parametrize("version", ["1.30", kubernetes_validate.latest_version()])
def test_the_stand_in_serves_valid_objects(version: str) -> None:
    for obj in _served():
        kubernetes_validate.validate(obj, version, strict=True)


def test_a_pod_makes_a_target_with_its_engine_container_and_last_end() -> None:
    ended = objects.terminated("OOMKilled", 137, "2026-12-03T12:05:00Z", container_id=CID)
    pod = pod_target(objects.pod("vllm-0", "127.0.0.2", 8000, restart_count=2, last_terminated=ended), "http")
    assert pod is not None
    assert (pod.target, pod.url, pod.container, pod.restart_count) == ("llm/vllm-0", "http://127.0.0.2:8000", "vllm", 2)
    assert pod.last_termination is not None and pod.last_termination.oom_killed
    assert pod.last_termination.container_id == CID
    assert pod_target(objects.pod("vllm-0", "127.0.0.2", 8000), 8000) is not None  # by number
    assert pod_target(objects.pod("vllm-0", "127.0.0.2", 8000), "grpc") is None  # no such port
    assert pod_target(objects.pod("vllm-0", None, 8000), "http") is None  # no IP yet
    assert pod_target(objects.pod("vllm-0", "127.0.0.2", 8000, phase="Succeeded"), "http") is None
    assert pod_target(objects.pod("v", "fd00::2", 8000), "http").url == "http://[fd00::2]:8000"  # type: ignore[union-attr]


def test_exit_code_137_is_an_oom_kill_too() -> None:
    ended = objects.terminated("Error", 137, "2026-12-03T12:05:00Z")
    pod = pod_target(objects.pod("vllm-0", "127.0.0.2", 8000, last_terminated=ended), "http")
    assert pod is not None and pod.last_termination is not None and pod.last_termination.oom_killed
    ended = objects.terminated("Error", 1, "2026-12-03T12:05:00Z")
    pod = pod_target(objects.pod("vllm-0", "127.0.0.2", 8000, last_terminated=ended), "http")
    assert pod is not None and pod.last_termination is not None and not pod.last_termination.oom_killed


def test_probe_grace_is_the_startup_probe_first_with_kubernetes_defaults() -> None:
    startup = {"initialDelaySeconds": 5, "periodSeconds": 10, "failureThreshold": 6}
    liveness = {"initialDelaySeconds": 600}
    assert grace_seconds({"startupProbe": startup, "livenessProbe": liveness}) == 65.0
    assert grace_seconds({"livenessProbe": liveness}) == 630.0  # defaults: 3 x 10 s
    assert grace_seconds({"livenessProbe": {}}) == 30.0
    assert grace_seconds({"readinessProbe": startup}) is None  # readiness never kills


def test_probe_events_are_liveness_and_startup_failures_and_kills_only() -> None:
    pod = objects.pod("vllm-0", "127.0.0.2", 8000)
    assert probe_kind(objects.event(pod, "Unhealthy", "Liveness probe failed: HTTP probe failed")) == "probe_failure"
    assert probe_kind(objects.event(pod, "Unhealthy", "Startup probe failed: connection refused")) == "probe_failure"
    assert probe_kind(objects.event(pod, "Unhealthy", "Readiness probe failed: 503")) is None
    killing = "Container vllm failed liveness probe, will be restarted"
    assert probe_kind(objects.event(pod, "Killing", killing)) == "probe_kill"
    assert probe_kind(objects.event(pod, "Killing", "Stopping container vllm")) is None  # a deletion


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v2, systemd driver (containerd)
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
        f"cri-containerd-{CID}.scope\n",
        # cgroup v2, cgroupfs driver
        f"0::/kubepods/burstable/pod{UID}/{CID}\n",
        # cgroup v1, several hierarchies, CRI-O
        f"12:memory:/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n"
        f"11:cpu,cpuacct:/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n",
    ],
)
def test_a_cgroup_path_names_the_pod_and_container(text: str) -> None:
    assert pod_of(text) == (UID, CID)


def test_processes_outside_pods_and_gone_ones_are_not_attributed(tmp_path) -> None:
    (tmp_path / "10").mkdir()
    (tmp_path / "10" / "cgroup").write_text("0::/system.slice/sshd.service\n")
    (tmp_path / "11").mkdir()
    (tmp_path / "11" / "cgroup").write_text(f"0::/kubepods/pod{UID}/{CID}\n")
    assert attribute([10, 11, 12], str(tmp_path)) == {11: (UID, CID)}


@pytest.mark.parametrize(
    ("spec", "engine", "want"),
    [
        # The image's entrypoint with the flags in args, the first of them a flag.
        ({"args": ["--gpu-memory-utilization", "0.95", "--model", "m"]}, "vllm",
         ("gpu_memory_utilization", 0.95, "flag")),
        ({"command": ["vllm", "serve"], "args": ["m", "--gpu-memory-utilization=0.8"]}, "vllm",
         ("gpu_memory_utilization", 0.8, "flag")),
        ({"command": ["/bin/sh", "-c", "exec vllm serve m --gpu-memory-utilization '0.85'"]}, "vllm",
         ("gpu_memory_utilization", 0.85, "flag")),
        ({"args": ["--model", "m"]}, "vllm", ("gpu_memory_utilization", 0.9, "default")),  # every version's default
        ({"command": ["python3", "-m", "sglang.launch_server"], "args": ["--mem-fraction-static", "0.88"]}, "sglang",
         ("mem_fraction_static", 0.88, "flag")),
        ({"env": [{"name": "CUDA_MEMORY_FRACTION", "value": "0.7"}, {"name": "X", "valueFrom": {}}]}, "tgi",
         ("cuda_memory_fraction", 0.7, "flag")),
    ],
)  # fmt: skip
def test_a_containers_command_line_gives_its_engines_settings(spec: dict, engine: str, want: tuple) -> None:
    name, value, origin = want
    setting = container_settings({"name": "engine", **spec}, engine)[name]
    assert (setting.value, setting.origin) == (value, origin)


def test_a_shell_script_that_cannot_be_split_gives_no_settings() -> None:
    assert container_settings({"command": ["sh", "-c", "vllm serve 'm --gpu-memory-utilization 0.95"]}, "vllm") == {}


def test_the_pod_target_carries_its_containers_settings_for_its_engine_only() -> None:
    obj = objects.pod("vllm-0", "127.0.0.2", 8000, args=["--gpu-memory-utilization", "0.95"])
    with_engine = pod_target(obj, "http", "vllm")
    assert with_engine is not None and with_engine.settings["gpu_memory_utilization"].value == 0.95
    without = pod_target(obj, "http")
    assert without is not None and without.settings == {}
