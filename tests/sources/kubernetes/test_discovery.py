"""Pod discovery against the stand-in API: targets as pods come and go, what the pod object and its
Events say, attribution from NVML's pids, and an API that refuses or is away."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from oomguard.simulate import kubernetes_objects as objects
from oomguard.simulate.fake_nvml import GIB, FakeGpu, FakeNvml, FakeProcess
from tests.sources.kubernetes.k8s_harness import Cluster, Engine, engine_up, equals, free_port, wait_for

NAME = "llm/vllm-0"
POD = {"namespace": "llm", "pod": "vllm-0", "container": "vllm", "target": NAME}


async def test_a_pod_restarted_while_loading_is_scraped_at_its_new_ip(tmp_path: Path) -> None:
    port = free_port("127.0.0.2")
    first, second = Engine("127.0.0.2", port, serving=False), Engine("127.0.0.3", port, serving=False)
    await first.server.start()
    await second.server.start()
    try:
        async with Cluster(tmp_path) as k8s:
            await k8s.api.put(
                "pods", objects.pod("vllm-0", "127.0.0.2", port, uid="11111111-1111-4111-8111-111111111111")
            )
            # Not of this node, and not an engine: no target.
            await k8s.api.put("pods", objects.pod("vllm-9", "127.0.0.9", port, node="other-node"))
            await k8s.api.put("pods", objects.pod("redis-0", "127.0.0.8", port, labels={"app": "redis"}))
            await wait_for(lambda: k8s.targets() == [NAME], "the pod's target")
            await wait_for(
                lambda: k8s.value("oomguard_target_state", state="loading", **POD),
                "the target loading, with its pod labels",
            )
            assert await k8s.value("oomguard_source_success", source="kubernetes") == 1.0

            # The pod is replaced under its name (a StatefulSet's) while it loads: a new UID, a new IP.
            await k8s.api.delete("pods", "llm", "vllm-0")
            uid = "22222222-2222-4222-8222-222222222222"
            await k8s.api.put("pods", objects.pod("vllm-0", "127.0.0.3", port, uid=uid))
            await wait_for(
                lambda: [s.config.url for s in k8s.runtime.targets.scrapers()] == [f"http://127.0.0.3:{port}"],
                "the new IP in use",
            )
            # Its engine container's log, under the new UID's folder, is followed (read from its start: a new pod).
            log_dir = tmp_path / "pods" / f"llm_vllm-0_{uid}" / "vllm"
            log_dir.mkdir(parents=True)
            (log_dir / "0.log").write_text(
                "2026-12-03T12:00:01.000000000Z stderr F Traceback (most recent call last):\n"
                "2026-12-03T12:00:01.000000000Z stderr F torch.OutOfMemoryError: CUDA out of memory. "
                "Tried to allocate 2.00 GiB\n"
            )
            second.serving = True
            await wait_for(lambda: k8s.value("oomguard_target_up", **POD), "the new pod up")
            await wait_for(lambda: k8s.value("oomguard_target_events_total", kind="cuda_oom", **POD), "its log's OOM")
            assert await k8s.value("oomguard_target_info", engine="vllm", url=f"http://127.0.0.3:{port}", **POD) == 1.0

            await k8s.api.delete("pods", "llm", "vllm-0")
            await wait_for(lambda: k8s.targets() == [], "the target gone with its pod")
            assert await k8s.value("oomguard_target_up", **POD) is None
    finally:
        await first.server.stop()
        await second.server.stop()


async def test_oom_killed_containers_restarts_and_probe_events(tmp_path: Path) -> None:
    async with engine_up() as engine, Cluster(tmp_path) as k8s:
        port = engine.server.port
        pod = await k8s.api.put("pods", objects.pod("vllm-0", "127.0.0.2", port))
        await wait_for(lambda: k8s.value("oomguard_target_up", **POD), "the target up")
        for kind in ("container_oom_killed", "probe_failure", "probe_kill"):  # zeros from the start
            assert await k8s.value("oomguard_target_events_total", kind=kind, **POD) == 0.0

        ended = objects.terminated("OOMKilled", 137, "2026-12-03T12:05:00Z", container_id="1" * 64)
        await k8s.api.put("pods", objects.pod("vllm-0", "127.0.0.2", port, uid=pod["metadata"]["uid"],
                                              restart_count=1, last_terminated=ended))  # fmt: skip
        await wait_for(
            lambda: k8s.value("oomguard_target_events_total", kind="container_oom_killed", **POD), "OOMKilled"
        )
        assert await k8s.value("oomguard_target_restarts_total", **POD) == 1.0
        assert await k8s.value("oomguard_target_last_restart_timestamp_seconds", **POD) == 1796299500.0

        # The same end seen again (a resync) is not counted twice; a SIGKILL's 137 is an OOM kill too.
        await k8s.api.put("pods", objects.pod("vllm-0", "127.0.0.2", port, uid=pod["metadata"]["uid"],
                                              restart_count=1, last_terminated=ended))  # fmt: skip
        ended = objects.terminated("Error", 137, "2026-12-03T12:09:00Z", container_id="2" * 64)
        await k8s.api.put("pods", objects.pod("vllm-0", "127.0.0.2", port, uid=pod["metadata"]["uid"],
                                              restart_count=2, last_terminated=ended))  # fmt: skip
        await wait_for(
            lambda: equals(k8s.value("oomguard_target_events_total", kind="container_oom_killed", **POD), 2.0),
            "the second OOM kill",
        )
        assert await k8s.value("oomguard_target_restarts_total", **POD) == 2.0
        # A new container loading refuses: loading, not down.
        engine.serving = False
        await k8s.api.put("pods", objects.pod("vllm-0", "127.0.0.2", port, uid=pod["metadata"]["uid"],
                                              restart_count=3, last_terminated=ended))  # fmt: skip
        await wait_for(lambda: equals(k8s.value("oomguard_target_restarts_total", **POD), 3.0), "3 restarts")
        assert await k8s.value("oomguard_target_state", state="loading", **POD) == 1.0
        engine.serving = True

        # The kubelet's Events: a startup probe failing 3 times (one Event, count 3), then the kill.
        unhealthy = objects.event(pod, "Unhealthy", "Startup probe failed: connect: connection refused", count=2)
        await k8s.api.put("events", unhealthy)
        unhealthy["count"] = 3
        await k8s.api.put("events", unhealthy)
        await k8s.api.put("events", objects.event(pod, "Unhealthy", "Readiness probe failed: HTTP 503"))
        await k8s.api.put(
            "events", objects.event(pod, "Killing", "Container vllm failed startup probe, will be restarted")
        )
        await wait_for(lambda: k8s.value("oomguard_target_events_total", kind="probe_kill", **POD), "the probe kill")
        await wait_for(
            lambda: equals(k8s.value("oomguard_target_events_total", kind="probe_failure", **POD), 3.0),
            "three probe failures",
        )


async def test_an_oom_kill_counted_before_a_restart_of_the_exporter_is_not_counted_again(tmp_path: Path) -> None:
    ended = objects.terminated("OOMKilled", 137, "2026-12-03T12:05:00Z")
    async with engine_up() as engine, Cluster(tmp_path) as k8s:
        port = engine.server.port
        pod = await k8s.api.put("pods", objects.pod("vllm-0", "127.0.0.2", port))
        await wait_for(lambda: k8s.targets() == [NAME], "the target")
        await k8s.api.put("pods", objects.pod("vllm-0", "127.0.0.2", port, uid=pod["metadata"]["uid"],
                                              restart_count=1, last_terminated=ended))  # fmt: skip
        await wait_for(lambda: k8s.value("oomguard_target_events_total", kind="container_oom_killed", **POD), "OOM")
        await k8s.runtime.stop()  # the exporter restarts
        await k8s.runtime.start()
        await wait_for(lambda: k8s.targets() == [NAME], "the target again")
        await wait_for(lambda: k8s.value("oomguard_target_up", **POD), "the target up again")
        await asyncio.sleep(0.2)  # a few event polls: the same end, saved as counted, is not counted again
        assert await k8s.value("oomguard_target_events_total", kind="container_oom_killed", **POD) == 1.0

        await k8s.runtime.stop()  # and while it is away, the container is OOM-killed again
        ended = objects.terminated("OOMKilled", 137, "2026-12-03T12:15:00Z", container_id="9" * 64)
        await k8s.api.put("pods", objects.pod("vllm-0", "127.0.0.2", port, uid=pod["metadata"]["uid"],
                                              restart_count=2, last_terminated=ended))  # fmt: skip
        await k8s.runtime.start()
        await wait_for(
            lambda: equals(k8s.value("oomguard_target_events_total", kind="container_oom_killed", **POD), 2.0),
            "the kill while the exporter was away",
        )


async def test_a_startup_probe_shorter_than_the_load(tmp_path: Path) -> None:
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1, "failureThreshold": 1}
    async with engine_up(serving=False) as engine, Cluster(tmp_path) as k8s:
        port = engine.server.port
        liveness = {"httpGet": {"path": "/health", "port": "http"}}
        await k8s.api.put(
            "pods", objects.pod("vllm-0", "127.0.0.2", port, startup_probe=probe, liveness_probe=liveness)
        )
        await wait_for(lambda: k8s.value("oomguard_target_probe_grace_seconds", **POD), "the grace gauge")
        assert await k8s.value("oomguard_target_probe_grace_seconds", **POD) == 1.0  # 0 + 1 x 1 s: startup first
        await wait_for(lambda: k8s.value("oomguard_target_state", state="loading", **POD), "loading")
        await asyncio.sleep(max(0.0, engine.started + 1.5 - time.time()))  # a load of 1.5 s
        engine.serving = True
        startup = await wait_for(lambda: k8s.value("oomguard_target_startup_seconds", **POD), "its startup time")
        # From the engine's process start to its first health: longer than what the probe allows, the case
        # StartupSlowerThanProbe compares.
        assert 1.5 <= startup < 10.0


async def test_nvml_pids_are_attributed_to_their_pod_through_cgroups(tmp_path: Path) -> None:
    uid = "33333333-3333-4333-8333-333333333333"
    for pid, cgroup in ((4242, f"0::/kubepods/pod{uid}/{'e' * 64}"), (4343, "0::/system.slice/other.service")):
        (tmp_path / "proc" / str(pid)).mkdir(parents=True)
        (tmp_path / "proc" / str(pid) / "cgroup").write_text(cgroup + "\n")
    # The engine holds its 0.90 reservation (72 GiB); another process's 6 GiB and 0.5 GiB no process owns fill
    # 6.5 of the 8 GiB it leaves: 98 % of the GPU, 81 % of its headroom.
    processes = [FakeProcess(4242, 72 * GIB), FakeProcess(4343, 6 * GIB)]
    nvml = FakeNvml([FakeGpu(0, used_bytes=int(78.5 * GIB), processes=processes), FakeGpu(1, used_bytes=1 * GIB)])
    async with engine_up() as engine:
        port = engine.server.port
        trend = {"interval_seconds": 0.05, "short_window_seconds": 0.5, "long_window_seconds": 2.0}
        async with Cluster(tmp_path, nvml=nvml, trend=trend) as k8s:
            await k8s.api.put("pods", objects.pod("vllm-0", "127.0.0.2", port, uid=uid))
            await wait_for(lambda: k8s.value("oomguard_target_process_gpu_memory_bytes", **POD), "its own GPU memory")
            assert await k8s.value("oomguard_target_process_gpu_memory_bytes", **POD) == 72 * GIB
            assert await k8s.value("oomguard_target_gpu_info", node=objects.NODE, gpu="0", **POD) == 1.0
            assert await k8s.value("oomguard_target_gpu_info", node=objects.NODE, gpu="1", **POD) is None
            # The trend sampler finds the pod's GPUs the same way and judges them in the headroom the reservation
            # leaves: steady at 81 % of it, where against the total (98 %) it would read saturated.
            await wait_for(
                lambda: k8s.value("oomguard_target_memory_trend_state", memory="gpu", state="steady", **POD),
                "the pod's GPU memory trend",
            )
            assert await k8s.value("oomguard_target_memory_trend_state", memory="gpu", state="saturated", **POD) == 0


async def test_rbac_refused_is_a_source_error_not_a_crash(tmp_path: Path) -> None:
    async with Cluster(tmp_path) as k8s:
        k8s.api.forbidden = True
        await k8s.runtime.stop()  # restart the runtime against a refusing API
        await k8s.runtime.start()
        await wait_for(
            lambda: equals(k8s.value("oomguard_source_success", source="kubernetes"), 0.0), "success 0 for kubernetes"
        )
        assert await k8s.value("oomguard_build_info", version=_version(), python_version=_python()) == 1.0
        k8s.api.forbidden = False  # the ClusterRole fixed: it recovers by itself
        await k8s.api.put("pods", objects.pod("vllm-0", "127.0.0.2", 8000))
        await wait_for(lambda: k8s.targets() == [NAME], "the pod once allowed", timeout=15)
        await wait_for(lambda: equals(k8s.value("oomguard_source_success", source="kubernetes"), 1.0), "success 1")


async def test_the_api_away_for_a_while_then_back(tmp_path: Path) -> None:
    async with engine_up() as engine, Cluster(tmp_path) as k8s:
        port = engine.server.port
        await k8s.api.put("pods", objects.pod("vllm-0", "127.0.0.2", port))
        await wait_for(lambda: k8s.value("oomguard_target_up", **POD), "the target up")
        await k8s.server.stop()  # unreachable: connections refused
        await wait_for(lambda: equals(k8s.value("oomguard_source_success", source="kubernetes"), 0.0), "success 0")
        # Meanwhile the known target is still scraped, and the API's state moves on.
        assert await k8s.value("oomguard_target_up", **POD) == 1.0
        await k8s.api.delete("pods", "llm", "vllm-0")
        await k8s.api.put("pods", objects.pod("vllm-1", "127.0.0.2", port))
        k8s.api.compact()  # and its old resourceVersions are gone
        await k8s.server.start()
        await wait_for(lambda: k8s.targets() == ["llm/vllm-1"], "the relist's targets", timeout=15)
        await wait_for(lambda: equals(k8s.value("oomguard_source_success", source="kubernetes"), 1.0), "success 1")


async def test_410_gone_relists_and_bookmarks_move_the_version(tmp_path: Path) -> None:
    async with Cluster(tmp_path) as k8s:
        await k8s.api.put("pods", objects.pod("vllm-0", "127.0.0.2", 8000))
        await wait_for(lambda: k8s.targets() == [NAME], "the first pod")
        pods = next(w for w in k8s.runtime.discovery.watches if w.path.endswith("/pods"))
        lists = pods.lists
        await k8s.api.bookmark("pods")
        await k8s.api.put("pods", objects.pod("vllm-1", "127.0.0.3", 8000))
        await wait_for(lambda: k8s.targets() == [NAME, "llm/vllm-1"], "a pod after a bookmark")
        assert pods.lists == lists  # a bookmark is no reason to list again

        await k8s.api.error_410("pods")  # an ERROR event, code 410: list again
        await wait_for(lambda: pods.lists == lists + 1, "a relist after the ERROR event")
        k8s.api.gone_http_next = True  # the next watch answered HTTP 410: list again
        await k8s.api.put("pods", objects.pod("vllm-2", "127.0.0.4", 8000))
        await wait_for(lambda: "llm/vllm-2" in k8s.targets(), "the pod added meanwhile")
        k8s.api.gone_http_next = True
        await k8s.api.delete("pods", "llm", "vllm-0")
        await wait_for(lambda: NAME not in k8s.targets(), "the pod deleted")
        watched = [r for r in k8s.api.requests if "/pods" in r and "watch=1" in r]
        assert all("allowWatchBookmarks=true" in r and "resourceVersion=" in r for r in watched)
        assert all("fieldSelector=spec.nodeName%3Dgpu-node-1" in r for r in k8s.api.requests if "/pods" in r)


def _version() -> str:
    from oomguard import __version__

    return __version__


def _python() -> str:
    import platform

    return platform.python_version()


async def test_a_loading_pod_is_judged_above_the_reservation_its_args_tell(tmp_path: Path) -> None:
    """Warm-up: the pod's engine allocated its KV cache (NVML: 95.6 %) and refuses /metrics while it warms up; its
    container's args tell 0.95, so GPU 0 is judged on the headroom above it, not on its total."""
    port = free_port("127.0.0.2")  # nothing listens: the engine is loading
    uid = "44444444-4444-4444-8444-444444444444"
    (tmp_path / "proc" / "4242").mkdir(parents=True)
    (tmp_path / "proc" / "4242" / "cgroup").write_text(f"0::/kubepods/pod{uid}/{'e' * 64}\n")
    held = [FakeProcess(4242, int(0.95 * 80 * GIB)), FakeProcess(4343, GIB // 2)]
    nvml = FakeNvml([FakeGpu(0, used_bytes=sum(p.used_bytes or 0 for p in held), processes=held)])
    async with Cluster(tmp_path, nvml=nvml) as k8s:
        args = ["--model", "m", "--gpu-memory-utilization", "0.95"]
        await k8s.api.put("pods", objects.pod("vllm-0", "127.0.0.2", port, uid=uid, args=args))
        await wait_for(
            lambda: k8s.value("oomguard_gpu_memory_headroom_used_ratio", node=objects.NODE, gpu="0"), "GPU 0 joined"
        )
        assert await k8s.value("oomguard_target_state", state="loading", **POD) == 1.0
        assert (
            await k8s.value("oomguard_gpu_memory_engine_reserved_bytes", node=objects.NODE, gpu="0") == 0.95 * 80 * GIB
        )
        assert (
            await k8s.value("oomguard_gpu_memory_headroom_used_ratio", node=objects.NODE, gpu="0") == 0.125
        )  # 0.5 of 4 GiB
        setting = {"setting": "gpu_memory_utilization", "origin": "flag"}
        assert await k8s.value("oomguard_engine_setting", engine="vllm", **setting, **POD) == 0.95
