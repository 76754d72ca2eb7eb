"""Pod and Event objects as the API serves them (core/v1), for the API's stand-in (kubernetes_api.py): they validate
against the official schema (tests/sources/kubernetes/test_objects.py)."""

from __future__ import annotations

import uuid
from typing import Any

NODE = "gpu-node-1"
Obj = dict[str, Any]


def pod(
    name: str,
    ip: str | None,
    port: int,
    *,
    namespace: str = "llm",
    node: str = NODE,
    uid: str | None = None,
    labels: dict[str, str] | None = None,
    container: str = "vllm",
    restart_count: int = 0,
    last_terminated: Obj | None = None,
    startup_probe: Obj | None = None,
    liveness_probe: Obj | None = None,
    phase: str = "Running",
    container_id: str = "containerd://" + "a" * 64,
    args: list[str] | None = None,
) -> Obj:
    spec_container: Obj = {
        "name": container,
        "image": "vllm/vllm-openai:v0.11.0",
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
    }
    if args is not None:  # the image's entrypoint (vLLM's OpenAI server) runs them
        spec_container["args"] = args
    if startup_probe is not None:
        spec_container["startupProbe"] = startup_probe
    if liveness_probe is not None:
        spec_container["livenessProbe"] = liveness_probe
    status: Obj = {
        "phase": phase,
        "hostIP": "10.0.0.1",
        "containerStatuses": [
            {
                "name": container,
                "image": "vllm/vllm-openai:v0.11.0",
                "imageID": "docker.io/vllm/vllm-openai@sha256:" + "b" * 64,
                "containerID": container_id,
                "ready": False,
                "started": True,
                "restartCount": restart_count,
                "state": {"running": {"startedAt": "2026-12-03T12:00:00Z"}},
                "lastState": {"terminated": last_terminated} if last_terminated else {},
            }
        ],
    }
    if ip is not None:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or str(uuid.uuid4()),
            "labels": labels if labels is not None else {"app.kubernetes.io/name": "vllm"},
            "creationTimestamp": "2026-12-03T11:59:00Z",
        },
        "spec": {"nodeName": node, "containers": [spec_container], "restartPolicy": "Always"},
        "status": status,
    }


def terminated(reason: str, exit_code: int, finished_at: str, container_id: str = "c" * 64) -> Obj:
    return {
        "reason": reason,
        "exitCode": exit_code,
        "startedAt": "2026-12-03T12:00:00Z",
        "finishedAt": finished_at,
        "containerID": f"containerd://{container_id}",
    }


def event(target: Obj, reason: str, message: str, *, count: int = 1, name: str | None = None) -> Obj:
    meta = target["metadata"]
    container = target["spec"]["containers"][0]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": name or f"{meta['name']}.{uuid.uuid4().hex[:16]}",
            "namespace": meta["namespace"],
            "uid": str(uuid.uuid4()),
        },
        "involvedObject": {
            "kind": "Pod",
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta["uid"],
            "apiVersion": "v1",
            "fieldPath": f"spec.containers{{{container}}}",
        },
        "reason": reason,
        "message": message,
        "source": {"component": "kubelet", "host": NODE},
        "firstTimestamp": "2026-12-03T12:00:10Z",
        "lastTimestamp": "2026-12-03T12:00:30Z",
        "count": count,
        "type": "Warning" if reason == "Unhealthy" else "Normal",
        "reportingComponent": "kubelet",
        "reportingInstance": NODE,
    }
