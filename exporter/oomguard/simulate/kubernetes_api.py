"""A local stand-in for the Kubernetes API server: the list and watch protocol of pods and events, for the tests
(tests/sources/kubernetes/) and the cluster bench (bench/bench_cluster.py), with objects from kubernetes_objects.py.

Lists (`GET /api/v1/pods`, `/api/v1/namespaces/NS/pods`, the same for events) answer a List with its
resourceVersion; `?watch=1` streams newline-delimited JSON events (ADDED, MODIFIED, DELETED, BOOKMARK,
ERROR) from the given resourceVersion, chunked, until `timeoutSeconds` or the test ends it. `pods/log`
serves each container's lines with the kubelet's timestamps (`timestamps=true`, RFC 3339 with nanoseconds),
following (`follow=true`) until the container ends or the test drops the stream; `previous=true` the container
before the current one (400 when there is none). `sinceTime` and `sinceSeconds` filter as the kubelet does
(pkg/kubelet/kuberuntime/logs/logs.go: NewLogOptions, logWriter.write): one instant, fixed when the request
comes (`sinceSeconds` back from the node's clock, which `node_offset` sets apart from this machine's; `sinceTime`
as the API passes it on, in whole seconds), and every line whose own stamp (the runtime's, by the node's clock) is
before it is skipped, wherever it is in the file and in a followed stream too: a line written after the node's
clock stepped back is skipped when its stamp is before the instant. Both at once, or `sinceSeconds` under 1, are
refused (422) as the API server's validation does (ValidatePodLogOptions). Field
selectors (`a.b=c`, `a.b!=c`, comma-separated) and label selectors (`k=v`) are matched by equality, as the
API does for these. Faults on demand: 403 for everything, 410 Gone (as the HTTP status or as an
ERROR event), a watch closed early.
"""

from __future__ import annotations

import asyncio
import calendar
import copy
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Obj = dict[str, Any]


def _field(obj: Obj, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part, {}) if isinstance(value, dict) else {}
    if path == "source":  # the events' selector `source` is source.component
        value = (obj.get("source") or {}).get("component", "")
    return "" if value == {} else str(value)


def _matches(obj: Obj, fields: str, labels: str) -> bool:
    for term in filter(None, fields.split(",")):
        key, _, want = term.partition("=")
        if key.endswith("!"):  # `a.b!=c`
            if _field(obj, key[:-1]) == want:
                return False
        elif _field(obj, key) != want:
            return False
    have = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, labels.split(",")):
        key, _, want = term.partition("=")
        if have.get(key) != want:
            return False
    return True


@dataclass
class StandIn:
    kinds: dict[str, str] = field(default_factory=lambda: {"pods": "Pod", "events": "Event", "configmaps": "ConfigMap"})
    objects: dict[str, dict[tuple[str, str], Obj]] = field(
        default_factory=lambda: {"pods": {}, "events": {}, "configmaps": {}}
    )
    history: dict[str, list[tuple[int, str, Obj]]] = field(
        default_factory=lambda: {"pods": [], "events": [], "configmaps": []}
    )
    patches: list[tuple[str, Obj]] = field(default_factory=list)  # (path, body) of each PATCH answered
    version: int = 100
    oldest_kept: int = 0  # a watch from a resourceVersion older than this is Gone
    forbidden: bool = False
    gone_http_next: bool = False  # the next watch answers HTTP 410
    requests: list[str] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)  # each request's Authorization header
    _changed: asyncio.Condition | None = None
    # pods/log: (namespace, pod, container) -> its containers, oldest first, each [ID, lines (timestamp, text), ended]
    logs: dict[tuple[str, str, str], list[list[Any]]] = field(default_factory=dict)
    log_requests: list[dict[str, str]] = field(default_factory=list)
    _log_epoch: int = 0  # raised by drop_log_streams: the open streams end
    node_offset: float = 0.0  # the node's clock against this machine's: its log stamps and `sinceSeconds`

    def node_clock(self) -> float:
        return time.time() + self.node_offset

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{namespace}/pods/{name}/log", self._log)
        for resource in self.kinds:
            app.router.add_get(f"/api/v1/{resource}", self._handler(resource))
            app.router.add_get(f"/api/v1/namespaces/{{namespace}}/{resource}", self._handler(resource))
        app.router.add_get("/api/v1/namespaces/{namespace}/configmaps/{name}", self._get_configmap)
        app.router.add_patch("/api/v1/namespaces/{namespace}/configmaps/{name}", self._patch_configmap)
        return app

    # -- the test's side ------------------------------------------------------------------------
    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def put(self, resource: str, obj: Obj) -> Obj:
        """Create or replace an object (ADDED or MODIFIED), with a new resourceVersion."""
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        kind = "MODIFIED" if key in self.objects[resource] else "ADDED"
        self.version += 1
        meta["resourceVersion"] = str(self.version)
        self.objects[resource][key] = obj
        await self._append(resource, kind, obj)
        return obj

    async def delete(self, resource: str, namespace: str, name: str) -> None:
        obj = self.objects[resource].pop((namespace, name))
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        await self._append(resource, "DELETED", obj)

    async def bookmark(self, resource: str) -> None:
        self.version += 1
        obj = {"kind": self.kinds[resource], "apiVersion": "v1", "metadata": {"resourceVersion": str(self.version)}}
        await self._append(resource, "BOOKMARK", obj)

    async def error_410(self, resource: str) -> None:
        """An ERROR event in the open watches, as etcd's compaction makes: `too old resource version`. A watch
        not open yet (a client between its list and its watch) is answered HTTP 410 when it asks from before."""
        self.version += 1
        self.oldest_kept = self.version
        status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410,
                  "message": "too old resource version"}  # fmt: skip
        self.history[resource].append((self.version, "ERROR", status))
        async with self._condition():
            self._condition().notify_all()

    def compact(self) -> None:
        """Forget the history: a watch from an older version is answered HTTP 410."""
        self.oldest_kept = self.version

    async def _append(self, resource: str, kind: str, obj: Obj) -> None:
        self.history[resource].append((self.version, kind, obj))
        async with self._condition():
            self._condition().notify_all()

    # -- pods/log: the test's side ------------------------------------------------------------------
    async def log(self, namespace: str, pod: str, container: str, text: str, *, container_id: str = "") -> None:
        """A line written by the container's current process (a new container when `container_id` is new)."""
        containers = self.logs.setdefault((namespace, pod, container), [])
        if not containers or (container_id and containers[-1][0] != container_id):
            containers.append([container_id, [], False])
        stamp = int(self.node_clock() * 1e9)
        seconds, nanos = divmod(stamp, 1_000_000_000)
        at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{nanos:09d}Z"
        containers[-1][1].append((at, text))
        await self._notify()

    def new_pod(self, namespace: str, pod: str) -> None:
        """The pod replaced under its name: the new pod's containers have logs of their own, no previous one."""
        for key in [k for k in self.logs if k[:2] == (namespace, pod)]:
            del self.logs[key]

    async def end_container(self, namespace: str, pod: str, container: str) -> None:
        """The current container stopped: its follow streams end after its last line."""
        self.logs[(namespace, pod, container)][-1][2] = True
        await self._notify()

    async def drop_log_streams(self) -> None:
        """Every open log stream ends now, as a dropped connection would."""
        self._log_epoch += 1
        await self._notify()

    async def _notify(self) -> None:
        async with self._condition():
            self._condition().notify_all()

    # -- the API's side -------------------------------------------------------------------------
    async def _log(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request.path_qs)
        self.log_requests.append(dict(request.query))
        if self.forbidden:
            return _status(403, "Forbidden", 'pods "x" is forbidden: cannot get resource "pods/log"')
        key = (request.match_info["namespace"], request.match_info["name"], request.query.get("container", ""))
        containers = self.logs.get(key, [])
        previous = request.query.get("previous") == "true"
        if len(containers) < (2 if previous else 1):
            which = "previous terminated" if previous else "running"
            return _status(400, "BadRequest", f'container "{key[2]}" in pod "{key[1]}": no {which} container')
        container = containers[-2] if previous else containers[-1]
        since_time, since_seconds = request.query.get("sinceTime"), request.query.get("sinceSeconds")
        if since_time is not None and since_seconds is not None:
            return _status(
                422, "Invalid", "PodLogOptions: at most one of `sinceTime` or `sinceSeconds` may be specified"
            )
        since = 0  # the instant, in nanoseconds: a line stamped before it is skipped
        if since_seconds is not None:
            if not since_seconds.isdigit() or int(since_seconds) < 1:
                return _status(422, "Invalid", f"PodLogOptions: sinceSeconds: Invalid value: {since_seconds}")
            since = int(self.node_clock() * 1e9) - int(since_seconds) * 1_000_000_000
        elif since_time is not None:
            since = _rfc3339_nanos(since_time) // 1_000_000_000 * 1_000_000_000  # passed on in whole seconds
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        follow, epoch, position = request.query.get("follow") == "true" and not previous, self._log_epoch, 0
        while True:
            lines = container[1]
            while position < len(lines):
                at, text = lines[position]
                position += 1
                if _rfc3339_nanos(at) >= since:
                    stamp = f"{at} " if request.query.get("timestamps") == "true" else ""
                    await response.write(f"{stamp}{text}\n".encode())
            if not follow or container[2] or self._log_epoch != epoch:
                return response
            async with self._condition():
                if position == len(container[1]) and not container[2] and self._log_epoch == epoch:
                    await self._condition().wait()

    # -- a ConfigMap: get, and a JSON merge patch of its data (RFC 7386), as the API applies one --------------------
    async def _get_configmap(self, request: web.Request) -> web.Response:
        self.requests.append(request.path_qs)
        if self.forbidden:
            return _status(403, "Forbidden", 'configmaps is forbidden: cannot get resource "configmaps"')
        obj = self.objects["configmaps"].get((request.match_info["namespace"], request.match_info["name"]))
        if obj is None:
            return _status(404, "NotFound", f'configmaps "{request.match_info["name"]}" not found')
        return web.json_response(obj)

    async def _patch_configmap(self, request: web.Request) -> web.Response:
        self.requests.append(request.path_qs)
        if self.forbidden:
            return _status(403, "Forbidden", 'configmaps is forbidden: cannot patch resource "configmaps"')
        if request.content_type != "application/merge-patch+json":
            return _status(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: "
                           f"{request.content_type}")  # fmt: skip
        key = (request.match_info["namespace"], request.match_info["name"])
        if key not in self.objects["configmaps"]:
            return _status(404, "NotFound", f'configmaps "{key[1]}" not found')
        body = json.loads(await request.read())
        self.patches.append((request.path, body))
        obj = copy.deepcopy(self.objects["configmaps"][key])
        for section in ("data", "binaryData"):
            for name, value in (body.get(section) or {}).items():
                if value is None:
                    obj.setdefault(section, {}).pop(name, None)
                else:
                    obj.setdefault(section, {})[name] = value
        size = sum(len(k) + len(v) for section in ("data", "binaryData") for k, v in (obj.get(section) or {}).items())
        if size > 1024 * 1024:  # the API server's limit of a ConfigMap
            return _status(422, "Invalid", f'ConfigMap "{key[1]}" is invalid: []: Too long: must have at most '
                           "1048576 bytes")  # fmt: skip
        return web.json_response(await self.put("configmaps", obj))

    def _handler(self, resource: str) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            self.requests.append(request.path_qs)
            self.authorizations.append(request.headers.get("Authorization", ""))
            if self.forbidden:
                who = "system:serviceaccount:oomguard:oomguard"
                message = f'{resource} is forbidden: User "{who}" cannot list resource "{resource}" in API group ""'
                return _status(403, "Forbidden", message)
            namespace = request.match_info.get("namespace")
            fields = request.query.get("fieldSelector", "")
            labels = request.query.get("labelSelector", "")

            def wanted(obj: Obj) -> bool:
                in_ns = namespace is None or obj["metadata"].get("namespace") == namespace
                return in_ns and _matches(obj, fields, labels)

            if request.query.get("watch") not in ("1", "true"):
                items = [o for o in self.objects[resource].values() if wanted(o)]
                meta = {"resourceVersion": str(self.version)}
                kind = f"{self.kinds[resource]}List"
                return web.json_response({"kind": kind, "apiVersion": "v1", "metadata": meta, "items": items})
            since = int(request.query.get("resourceVersion") or self.version)
            if self.gone_http_next or since < self.oldest_kept:
                self.gone_http_next = False
                return _status(410, "Expired", "too old resource version")
            return await self._watch(request, resource, since, wanted, float(request.query.get("timeoutSeconds", 60)))

        return handle

    async def _watch(
        self, request: web.Request, resource: str, since: int, wanted: Any, timeout: float
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        history = self.history[resource]
        position = next((i for i, (version, kind, _) in enumerate(history) if version > since), len(history))
        while True:
            while position < len(history):
                _, kind, obj = history[position]
                position += 1
                if kind in ("BOOKMARK", "ERROR") or wanted(obj):
                    await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
                if kind == "ERROR":
                    return response  # the API ends a watch after its ERROR
            left = end - loop.time()
            if left <= 0:
                return response
            async with self._condition():
                if position == len(history):
                    try:
                        await asyncio.wait_for(self._condition().wait(), left)
                    except TimeoutError:
                        return response


def _rfc3339_nanos(text: str) -> int:
    """`2026-12-05T12:00:01.123456789Z` (or without a fraction) as nanoseconds since the epoch."""
    head, _, fraction = text.rstrip("Z").partition(".")
    seconds = calendar.timegm(time.strptime(head, "%Y-%m-%dT%H:%M:%S"))
    return seconds * 1_000_000_000 + int(fraction.ljust(9, "0")[:9] or 0)


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}  # fmt: skip
    return web.json_response(body, status=code)
