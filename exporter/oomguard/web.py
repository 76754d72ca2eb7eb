"""The HTTP face: /metrics, /-/healthy, /-/ready and a landing page. It routes, and starts and stops the runtime."""

from __future__ import annotations

import html
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from oomguard import __version__
from oomguard.collection import Collection
from oomguard.exposition import render
from oomguard.runtime import Runtime

log = logging.getLogger(__name__)

RUNTIME = web.AppKey("runtime", Runtime)
# The classic text format: every Prometheus 2.x understands it (all our names are plain ASCII).
EXPOSITION_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def make_app(runtime: Runtime) -> web.Application:
    app = web.Application()
    app[RUNTIME] = runtime

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await runtime.start()
        yield
        await runtime.stop()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/", landing)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/-/healthy", healthy)
    app.router.add_get("/-/ready", ready)
    return app


def _collection(request: web.Request) -> Collection:
    collection = request.app[RUNTIME].collection
    assert collection is not None, "routes are served only after the runtime started"
    return collection


async def metrics(request: web.Request) -> web.Response:
    snapshot = await _collection(request).snapshot()
    return web.Response(body=render(snapshot), headers={"Content-Type": EXPOSITION_CONTENT_TYPE})


async def healthy(request: web.Request) -> web.Response:
    return web.Response(text="OK\n")


async def ready(request: web.Request) -> web.Response:
    if _collection(request).last is None:
        return web.Response(status=503, text="not ready: first collection still running\n")
    return web.Response(text="OK\n")


async def landing(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    last = _collection(request).last
    states = {t.name: t.state for t in last.targets} if last else {}
    rows = (
        "".join(
            f"<tr><td>{html.escape(t.label)}</td><td>{html.escape(t.engine)}</td>"
            f"<td>{html.escape(t.url)}</td><td>{html.escape(states.get(t.label, 'not scraped yet'))}</td></tr>"
            for t in runtime.config.targets
        )
        or '<tr><td colspan="4">no targets configured</td></tr>'
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>oomguard</title></head>
<body>
<h1>oomguard {html.escape(__version__)}</h1>
<p>GPU memory and inference-engine exporter: page before the OOM, not after.</p>
<ul><li><a href="/metrics">/metrics</a></li><li><a href="/-/healthy">/-/healthy</a></li><li><a href="/-/ready">/-/ready</a></li></ul>
<h2>Targets</h2>
<table border="1" cellpadding="4"><tr><th>target</th><th>engine</th><th>url</th><th>state</th></tr>{rows}</table>
</body></html>
"""
    return web.Response(text=page, content_type="text/html")
