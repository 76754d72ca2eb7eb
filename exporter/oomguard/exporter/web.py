"""The HTTP face: /metrics, /-/healthy, /-/ready, and the status page at / (and /status.json). It routes, and starts and stops the runtime.

With a web configuration (--web.config.file) every path, health checks included, is behind
its basic auth, and every response carries its headers, as in the exporter toolkit.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from oomguard.exporter.collection import Collection
from oomguard.exporter.exposition import render
from oomguard.exporter.exposition.health import render_web_config
from oomguard.exporter.model import Snapshot, TrendKey
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.status import page as status_page
from oomguard.exporter.status.view import StatusView, build
from oomguard.exporter.web_config import WebConfigState
from oomguard.exporter.web_config.auth import AuthBusy
from oomguard.exporter.web_config.server import COUNTERS, SERVER_HEADER, WebCounters

log = logging.getLogger(__name__)

RUNTIME = web.AppKey("runtime", Runtime)
WEB_CONFIG = web.AppKey("web_config", WebConfigState)
# The classic text format: every Prometheus 2.x understands it (all our names are plain ASCII).
EXPOSITION_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def make_app(runtime: Runtime, web_config: WebConfigState | None = None) -> web.Application:
    counters = WebCounters()
    app = web.Application(middlewares=[_guard(web_config, counters)] if web_config else [])
    app[RUNTIME] = runtime
    app[RENDERED] = _Rendered()
    app[STATUS] = _Status()
    app[COUNTERS] = counters
    app.on_response_prepare.append(_server_header)
    if web_config is not None:
        app[WEB_CONFIG] = web_config

        async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
            # A signal, not the middleware: 401s and 404s get the headers too.
            response.headers.update(web_config.current.headers)

        app.on_response_prepare.append(add_headers)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await runtime.start()
        yield
        await runtime.stop()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/", landing)
    app.router.add_get("/status.json", status_json)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/-/healthy", healthy)
    app.router.add_get("/-/ready", ready)
    return app


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _server_header(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = SERVER_HEADER  # aiohttp's default names Python's and its own versions


def _guard(
    web_config: WebConfigState, counters: WebCounters
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        settings = web_config.current  # read per request: a reload applies to the next one
        # rate_limit before basic auth, as in the toolkit: a refused request costs no bcrypt.
        if settings.limiter is not None and not settings.limiter.allow():
            counters.refuse("rate_limit")
            raise web.HTTPTooManyRequests(headers={"Retry-After": "1"}, text="Too Many Requests\n")
        if settings.auth is not None:
            try:
                allowed = await settings.auth.check(request.headers.get("Authorization"), request.remote or "")
            except AuthBusy:
                counters.refuse("busy")
                raise web.HTTPTooManyRequests(headers={"Retry-After": "1"}, text="Too Many Requests\n") from None
            if not allowed:
                counters.refuse("unauthorized")
                raise web.HTTPUnauthorized(headers={"WWW-Authenticate": "Basic"}, text="Unauthorized\n")
        return await handler(request)

    return guard


def _collection(request: web.Request) -> Collection:
    collection = request.app[RUNTIME].collection
    assert collection is not None, "routes are served only after the runtime started"
    return collection


class _Rendered:
    """The last snapshot's text: concurrent scrapes share the collection in flight, and so its rendering
    (200 Prometheis at once rendered the same snapshot 200 times, one after the other, on the loop).

    Rendered in a thread: a cluster's answer (5.5 MB at 500 pods) takes tens of milliseconds, during which the loop
    would answer nothing (health probes, other scrapes, the log streams). A snapshot is never changed once made
    (its dicts are copies or views the poller replaces whole), so the thread reads it safely."""

    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None
        self.body = b""
        self._lock = asyncio.Lock()  # one rendering at a time: the scrapes that wait then share it

    async def of(self, snapshot: Snapshot) -> bytes:
        async with self._lock:
            if snapshot is not self.snapshot:
                self.body = await asyncio.to_thread(render, snapshot)
                self.snapshot = snapshot
            return self.body


RENDERED = web.AppKey("rendered", _Rendered)


async def metrics(request: web.Request) -> web.Response:
    snapshot = await _collection(request).snapshot()
    body = await request.app[RENDERED].of(snapshot)
    web_config = request.app.get(WEB_CONFIG)
    counters = request.app[COUNTERS]
    if web_config is not None or counters.listening:
        body += render_web_config(
            web_config.last_reload_successful if web_config else None,
            web_config.last_success_timestamp if web_config else None,
            counters.requests_refused if web_config else None,
            counters.connections_refused if counters.listening else None,
        )
    return web.Response(body=body, headers={"Content-Type": EXPOSITION_CONTENT_TYPE})


async def healthy(request: web.Request) -> web.Response:
    return web.Response(text="OK\n")


async def ready(request: web.Request) -> web.Response:
    if _collection(request).last is None:
        return web.Response(status=503, text="not ready: first collection still running\n")
    return web.Response(text="OK\n")


# The view is read again at each look; and what it carries (names an engine or a pod chose) is read as its declared
# type only, never sniffed as another (a browser that took the JSON for HTML).
STATUS_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


async def landing(request: web.Request) -> web.Response:
    """The status page (status/): the joined view of a collection, as a scrape sees it."""
    page = await _status(request, _Status.PAGE)
    headers = {"Content-Security-Policy": status_page.CONTENT_SECURITY_POLICY, **STATUS_HEADERS}
    return web.Response(body=page, content_type="text/html", charset="utf-8", headers=headers)


async def status_json(request: web.Request) -> web.Response:
    """The same view as JSON: what `oomguard top` and scripts read."""
    document = await _status(request, _Status.JSON)
    return web.Response(body=document, content_type="application/json", charset="utf-8", headers=STATUS_HEADERS)


async def _status(request: web.Request, form: str) -> bytes:
    # A collection of its own, as a scrape's (shared with those in flight): the last one may be a scrape ago.
    snapshot = await _collection(request).snapshot()
    return await request.app[STATUS].of(snapshot, request.app[RUNTIME], form)


class _Status:
    """The last snapshot's status view and its two renderings, the page and the JSON, as `_Rendered` keeps the
    answer's text: the looks at `/` and `/status.json` that share a collection share its view, built once, from the
    snapshot (never from the exposition text), and each rendering made once, the first time it is asked for; those
    that arrive while one is being made wait for it and share it (40 looks at once rendered the page 40 times).

    In a thread, off the event loop (a cluster's snapshot holds thousands of GPUs and targets; the JSON was dumped on
    the loop at each look before). Nothing of a rendering depends on the request: the page's "now" is the view's
    `taken_at` (the snapshot's), no query parameter is read, and the user basic auth let in is not shown."""

    PAGE = "page"
    JSON = "json"

    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None
        self.view: StatusView | None = None
        self.bodies: dict[str, bytes] = {}  # PAGE, JSON -> the rendering of `view`, once made
        self._lock = asyncio.Lock()  # one build at a time: the looks that wait then share it

    async def of(self, snapshot: Snapshot, runtime: Runtime, form: str) -> bytes:
        async with self._lock:
            if snapshot is not self.snapshot or self.view is None:
                view, body = await asyncio.to_thread(_view_and_body, snapshot, runtime, form)
                self.snapshot, self.view, self.bodies = snapshot, view, {form: body}
            elif form not in self.bodies:
                self.bodies[form] = await asyncio.to_thread(_body, self.view, form)
            return self.bodies[form]


STATUS = web.AppKey("status", _Status)


def _view_and_body(snapshot: Snapshot, runtime: Runtime, form: str) -> tuple[StatusView, bytes]:
    """(in a thread) One snapshot's view and the rendering asked for, in one trip to the thread."""
    view = _view(snapshot, runtime)
    return view, _body(view, form)


def _body(view: StatusView, form: str) -> bytes:
    """(in a thread) The bytes a look gets: the page as jinja2 renders it, or the view as JSON, every non-ASCII
    character escaped (`json.dumps`' default, as `web.json_response` wrote it when it was made at each look)."""
    if form == _Status.PAGE:
        return status_page.render(view).encode("utf-8")
    return json.dumps(view.to_json()).encode("utf-8")


def _view(snapshot: Snapshot, runtime: Runtime) -> StatusView:
    """(in a thread) The view, its pages judged with the runtime's thresholds on the runtime's clock (a simulation's
    is faster: its time to full and its events' ages say fewer of its minutes), with each GPU's sparkline from its
    trend's samples (the trend's clock is real time: the simulation's minutes are shorter)."""
    history: dict[tuple[str, str], list[float]] = {}
    tracker = runtime.tracker
    if tracker is not None:
        seconds = runtime.clock.real(status_page.SPARK_MINUTES * 60)
        for key in snapshot.gpus.gpus if snapshot.gpus is not None else ():
            history[key.key] = tracker.recent(TrendKey.of_gpu(key.key), seconds)
    return build(snapshot, history=history, thresholds=runtime.thresholds, clock=runtime.clock)
