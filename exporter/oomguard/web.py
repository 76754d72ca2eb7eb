"""The HTTP face: /metrics, /-/healthy, /-/ready and a landing page."""

from __future__ import annotations

import asyncio
import gc
import html
import logging
from collections.abc import AsyncIterator, Callable

import aiohttp
from aiohttp import web

from oomguard import __version__
from oomguard.collector import Collection
from oomguard.config import Config
from oomguard.metrics import render
from oomguard.sources.nvml import NvmlSource
from oomguard.trend.sampler import Sampler

log = logging.getLogger(__name__)

COLLECTION = web.AppKey("collection", Collection)
CONFIG = web.AppKey("config", Config)
# The classic text format: every Prometheus 2.x understands it (all our names are plain ASCII).
EXPOSITION_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def make_app(config: Config, nvml_factory: Callable[[], NvmlSource | None]) -> web.Application:
    app = web.Application()
    app[CONFIG] = config

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        # One client session for every target, for the life of the app.
        async with aiohttp.ClientSession(
            headers={"User-Agent": f"oomguard/{__version__}", "Accept": "text/plain"},
            connector=aiohttp.TCPConnector(limit=64, limit_per_host=4),
        ) as session:
            collection = app[COLLECTION] = Collection(config, nvml_factory(), session)
            # What exists at start lives as long as the app: keep it out of the garbage collector's
            # full passes, which otherwise stall a scrape for tens of milliseconds now and then.
            gc.collect()
            gc.freeze()
            # A first collection at start, so /-/ready means "has data" and the
            # first real scrape finds NVML initialised and targets' states known.
            background = [asyncio.ensure_future(collection.snapshot())]
            if collection.tracker is not None:
                background.append(
                    asyncio.ensure_future(Sampler(collection.tracker, collection.trend_observations).run())
                )
            background.append(asyncio.ensure_future(collection.follow_events()))
            if collection.xid is not None:
                collection.xid.start()
            yield
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await asyncio.to_thread(collection.close)

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/", landing)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/-/healthy", healthy)
    app.router.add_get("/-/ready", ready)
    return app


async def metrics(request: web.Request) -> web.Response:
    snapshot = await request.app[COLLECTION].snapshot()
    return web.Response(body=render(snapshot), headers={"Content-Type": EXPOSITION_CONTENT_TYPE})


async def healthy(request: web.Request) -> web.Response:
    return web.Response(text="OK\n")


async def ready(request: web.Request) -> web.Response:
    if request.app[COLLECTION].last is None:
        return web.Response(status=503, text="not ready: first collection still running\n")
    return web.Response(text="OK\n")


async def landing(request: web.Request) -> web.Response:
    config = request.app[CONFIG]
    last = request.app[COLLECTION].last
    states = {t.name: t.state for t in last.targets} if last else {}
    rows = (
        "".join(
            f"<tr><td>{html.escape(t.label)}</td><td>{html.escape(t.engine)}</td>"
            f"<td>{html.escape(t.url)}</td><td>{html.escape(states.get(t.label, 'not scraped yet'))}</td></tr>"
            for t in config.targets
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
