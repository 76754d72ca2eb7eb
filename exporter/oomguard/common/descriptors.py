"""The process's file descriptors (`RLIMIT_NOFILE`'s soft limit), shared out once between their uses.

Each use is bounded by its share, so that none can take what another needs: a flood of clients cannot stop the
scrapes, and 1,000 engine pods' log streams cannot stop `/metrics` or a `/proc` read (measured without the shares: 300
streams under 256 descriptors, `accept()` failing with EMFILE, `/proc/meminfo` unreadable, `/metrics` timing out).

- `files`: kept for what is not a connection of ours to count: /proc and /sys reads, the state file, NVML's
  devices, the log files the node mode follows, the API's lists and watches (their pool holds 8), the interpreter's
  own (stdio, the event loop's). An eighth, at least 64.
- `server`: the connections `/metrics` is served on (web_config/server.py), an eighth of them per client address.
  A quarter: Prometheus holds one or two, and one client flooding is closed at once over it.
- `scrapes`: the engines' requests and the dcgm-exporters' (one pool, `engine_client.EngineClient`), idle kept-alive
  connections included: an eighth, 32 to 4,096 (each target sends two at once, /metrics and /health).
- `log_streams` and `log_reads`: the cluster mode's log streams through the API, one per engine container
  (sources/kubernetes/log_budget.py), and the short reads that containers without one take turns at (an eighth of
  the logs' share, 1 to 64). What is left after the others; at least 4.

| soft limit | files | server | scrapes | log_streams | log_reads |
|---:|---:|---:|---:|---:|---:|
| 256 | 64 | 64 | 32 | 84 | 12 |
| 1,024 | 128 | 256 | 128 | 448 | 64 |
| 65,536 | 8,192 | 16,384 | 4,096 | 36,800 | 64 |
| 1,048,576 (and unlimited) | 131,072 | 262,144 | 4,096 | 651,200 | 64 |

The server's share was three quarters of the limit before the log streams had one (768 under systemd's 1,024):
far more than any scraper holds, and it left the streams nothing. Below 256 the minimums add up to more than the
limit (`overbooked`): the exporter says so at start.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

CEILING = 1 << 20  # an unlimited (or larger) soft limit is taken as this: the shares stay finite
FILES_MIN = 64
SCRAPES_MIN, SCRAPES_MAX = 32, 4096
SERVER_MIN = 16
LOGS_MIN = 4
LOG_READS_MAX = 64  # short reads at once: enough to go round thousands of containers within seconds


@dataclass(frozen=True, slots=True)
class Budget:
    limit: int  # the soft limit the shares are of
    files: int
    server: int
    scrapes: int
    log_streams: int
    log_reads: int

    @property
    def overbooked(self) -> bool:
        """The minimums add up to more than the limit (a limit under 256)."""
        return self.files + self.server + self.scrapes + self.log_streams + self.log_reads > self.limit


def soft_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def raise_soft_limit() -> tuple[int, int] | None:
    """The soft limit raised to the hard one, at start, as Go's runtime does for every Go exporter: a soft limit
    under the hard one (1,024 under systemd and many container runtimes) only guards programs that use select(),
    which nothing here does. (before, after) when raised; None when it already was, or may not be."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = CEILING if hard == resource.RLIM_INFINITY else min(hard, CEILING)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return None
        return soft, target
    return None


def budget(limit: int | None = None) -> Budget:
    """The shares of `limit` (the process's soft RLIMIT_NOFILE when None)."""
    if limit is None:
        limit = soft_limit()
    if limit == resource.RLIM_INFINITY or limit > CEILING:
        limit = CEILING
    files = max(FILES_MIN, limit // 8)
    server = max(SERVER_MIN, limit // 4)
    scrapes = min(SCRAPES_MAX, max(SCRAPES_MIN, limit // 8))
    logs = max(LOGS_MIN, limit - files - server - scrapes)
    reads = min(LOG_READS_MAX, max(1, logs // 8))
    return Budget(limit, files, server, scrapes, logs - reads, reads)
