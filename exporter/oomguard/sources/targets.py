"""Scrape one engine target: its /metrics (only the families we read) and its /health.

Each target has its own timeout, body size cap and limits (samples, label values, labels); every request
goes through `capped.get`. A failure becomes `up=0` with an error kind, never an exception out of `scrape`;
a value that is no reading (NaN, negative, a ratio over 1) is dropped and counted, the rest kept
(engines/base.py). The target's state tells
"loading" (no answer yet since we first saw it, or since its process restarted)
from "down" (it was up, and now refuses, times out or answers 5xx).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Mapping
from dataclasses import replace

import aiohttp

from oomguard import capped
from oomguard.capped import BodyTooLarge
from oomguard.config import TargetConfig
from oomguard.engines import ENGINES
from oomguard.engines.base import KvUsageError, Rejected, ReservationError, checked_value, figures_read, read_checked
from oomguard.model import ERROR_KINDS, VALUE_REJECT_REASONS, EngineReading, ProcessTree, TargetReading
from oomguard.promtext import ExpositionError, FamilyExtractor, LimitExceeded, Limits
from oomguard.sources.processes import ProcessFinder
from oomguard.sources.restarts import ANNOUNCE_WINDOW, RestartTracker

log = logging.getLogger(__name__)

RESERVATION_RETRY_SECONDS = 60.0  # after a failed fetch of an engine's reservation
# /health's body is not read: its status tells. The first few kB are read (a small answer leaves the connection
# reusable), then the read stops and the connection is closed: a longer body is no fault of the engine's health.
HEALTH_BODY_BYTES = 4096


class ScrapeError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        assert kind in ERROR_KINDS, kind
        super().__init__(message)
        self.kind = kind


class TargetScraper:
    def __init__(
        self,
        config: TargetConfig,
        *,
        timeout: float,
        max_body_bytes: int,
        finder: ProcessFinder | None = None,
        limits: Limits | None = None,
        time_scale: float = 1.0,
    ) -> None:
        """`time_scale`: the simulation's (simulate/clock.py); the windows and back-offs judged here run on it."""
        self.config = config
        self.name = config.label
        self.engine = ENGINES[config.engine].reader()
        self.fetch_reservation = ENGINES[config.engine].reservation
        # The reservation fetched apart from /metrics, and the life (restart count) it belongs to.
        self._reservation: float | None = None
        self._reservation_life: int | None = None
        self._reservation_retry_at = 0.0
        self._reservation_retry_seconds = RESERVATION_RETRY_SECONDS / time_scale
        # The KV cache use fetched apart from /metrics on each scrape (llama.cpp's /slots), and its last failure.
        self.fetch_kv_usage = ENGINES[config.engine].kv_usage
        self._kv_usage_error = ""
        # Only the families the engine's reader needs are extracted from a body (docs/performance.md).
        self.limits = limits or Limits()
        self.extractor = FamilyExtractor(self.engine.families, self.limits)
        self.timeout = timeout
        self.max_body_bytes = max_body_bytes
        self.port = config.port
        self.finder = finder if config.is_local else None
        self.errors_total: Counter[str] = Counter({kind: 0 for kind in ERROR_KINDS})
        self.values_rejected_total: Counter[str] = Counter({reason: 0 for reason in VALUE_REJECT_REASONS})
        self._rejected_logged: frozenset[str] = frozenset()  # the reasons of the last scrape's rejections logged
        self.ever_up = False
        self.restarts = RestartTracker(announce_window=ANNOUNCE_WINDOW / time_scale)
        self.state = "loading"
        self.asleep = False  # in the engine's sleep mode, as its last reading said
        self._last_error = ""
        self._loading_told = False  # the one info line of this spell of loading is logged

    def retarget(self, config: TargetConfig) -> None:
        """A discovered pod at a new address (replaced under the same name): the counts go on, the new
        process is loading until it first answers."""
        self.config = config
        self.port = config.port
        self.ever_up = False

    async def scrape(
        self, session: aiohttp.ClientSession, processes: Awaitable[Mapping[int, ProcessTree | None]] | None = None
    ) -> TargetReading:
        """One reading; `processes` is the collection's lookup of local engines by port, shared by all targets."""
        started = time.perf_counter()
        # /metrics first: it is the longer of the two, so it leaves first and /health runs alongside.
        health_task = asyncio.ensure_future(self._probe_health(session))
        # The KV use apart from /metrics leaves with them, under the same timeout: one more request, no more time.
        kv_task = asyncio.ensure_future(self._kv_usage(session)) if self.fetch_kv_usage is not None else None
        reading: EngineReading | None = None
        error_kind = error = ""
        rejected = Rejected()
        try:
            reading = await self._fetch_metrics(session, rejected)
        except ScrapeError as exc:
            error_kind, error = exc.kind, str(exc)
            self.errors_total[exc.kind] += 1
        health_status, health_latency = await health_task
        # When the engine answered: a startup ends there, not when the process lookup below is done (on a host
        # saturated by a loading engine the lookup took seconds, and counted them into the startup).
        answered_at = time.time()
        if kv_task is not None:
            kv_usage, kv_error = await kv_task
            reading = self._with_kv_usage(reading, checked_value(kv_usage, "kv_usage", rejected, ratio=True), kv_error)
        self._count_rejected(rejected if reading is not None else Rejected())  # a reading dropped whole: its error
        if reading is not None:
            self.asleep = reading.asleep
        process = (await processes).get(self.port) if self.finder and processes is not None else None
        healthy = health_status == 200 or (health_status == 404 and reading is not None)
        self.state = await self._next_state(healthy, health_status, process)
        # The start time of the process found on this host is the most precise; else the engine's own.
        start = process.start_time_seconds if process else (reading.process_start_time_seconds if reading else None)
        self.restarts.observe(answered_at, self.state, start, process.root_pid if process else None)
        if reading is not None and self.fetch_reservation is not None:
            reading = await self._with_reservation(session, reading)
        figures = figures_read(ENGINES[self.config.engine].figures, reading) if reading is not None else {}
        self._log_error(error_kind, error)
        return TargetReading(
            name=self.name,
            engine=self.config.engine,
            url=self.config.url,
            gpus=self.config.gpus,
            up=reading is not None,
            state=self.state,
            scrape_duration_seconds=time.perf_counter() - started,
            health_status=health_status,
            health_latency_seconds=health_latency,
            engine_reading=reading,
            error_kind=error_kind,
            error=error,
            process=process,
            errors_total=dict(self.errors_total),
            values_rejected_total=dict(self.values_rejected_total),
            figures_read=figures,
            restarts_total=self.restarts.restarts_total,
            last_restart_at=self.restarts.last_restart_at,
            startup_seconds=self.restarts.startup_seconds,
        )

    def _log_error(self, error_kind: str, error: str) -> None:
        """A new error as a warning, except while the target loads: an engine loading its model refuses or errors
        by design, which is one info line per spell of loading (the details at debug), not a warning per start."""
        if self.state != "loading":
            self._loading_told = False
            if error and error != self._last_error:
                log.warning("target %s: %s error: %s", self.name, error_kind, error)
        elif error and error != self._last_error:
            if not self._loading_told:
                log.info("target %s: loading (%s error until it serves: %s)", self.name, error_kind, error)
                self._loading_told = True
            else:
                log.debug("target %s: loading: %s error: %s", self.name, error_kind, error)
        self._last_error = error

    def _count_rejected(self, rejected: Rejected) -> None:
        """Counted on each scrape; logged when the reasons change (not on every scrape of one bad engine)."""
        self.values_rejected_total.update(rejected.counts)
        reasons = frozenset(rejected.counts)
        if reasons and reasons != self._rejected_logged:
            log.warning("target %s: dropped %d value(s) that are no reading: %s (counted in "
                        "oomguard_target_values_rejected_total)", self.name, rejected.counts.total(),
                        "; ".join(rejected.examples))  # fmt: skip
        self._rejected_logged = reasons

    async def _kv_usage(self, session: aiohttp.ClientSession) -> tuple[float | None, str]:
        """The engine's KV cache use, and why not when it could not be read (never raising into the scrape)."""
        assert self.fetch_kv_usage is not None
        try:
            return await self.fetch_kv_usage(session, self.config.url, self.timeout, self.max_body_bytes), ""
        except TimeoutError:
            return None, f"took longer than {self.timeout:g}s (timeout_seconds)"
        except (KvUsageError, BodyTooLarge, aiohttp.ClientError, OSError) as exc:
            return None, str(exc) or type(exc).__name__

    def _with_kv_usage(self, reading: EngineReading | None, ratio: float | None, error: str) -> EngineReading | None:
        """The reading with the KV use where /metrics had none; a failure is logged once while the engine is up
        (a loading engine refuses it as it refuses /metrics), and the reading goes on without it."""
        if reading is None:
            return None
        if error and error != self._kv_usage_error:
            log.warning("target %s: cannot read its KV cache use: %s", self.name, error)
        self._kv_usage_error = error
        if ratio is None:
            return reading
        models = tuple(m if m.kv_cache_usage_ratio is not None else replace(m, kv_cache_usage_ratio=ratio)
                       for m in reading.models)  # fmt: skip
        return replace(reading, models=models)

    async def _with_reservation(self, session: aiohttp.ClientSession, reading: EngineReading) -> EngineReading:
        """The reading with the engine's reservation, fetched once per life (it is set at start): again after a
        restart or a spell not up, when a new life may have begun with other settings; never failing the scrape."""
        assert self.fetch_reservation is not None
        life = self.restarts.restarts_total
        if self.state != "up":
            self._reservation_life = None
            return reading
        if self._reservation_life != life and time.monotonic() >= self._reservation_retry_at:
            try:
                self._reservation = await self.fetch_reservation(session, self.config.url, self.timeout)
                self._reservation_life = life
            except (ReservationError, BodyTooLarge, TimeoutError, aiohttp.ClientError, OSError) as exc:
                self._reservation_retry_at = time.monotonic() + self._reservation_retry_seconds
                log.warning("target %s: cannot read its reservation (retried in %.0fs): %s",
                            self.name, self._reservation_retry_seconds, exc or type(exc).__name__)  # fmt: skip
        if self._reservation_life != life or self._reservation is None or reading.memory_utilization_ratio is not None:
            return reading
        return replace(reading, memory_utilization_ratio=self._reservation)

    async def _next_state(self, healthy: bool, health_status: int | None, process: ProcessTree | None = None) -> str:
        if healthy:
            self.ever_up = True
            return "up"
        if not self.ever_up:
            # Never healthy since we first saw it: an engine loading its model refuses connections
            # (vLLM), answers 503 (SGLang), or errors while its HTTP side is up before its engine.
            return "loading"
        # A new process with the engine's command line is a restart loading again: it refuses (vLLM, TGI) or
        # answers 503 (SGLang) meanwhile. A 503 from the same process is an engine that died (vLLM): down.
        if health_status in (None, 503) and self.finder:
            # An engine that listens while it loads (llama.cpp, SGLang) is found on its port at once: a process
            # there that is not the life last seen up is a restart loading.
            if process is not None and self.restarts.is_new_life(process.start_time_seconds, process.root_pid):
                return "loading"
            if await asyncio.to_thread(self.finder.restarted, self.port):
                return "loading"
        return "down"

    async def _probe_health(self, session: aiohttp.ClientSession) -> tuple[int | None, float | None]:
        started = time.perf_counter()
        try:
            answer = await capped.get(
                session, self.config.url + self.engine.health_path, timeout=self.timeout, cap=HEALTH_BODY_BYTES,
                truncate=True,
            )  # fmt: skip
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None, None
        return answer.status, time.perf_counter() - started

    async def _fetch_metrics(self, session: aiohttp.ClientSession, rejected: Rejected) -> EngineReading:
        url = self.config.url + self.engine.metrics_path
        try:
            answer = await capped.get(session, url, timeout=self.timeout, cap=self.max_body_bytes)
            if answer.status != 200:
                raise ScrapeError("http_status", f"GET {url} answered HTTP {answer.status}")
            body = answer.body
        except BodyTooLarge:
            raise ScrapeError(
                "too_large",
                f"{url} sent more than {self.max_body_bytes} bytes; raise scrape.max_body_bytes if this is expected",
            ) from None
        except TimeoutError:
            raise ScrapeError("timeout", f"GET {url} took longer than {self.timeout:g}s (timeout_seconds)") from None
        except aiohttp.ClientSSLError as exc:  # before its base class, ClientConnectorError
            raise ScrapeError("tls", f"TLS with {url} failed: {exc.os_error or exc}") from None
        except aiohttp.ClientConnectorError as exc:
            raise ScrapeError("refused", f"cannot connect to {url}: {exc.os_error or exc}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise ScrapeError("other", f"GET {url} failed: {exc!r}") from None
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ScrapeError(
                "parse", f"{url} sent a body that is not UTF-8 text ({exc.reason} at byte {exc.start})"
            ) from None
        try:
            return read_checked(self.engine, self.extractor.extract(text), rejected)
        except LimitExceeded as exc:  # before its base class: dropped whole, never half-exported
            raise ScrapeError("limit", f"{url}: {exc}") from None
        except ExpositionError as exc:
            raise ScrapeError("parse", f"{url}: {exc}") from None
