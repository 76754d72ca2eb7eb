"""Serving the app: the listener, its guards against hostile clients, and the loop that reloads the web configuration.

A reload that changes only certificates, keys, users or headers takes effect without
touching the listener. One that changes what OpenSSL fixes when a connection begins
(client_auth_type, TLS versions, TLS on or off: tls.Handshake) or the client CAs (a session
saved under the old CAs would resume without a certificate) replaces the listener on the
same port; connections already open finish under the old settings, as in the toolkit.

The listener is asyncio's, with a protocol in front of aiohttp's (`_Gate`):

- **A connection limit**, the server's share of the process's descriptors (`connection_limit`,
  descriptors.py), and an eighth of it per client address: a connection over either is closed
  at once, before any TLS handshake, so slow clients can never take the descriptors a scrape,
  a log stream or a file needs, and one address cannot take every connection.
- **A header-read timeout**: the TLS handshake, and each request's head (from the
  connection's start, or the end of the last response), must arrive within
  `header_timeout` seconds, or the connection is closed.
- No version in the `Server` header; errors of the loop (an accept that fails) logged once
  per interval with a count, never once per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from oomguard.common import descriptors
from oomguard.exporter.web_config.state import WebConfigState, WebSettings

log = logging.getLogger(__name__)

POLL_SECONDS = 3.0
# Prometheus sends a request's head in one packet; 15 s is far above any real client and closes a slow one.
HEADER_TIMEOUT_SECONDS = 15.0
SERVER_HEADER = "oomguard"  # no versions: they tell an attacker which CVEs to try
LOG_EVERY_SECONDS = 60.0


def connection_limit(soft_limit: int | None = None) -> int:
    """Connections served at once: the server's share of the descriptor budget (descriptors.py), a quarter of
    the limit (256 under systemd's default of 1024); the rest is kept for the engines' scrapes, the log streams
    and the files."""
    return descriptors.budget(soft_limit).server


def scrape_connection_limit(soft_limit: int | None = None) -> int:
    """Connections to the engines and the dcgm-exporters at once, idle ones included: the scrapes' share of the
    descriptor budget (descriptors.py), an eighth of the limit, 32 to 4096 (128 under systemd's default of 1024).
    Each target takes two at a time (/metrics and /health); below that the requests wait in the connector's queue,
    whose waking cost a quarter of the exporter's CPU at 500 targets with 64 (bench/bench_many_targets.py)."""
    return descriptors.budget(soft_limit).scrapes


@dataclass
class WebCounters:
    """What the web layer refused, for /metrics (oomguard_web_requests_refused_total and
    oomguard_web_connections_refused_total). `listening`: a Server runs the app's listener."""

    requests_refused: dict[str, int] = field(default_factory=dict)
    connections_refused: int = 0
    listening: bool = False

    def refuse(self, reason: str) -> None:
        self.requests_refused[reason] = self.requests_refused.get(reason, 0) + 1


COUNTERS = web.AppKey("web_counters", WebCounters)


class Throttled:
    """One log line per key per interval, with how many were not logged since: a flood never floods the log."""

    def __init__(self, every: float = LOG_EVERY_SECONDS) -> None:
        self._every = every
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def log(self, level: int, key: str, message: str) -> None:
        now = time.monotonic()
        if now - self._last.get(key, -self._every) < self._every:
            self._skipped[key] = self._skipped.get(key, 0) + 1
            return
        skipped = self._skipped.pop(key, 0)
        self._last[key] = now
        more = f" ({skipped} more in the last {self._every:g} s)" if skipped else ""
        log.log(level, "%s%s", message, more)


class _Handler(RequestHandler):
    """aiohttp's request handler, telling the gate when its connection ends, with no versions in the Server
    header of the errors it answers itself (400 for a malformed request), and answering what a client sent before
    it closed its side (see eof_received)."""

    release: Any = None
    sent_all = False  # the client closed its side: no request comes after those received

    def handle_error(self, request: Any, status: int = 500, exc: Any = None, message: Any = None) -> web.StreamResponse:
        response = super().handle_error(request, status, exc, message)
        response.headers["Server"] = SERVER_HEADER
        return response

    def eof_received(self) -> bool:
        """The client closed its side after its requests (a half-close: `nc -N`, a pipelining client's shutdown).
        aiohttp lets asyncio close the connection here, which loses every request received and not answered yet:
        under basic auth the one whose check waits for bcrypt, and those queued behind it (a handler that does not
        wait has answered before the close is read). So the connection stays open for the answers, then closes, as
        Go's server (the exporter toolkit's) does. Over TLS, asyncio's ssl layer closes at once whatever this says."""
        self.sent_all = True
        if self._waiter is not None and not self._waiter.done():
            self.force_close()  # waiting for a request: every one received is answered
        elif not self._messages:
            self.close()  # the last one is being answered: close after it
        # else: finish_response closes after the last one queued
        return self.transport is not None and self.transport.get_extra_info("sslcontext") is None

    async def finish_response(
        self, request: BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        answered = await super().finish_response(request, resp, start_time)
        if self.sent_all and not self._messages:
            self.close()  # the client's last request is answered
        return answered

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.release is not None:
            self.release()
            self.release = None
        super().connection_lost(exc)


class Listener:
    """One listening socket and its connections' accounting; `connections` counts those open (TLS handshakes too)."""

    def __init__(self, server: Server, context: ssl.SSLContext | None) -> None:
        self._server = server
        self.context = context
        self.asyncio_server: asyncio.Server | None = None

    def __call__(self) -> asyncio.Protocol:
        return _Gate(self._server, self.context)

    async def close(self) -> None:
        if self.asyncio_server is not None:
            self.asyncio_server.close()


class _Gate(asyncio.Protocol):
    """Admits a connection or closes it at once; then hands it (after the TLS handshake) to aiohttp."""

    def __init__(self, server: Server, context: ssl.SSLContext | None) -> None:
        self._server = server
        self._context = context
        self._address = ""
        self._released = False

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._server.leave(self._address)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self._server
        peer = transport.get_extra_info("peername")
        self._address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        why = server.refusal(self._address)
        if why is not None:
            server.counters.connections_refused += 1
            server.throttled.log(logging.WARNING, "refused", f"refused a connection from {self._address}: {why}")
            transport.abort()
            return
        server.enter(self._address)
        handler = server.new_handler()
        handler.release = self._release
        assert isinstance(transport, asyncio.Transport)
        if self._context is None:
            transport.set_protocol(handler)
            handler.connection_made(transport)
            return
        transport.pause_reading()  # no byte for this protocol: start_tls reads the handshake
        server.track(asyncio.get_running_loop().create_task(self._start_tls(transport, handler)))

    async def _start_tls(self, transport: asyncio.Transport, handler: _Handler) -> None:
        assert self._context is not None
        loop = asyncio.get_running_loop()
        try:
            secured = await loop.start_tls(
                transport, handler, self._context, server_side=True, ssl_handshake_timeout=self._server.header_timeout
            )
        except Exception:  # a failed handshake (no certificate, a stranger's, too slow) is routine: no log line
            secured = None
        if secured is None:
            transport.abort()
            self._release()
            return
        handler.connection_made(secured)

    def connection_lost(self, exc: BaseException | None) -> None:
        pass  # before start_tls took the transport over: start_tls fails, and releases


class Server:
    def __init__(
        self,
        app: web.Application,
        host: str,
        port: int,
        state: WebConfigState | None,
        *,
        poll_seconds: float = POLL_SECONDS,
        handle_signals: bool = False,
        header_timeout: float = HEADER_TIMEOUT_SECONDS,
        max_connections: int | None = None,
        max_connections_per_address: int | None = None,
    ) -> None:
        # keepalive_timeout is aiohttp's wait for the next request's head, from the connection's start
        # and after each response: the header-read timeout.
        self._handler_kwargs: dict[str, Any] = {"access_log": None, "keepalive_timeout": header_timeout}
        self._runner = web.AppRunner(app, handle_signals=handle_signals, **self._handler_kwargs)
        self._host = host
        self._port = port
        self._state = state
        self._poll_seconds = poll_seconds
        self.header_timeout = header_timeout
        self.connection_limit = max_connections if max_connections is not None else connection_limit()
        # One address (one client flooding) may hold an eighth: the others' scrapes still get in.
        self.address_limit = max_connections_per_address or max(4, self.connection_limit // 8)
        self.connections = 0
        self._by_address: dict[str, int] = {}
        self.counters = app[COUNTERS] if COUNTERS in app else WebCounters()
        self.counters.listening = True
        self.throttled = Throttled()
        self._listener: Listener | None = None
        self._listener_key = state.current.listener_key if state else None
        self._watch: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def refusal(self, address: str) -> str | None:
        """Why a new connection from `address` is closed at once; None: it is served."""
        if self.connections >= self.connection_limit:
            return f"{self.connections} connections open, the limit is {self.connection_limit}"
        if self._by_address.get(address, 0) >= self.address_limit:
            return f"it has {self.address_limit} connections open, the limit per address"
        return None

    def enter(self, address: str) -> None:
        self.connections += 1
        self._by_address[address] = self._by_address.get(address, 0) + 1

    def leave(self, address: str) -> None:
        self.connections -= 1
        left = self._by_address.get(address, 1) - 1
        if left > 0:
            self._by_address[address] = left
        else:
            self._by_address.pop(address, None)

    @property
    def refused_connections(self) -> int:
        return self.counters.connections_refused

    @property
    def port(self) -> int:
        """The bound port (the one asked for, or the one given for port 0)."""
        return self._port

    def new_handler(self) -> _Handler:
        assert self._runner.server is not None
        return _Handler(self._runner.server, loop=asyncio.get_running_loop(), **self._handler_kwargs)

    def track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self) -> None:
        # The port first: one held by another process stops here, before the runtime starts anything (the
        # simulated engine's child), and the listener accepts nothing until aiohttp's server exists.
        await self._listen(start_serving=False)
        await self._runner.setup()  # starts the runtime (the app's cleanup context)
        assert self._listener is not None and self._listener.asyncio_server is not None
        await self._listener.asyncio_server.start_serving()
        self._watch = asyncio.get_running_loop().create_task(self._reload_forever(), name="web-config-reload")

    async def stop(self) -> None:
        """Always reaches the runner's cleanup (the runtime's stop: the simulated engine's children)."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch
        if self._listener is not None:
            await self._listener.close()
        for task in list(self._tasks):
            task.cancel()
        await self._runner.cleanup()

    async def serve_forever(self) -> None:
        try:
            await self.start()
            assert self._watch is not None
            await self._watch  # ends only if the listener could not be replaced
        finally:
            await self.stop()

    async def _listen(self, settings: WebSettings | None = None, *, start_serving: bool = True) -> None:
        """Listen with `settings` (a reload's, not yet adopted), else the configuration in force."""
        if settings is None and self._state is not None:
            settings = self._state.current
        context = settings.ssl_context if settings else None
        listener = Listener(self, context)
        loop = asyncio.get_running_loop()
        listener.asyncio_server = await loop.create_server(
            listener, self._host, self._port, reuse_address=True, start_serving=start_serving
        )
        self._listener = listener
        self._listener_key = settings.listener_key if settings else None
        # A restart must come back on the same port, also when 0 asked for any.
        self._port = listener.asyncio_server.sockets[0].getsockname()[1]
        scheme = "https" if context else "http"
        what = settings.describe() if settings else "no web configuration"
        log.info(
            "serving %s on %s:%d: %s; at most %d connections (%d per address), %g s for a request's head",
            scheme, self._host, self._port, what, self.connection_limit, self.address_limit, self.header_timeout,
        )  # fmt: skip

    async def _reload_forever(self) -> None:
        if self._state is None:
            await asyncio.Event().wait()  # nothing to reload: serve until cancelled
        assert self._state is not None
        while True:
            await asyncio.sleep(self._poll_seconds)
            settings = await self._state.poll()
            if settings is None:
                continue
            if settings.listener_key == self._listener_key:
                self._state.adopt(settings)
                continue
            assert self._listener is not None
            log.info("the TLS handshake settings or client CAs changed: replacing the listener")
            # The reload is said to be done (metrics, log) only once the new listener serves: before, the old one
            # would still take clients of the former CA, or nothing would answer.
            await self._listener.close()
            # An error here ends serve_forever: better an exit (and a restart by systemd) than no listener.
            await self._listen(settings)
            self._state.adopt(settings)


def run(app: web.Application, host: str, port: int, state: WebConfigState | None) -> int:
    """Serve until SIGINT or SIGTERM, as web.run_app does, with the guarded listener and the reloads."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    throttled = Throttled()

    def loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # asyncio logs each failed accept (EMFILE) with a traceback: one line per kind per interval instead.
        exc = context.get("exception")
        message = str(context.get("message", "event loop error"))
        throttled.log(logging.ERROR, message, f"{message}: {exc!r}" if exc else message)

    loop.set_exception_handler(loop_error)
    main = loop.create_task(Server(app, host, port, state, handle_signals=True).serve_forever())
    status = 0
    try:
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", host, port, _why(exc, host, port))
        status = 1
    except Exception as exc:  # one line, never a traceback; stop() has run (serve_forever's finally)
        log.error("oomguard stops: %s: %s", type(exc).__name__, exc)
        status = 1
    finally:
        if not main.done():
            main.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                loop.run_until_complete(main)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    return status


def _why(exc: OSError, host: str, port: int) -> str:
    """asyncio's bind error in a user's words: "[Errno 98] error while attempting to bind on address ..." repeats
    the address the line already gives. A port in use gets another to try, one free now: not a fixed example,
    which is the taken port itself for whoever already followed it."""
    if exc.errno == errno.EADDRINUSE:
        free = _free_port_above(host, port)
        if free is None:
            return (
                "the port is already in use (another process listens on it): choose another with "
                "--web.listen-address, or with LISTEN= under make"
            )
        shown = "" if host in ("", "0.0.0.0", "::") else (f"[{host}]" if ":" in host else host)
        return (
            f"the port is already in use (another process listens on it): choose another, e.g. port {free} (free "
            f"now): --web.listen-address {shown}:{free}, or under make, make run LISTEN={shown}:{free}"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return "no interface of this host has that address"
    if exc.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges)"
    return exc.strerror or str(exc)


def _free_port_above(host: str, port: int, tries: int = 20) -> int | None:
    """The first of the ports after `port` that `host` can bind now, if any of the next `tries` is."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for candidate in range(port + 1, min(port + 1 + tries, 65536)):
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host or "0.0.0.0", candidate))
            except OSError:
                continue
            return candidate
    return None
