"""What an engine is asked besides /metrics and /health, where /metrics lacks it: its reservation once per life
(SGLang's settings), its KV cache use on each scrape (llama.cpp's /slots). Neither ever fails the scrape: a
failure is logged once and the reading goes on without the figure."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from oomguard.common.engine_client import BodyTooLarge, EngineClient, EngineHttpError
from oomguard.exporter.engines.base import KvUsageError, KvUsageFetcher, ReservationError, ReservationFetcher
from oomguard.exporter.model import EngineReading

log = logging.getLogger(__name__)


class ReservationOnce:
    """The engine's reservation (its share of each GPU's total), fetched once per life: it is set at start, so
    again after a restart or a spell not up, when a new life may have begun with other settings. A failed fetch
    is retried `retry_seconds` later."""

    def __init__(
        self, fetch: ReservationFetcher, target: str, retry_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.fetch = fetch
        self.target = target
        self.retry_seconds = retry_seconds
        self.clock = clock
        self._value: float | None = None
        self._life: int | None = None  # the life (restart count) the value belongs to
        self._retry_at = 0.0

    async def add(
        self, client: EngineClient, url: str, timeout: float, reading: EngineReading, state: str, life: int
    ) -> EngineReading:
        """`reading` with the reservation, where its /metrics gave none and it is known for this life."""
        if state != "up":
            self._life = None
            return reading
        if self._life != life and self.clock() >= self._retry_at:
            try:
                self._value = await self.fetch(client, url, timeout)
                self._life = life
            except (ReservationError, BodyTooLarge, TimeoutError, EngineHttpError, OSError) as exc:
                self._retry_at = self.clock() + self.retry_seconds
                log.warning("target %s: cannot read its reservation (retried in %.0fs): %s",
                            self.target, self.retry_seconds, exc or type(exc).__name__)  # fmt: skip
        if self._life != life or self._value is None or reading.memory_utilization_ratio is not None:
            return reading
        return replace(reading, memory_utilization_ratio=self._value)


class KvUsageEach:
    """The engine's KV cache use, asked on each scrape beside /metrics, under the same timeout."""

    def __init__(self, fetch: KvUsageFetcher, target: str) -> None:
        self.fetch = fetch
        self.target = target
        self._error = ""  # the last failure logged

    async def get(
        self, client: EngineClient, url: str, timeout: float, max_body_bytes: int
    ) -> tuple[float | None, str]:
        """The use, and why not when it could not be read (never raising into the scrape)."""
        try:
            return await self.fetch(client, url, timeout, max_body_bytes), ""
        except TimeoutError:
            return None, f"took longer than {timeout:g}s (timeout_seconds)"
        except (KvUsageError, BodyTooLarge, EngineHttpError, OSError) as exc:
            return None, str(exc) or type(exc).__name__

    def add(self, reading: EngineReading | None, ratio: float | None, error: str) -> EngineReading | None:
        """The reading with the use where /metrics had none; a failure is logged once while the engine is up (a
        loading engine refuses it as it refuses /metrics: no reading then, nothing logged)."""
        if reading is None:
            return None
        if error and error != self._error:
            log.warning("target %s: cannot read its KV cache use: %s", self.target, error)
        self._error = error
        if ratio is None:
            return reading
        models = tuple(m if m.kv_cache_usage_ratio is not None else replace(m, kv_cache_usage_ratio=ratio)
                       for m in reading.models)  # fmt: skip
        return replace(reading, models=models)
