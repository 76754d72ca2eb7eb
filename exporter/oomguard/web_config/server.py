"""Serving the app under a web configuration: the listener, and the loop that reloads the file.

A reload that changes only certificates, keys, client CAs, users or headers takes effect
without touching the listener. One that changes what OpenSSL fixes when a connection begins
(client_auth_type, TLS versions, TLS on or off: tls.Handshake) replaces the listener on the
same port; connections already open finish under the old settings, as in the toolkit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import web

from oomguard.web_config.state import WebConfigState

log = logging.getLogger(__name__)

POLL_SECONDS = 3.0


class Server:
    def __init__(
        self,
        app: web.Application,
        host: str,
        port: int,
        state: WebConfigState,
        *,
        poll_seconds: float = POLL_SECONDS,
        handle_signals: bool = False,
    ) -> None:
        self._runner = web.AppRunner(app, handle_signals=handle_signals, access_log=None)
        self._host = host
        self._port = port
        self._state = state
        self._poll_seconds = poll_seconds
        self._site: web.TCPSite | None = None
        self._handshake = state.current.handshake
        self._watch: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        """The bound port (the one asked for, or the one given for port 0)."""
        return self._port

    async def start(self) -> None:
        await self._runner.setup()  # starts the runtime (the app's cleanup context)
        await self._listen()
        self._watch = asyncio.get_running_loop().create_task(self._reload_forever(), name="web-config-reload")

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self._runner.cleanup()

    async def serve_forever(self) -> None:
        await self.start()
        assert self._watch is not None
        try:
            await self._watch  # ends only if the listener could not be replaced
        finally:
            await self.stop()

    async def _listen(self) -> None:
        settings = self._state.current
        site = web.TCPSite(self._runner, self._host, self._port, ssl_context=settings.ssl_context)
        await site.start()
        self._site, self._handshake = site, settings.handshake
        # A restart must come back on the same port, also when 0 asked for any.
        self._port = self._runner.addresses[-1][1]
        scheme = "https" if settings.ssl_context else "http"
        log.info("serving %s on %s:%d: %s", scheme, self._host, self._port, settings.describe())

    async def _reload_forever(self) -> None:
        while True:
            await asyncio.sleep(self._poll_seconds)
            if await self._state.poll() and self._state.current.handshake != self._handshake:
                assert self._site is not None
                log.info("the TLS handshake settings changed: replacing the listener")
                await self._site.stop()
                # An error here ends serve_forever: better an exit (and a restart by systemd) than no listener.
                await self._listen()


def run(app: web.Application, host: str, port: int, state: WebConfigState) -> int:
    """Serve until SIGINT or SIGTERM, as web.run_app does, with the web configuration's listener and reloads."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    main = loop.create_task(Server(app, host, port, state, handle_signals=True).serve_forever())
    status = 0
    try:
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", host, port, exc)
        status = 1
    finally:
        if not main.done():
            main.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(main)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    return status
