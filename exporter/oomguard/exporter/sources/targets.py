"""Scrape one engine target: its /metrics (only the families we read) and its /health.

Each target has its own timeout, body size cap and limits (samples, label values, labels); every request
goes through `engine_client.get`. A failure becomes `up=0` with an error kind, never an exception out of `scrape`;
a value that is no reading (NaN, negative, a ratio over 1) is dropped and counted, the rest kept
(engines/base.py). A scrape's jobs, each with its name: the requests and the reading (here), the requests
besides them (side_requests.py), the target's state (target_state.py), its restarts (restarts.py), and what
it says in the log (`ScrapeLog`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Mapping

from oomguard.common import engine_client
from oomguard.common.engine_client import BodyTooLarge, ConnectError, EngineClient, EngineHttpError, TlsError
from oomguard.common.promtext import ExpositionError, FamilyExtractor, LimitExceeded, Limits
from oomguard.common.time_scale import REAL, TimeScale
from oomguard.exporter.config import TargetConfig
from oomguard.exporter.engines import ENGINES
from oomguard.exporter.engines.base import Rejected, checked_value, figures_read, read_checked
from oomguard.exporter.model import ERROR_KINDS, VALUE_REJECT_REASONS, EngineReading, ProcessTree, TargetReading
from oomguard.exporter.sources.processes import ProcessFinder
from oomguard.exporter.sources.restarts import ANNOUNCE_WINDOW, RestartTracker
from oomguard.exporter.sources.side_requests import KvUsageEach, ReservationOnce
from oomguard.exporter.sources.target_state import TargetState

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
        clock: TimeScale = REAL,
    ) -> None:
        """`clock`: the simulation's (common/time_scale.py); the windows and back-offs judged here run on it."""
        self.config = config
        self.name = config.label
        plugin = ENGINES[config.engine]
        self.engine = plugin.reader()
        self.figures = plugin.figures
        # What the engine is asked besides /metrics and /health, where /metrics lacks it (side_requests.py).
        self.reservation = (
            ReservationOnce(plugin.reservation, self.name, clock.real(RESERVATION_RETRY_SECONDS))
            if plugin.reservation is not None
            else None
        )
        self.kv_usage = KvUsageEach(plugin.kv_usage, self.name) if plugin.kv_usage is not None else None
        # Only the families the engine's reader needs are extracted from a body (docs/performance.md).
        self.limits = limits or Limits()
        self.extractor = FamilyExtractor(self.engine.families, self.limits)
        self.timeout = timeout
        self.max_body_bytes = max_body_bytes
        self.port = config.port
        self.finder = finder if config.is_local else None
        self.errors_total: Counter[str] = Counter({kind: 0 for kind in ERROR_KINDS})
        self.values_rejected_total: Counter[str] = Counter({reason: 0 for reason in VALUE_REJECT_REASONS})
        self.restarts = RestartTracker(announce_window=clock.real(ANNOUNCE_WINDOW))
        self.status = TargetState(self.restarts, self.finder)
        self.asleep = False  # in the engine's sleep mode, as its last reading said
        # When /health first answered 200 in the spell of 200s that goes on (None: it does not answer 200 now),
        # as the scrapes and the watch between them (watch_startup) saw it: a startup ends there.
        self._healthy_since: float | None = None
        self._log = ScrapeLog(self.name)

    def retarget(self, config: TargetConfig) -> None:
        """A discovered pod at a new address (replaced under the same name): the counts go on, the new
        process is loading until it first answers."""
        self.config = config
        self.port = config.port
        self.status.new_life()

    async def scrape(
        self, client: EngineClient, processes: Awaitable[Mapping[int, ProcessTree | None]] | None = None
    ) -> TargetReading:
        """One reading; `processes` is the collection's lookup of local engines by port, shared by all targets."""
        started = time.perf_counter()
        url = self.config.url
        # /metrics first: it is the longer of the two, so it leaves first and /health runs alongside.
        health_task = asyncio.ensure_future(self._probe_health(client))
        # The KV use apart from /metrics leaves with them, under the same timeout: one more request, no more time.
        kv_task = (
            asyncio.ensure_future(self.kv_usage.get(client, url, self.timeout, self.max_body_bytes))
            if self.kv_usage is not None
            else None
        )
        reading: EngineReading | None = None
        error_kind = error = ""
        rejected = Rejected()
        try:
            reading = await self._fetch_metrics(client, rejected)
        except ScrapeError as exc:
            error_kind, error = exc.kind, str(exc)
            self.errors_total[exc.kind] += 1
        health_status, health_latency = await health_task
        # When the engine answered: a startup ends there, not when the process lookup below is done (on a host
        # saturated by a loading engine the lookup took seconds, and counted them into the startup).
        answered_at = time.time()
        if kv_task is not None and self.kv_usage is not None:
            kv_usage, kv_error = await kv_task
            reading = self.kv_usage.add(reading, checked_value(kv_usage, "kv_usage", rejected, ratio=True), kv_error)
        # A reading dropped whole has its error, not its values' rejections.
        self._log.rejected(rejected if reading is not None else Rejected(), self.values_rejected_total)
        if reading is not None:
            self.asleep = reading.asleep
        process = (await processes).get(self.port) if self.finder and processes is not None else None
        healthy = health_status == 200 or (health_status == 404 and reading is not None)
        state = await self.status.judge(healthy, health_status, process, self.port)
        # The start time of the process found on this host is the most precise; else the engine's own.
        start = process.start_time_seconds if process else (reading.process_start_time_seconds if reading else None)
        self._note_health(healthy, answered_at)
        pid = process.root_pid if process else None
        self.restarts.observe(answered_at, state, start, pid, self._healthy_since)
        if reading is not None and self.reservation is not None:
            reading = await self.reservation.add(
                client, url, self.timeout, reading, state, self.restarts.restarts_total
            )  # fmt: skip
        self._log.error(state, error_kind, error)
        return TargetReading(
            name=self.name,
            engine=self.config.engine,
            url=self.config.url,
            gpus=self.config.gpus,
            up=reading is not None,
            state=state,
            scrape_duration_seconds=time.perf_counter() - started,
            health_status=health_status,
            health_latency_seconds=health_latency,
            engine_reading=reading,
            error_kind=error_kind,
            error=error,
            process=process,
            errors_total=dict(self.errors_total),
            values_rejected_total=dict(self.values_rejected_total),
            figures_read=figures_read(self.figures, reading) if reading is not None else {},
            restarts_total=self.restarts.restarts_total,
            last_restart_at=self.restarts.last_restart_at,
            startup_seconds=self.restarts.startup_seconds,
        )

    async def watch_startup(self, client: EngineClient) -> None:
        """Between scrapes, while the target is not up: its /health, so that a startup ends at the first 200 to the
        watch's interval, not at the next scrape that sees it (up to a scrape interval later: 15 s of Prometheus'
        on a 24 s load at 10x read as 39 s). The scrape judges the state and the life; this only times the 200."""
        if self.status.state == "up":
            return
        status, _ = await self._probe_health(client)
        self._note_health(status == 200, time.time())

    def _note_health(self, healthy: bool, at: float) -> None:
        if not healthy:
            self._healthy_since = None
        elif self._healthy_since is None:
            self._healthy_since = at

    async def _probe_health(self, client: EngineClient) -> tuple[int | None, float | None]:
        started = time.perf_counter()
        try:
            answer = await engine_client.get(
                client, self.config.url + self.engine.health_path, timeout=self.timeout, cap=HEALTH_BODY_BYTES,
                truncate=True,
            )  # fmt: skip
        except (TimeoutError, EngineHttpError, OSError):
            return None, None
        return answer.status, time.perf_counter() - started

    async def _fetch_metrics(self, client: EngineClient, rejected: Rejected) -> EngineReading:
        url = self.config.url + self.engine.metrics_path
        try:
            answer = await engine_client.get(client, url, timeout=self.timeout, cap=self.max_body_bytes)
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
        except TlsError as exc:  # before its base class, ConnectError
            raise ScrapeError("tls", f"TLS with {url} failed: {exc.os_error}") from None
        except ConnectError as exc:
            raise ScrapeError("refused", f"cannot connect to {url}: {exc.os_error}") from None
        except EngineHttpError as exc:  # an answer that is no HTTP, or cut short: its message names the URL
            raise ScrapeError("other", str(exc)) from None
        except OSError as exc:
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


class ScrapeLog:
    """What a target's scrapes say in the log: each new error once, and the values dropped when their reasons
    change; not a line per scrape of one broken engine."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._last_error = ""
        self._loading_told = False  # the one info line of this spell of loading is logged
        self._rejected: frozenset[str] = frozenset()  # the reasons of the last scrape's rejections logged

    def error(self, state: str, error_kind: str, error: str) -> None:
        """A new error as a warning, except while the target loads: an engine loading its model refuses or errors
        by design, which is one info line per spell of loading (the details at debug), not a warning per start."""
        if state != "loading":
            self._loading_told = False
            if error and error != self._last_error:
                log.warning("target %s: %s error: %s", self.target, error_kind, error)
        elif error and error != self._last_error:
            if not self._loading_told:
                log.info("target %s: loading (%s error until it serves: %s)", self.target, error_kind, error)
                self._loading_told = True
            else:
                log.debug("target %s: loading: %s error: %s", self.target, error_kind, error)
        self._last_error = error

    def rejected(self, rejected: Rejected, totals: Counter[str]) -> None:
        """Counted into `totals` on each scrape; logged when the reasons change."""
        totals.update(rejected.counts)
        reasons = frozenset(rejected.counts)
        if reasons and reasons != self._rejected:
            log.warning("target %s: dropped %d value(s) that are no reading: %s (counted in "
                        "oomguard_target_values_rejected_total)", self.target, rejected.counts.total(),
                        "; ".join(rejected.examples))  # fmt: skip
        self._rejected = reasons
