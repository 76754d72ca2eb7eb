"""Small HTTP servers that behave like engines, well and badly, for the exporter to scrape."""

from __future__ import annotations

import asyncio
import contextlib
import os

from aiohttp import web
from support import vllm_body


class Zoo:
    """One aiohttp app, one path prefix per behaviour: /good, /slow, /hang, /500, /huge, /garbage, /html, /badvalue,
    /slowloris, /reset."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}  # /metrics requests by behaviour
        self.health_requests: dict[str, int] = {}
        self.good_body = vllm_body("vllm-0.32.0-cpu-under-load.txt")
        self.hang = asyncio.Event()  # set() to release hanging handlers at teardown
        self.health_status: dict[str, int] = {}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{kind}/metrics", self.metrics)
        app.router.add_get("/{kind}/health", self.health)
        return app

    async def health(self, request: web.Request) -> web.Response:
        kind = request.match_info["kind"]
        self.health_requests[kind] = self.health_requests.get(kind, 0) + 1
        if kind == "hang":
            await self.hang.wait()
        return web.Response(status=self.health_status.get(kind, 500 if kind == "500" else 200))

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        kind = request.match_info["kind"]
        self.requests[kind] = self.requests.get(kind, 0) + 1
        if kind in ("good", "slow"):
            if kind == "slow":
                await asyncio.sleep(0.3)
            return web.Response(text=self.good_body)
        if kind == "hang":
            await self.hang.wait()
            return web.Response(text="")
        if kind == "500":
            return web.Response(status=500, text="Internal Server Error")
        if kind == "huge":
            # 20 MB streamed without Content-Length: the cap must stop the read, not the header.
            response = web.StreamResponse()
            await response.prepare(request)
            chunk = b"# " + b"x" * (1024 * 1024 - 3) + b"\n"
            with contextlib.suppress(ConnectionError):  # the exporter hangs up at its cap
                for _ in range(20):
                    await response.write(chunk)
                await response.write_eof()
            return response
        if kind == "garbage":
            return web.Response(body=os.urandom(4096) + b"\xff\xfe", content_type="application/octet-stream")
        if kind == "html":
            return web.Response(text="<html><body>Welcome to nginx!</body></html>", content_type="text/html")
        if kind == "badvalue":
            return web.Response(text='vllm:num_requests_waiting{engine="0",model_name="m"} lots\n')
        if kind in ("slowloris", "reset"):
            return await self._cut_short(request, kind)
        raise web.HTTPNotFound()

    async def _cut_short(self, request: web.Request, kind: str) -> web.StreamResponse:
        """The good body announced whole (Content-Length), then sent a byte a second, or cut by a reset midway."""
        body = self.good_body.encode()
        response = web.StreamResponse()
        response.content_length = len(body)
        await response.prepare(request)
        if kind == "slowloris":
            with contextlib.suppress(ConnectionError):
                for byte in body[:30]:
                    await response.write(bytes([byte]))
                    await asyncio.sleep(1.0)  # the fault itself: one byte a second
            return response
        await response.write(body[: len(body) // 2])
        assert request.transport is not None
        request.transport.abort()  # RST in mid-body
        return response
