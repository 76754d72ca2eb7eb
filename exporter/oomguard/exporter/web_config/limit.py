"""The toolkit's `rate_limit`: one token bucket for the listener, as golang.org/x/time/rate's Limiter
(`rate.Every(interval)`, `burst`); a request with no token gets 429 before basic auth runs."""

from __future__ import annotations

import time
from collections.abc import Callable

from oomguard.exporter.web_config.model import RateLimit


class TokenBucket:
    def __init__(self, config: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._every = config.interval_seconds
        self._clock = clock
        self._tokens = float(config.burst)
        self._at = clock()

    def allow(self) -> bool:
        now = self._clock()
        self._tokens = min(float(self.config.burst), self._tokens + (now - self._at) / self._every)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


def bucket(config: RateLimit | None, previous: TokenBucket | None) -> TokenBucket | None:
    """None when off (no key, or interval 0); the bucket in force when its settings did not change, as in
    the toolkit: a fresh bucket on every reload would hand out a fresh burst."""
    if config is None or config.interval_seconds <= 0:
        return None
    if previous is not None and previous.config == config:
        return previous
    return TokenBucket(config)
