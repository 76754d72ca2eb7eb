"""One kind of object kept in step with the API: list, then watch from the list's resourceVersion.

The watch resumes from the last resourceVersion it saw (an event's or a bookmark's) when the server
ends it. A `410 Gone` (the version is older than the server keeps, as an ERROR event or as the HTTP
status) and every `resync_seconds` make a new list, which replaces what is known. While the API fails
(refused, unreachable, 403) the known objects stay as they are, the failure is reported, and the list
is tried again after a wait that doubles up to `retry_max_seconds`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from oomguard.exporter.sources.kubernetes.api import ApiClient, ApiError

log = logging.getLogger(__name__)
RETRY_FIRST_SECONDS = 0.5

Obj = dict[str, Any]


class Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


class ListWatch:
    def __init__(
        self,
        client: ApiClient,
        path: str,
        params: dict[str, str],
        *,
        on_list: Callable[[list[Obj]], Awaitable[None]],
        on_event: Callable[[str, Obj], Awaitable[None]],
        on_health: Callable[[bool, float, str], None],
        resync_seconds: float,
        retry_max_seconds: float,
    ) -> None:
        self.client = client
        self.path = path
        self.params = params
        self.on_list = on_list  # every object, after each list
        self.on_event = on_event  # ADDED, MODIFIED or DELETED, and the object
        self.on_health = on_health  # (ok, duration, error)
        self.resync_seconds = resync_seconds
        self.retry_max_seconds = retry_max_seconds
        self.lists = 0  # lists done (for the tests: a relist is seen)

    async def run(self) -> None:
        retry = RETRY_FIRST_SECONDS
        while True:
            started = time.perf_counter()
            try:
                version = await self._list()
                self.on_health(True, time.perf_counter() - started, "")
                retry = RETRY_FIRST_SECONDS
                await self._watch(version, time.monotonic() + self.resync_seconds)
            except Gone:
                log.info("kubernetes: %s: resourceVersion gone, listing again", self.path)
            except ApiError as exc:
                self.on_health(False, time.perf_counter() - started, str(exc))
                if exc.status == 403:
                    log.error("kubernetes: %s refused (403): the service account needs get, list, watch", self.path)
                else:
                    log.warning("kubernetes: %s (retried in %.1fs)", exc, retry)
                await asyncio.sleep(retry)
                retry = min(retry * 2, self.retry_max_seconds)
            except Exception:  # an object we did not expect: reported and listed again, never the end of discovery
                log.exception("kubernetes: %s failed", self.path)
                self.on_health(False, time.perf_counter() - started, "unexpected error")
                await asyncio.sleep(retry)
                retry = min(retry * 2, self.retry_max_seconds)

    async def _list(self) -> str:
        body = await self.client.list(self.path, self.params)
        self.lists += 1
        await self.on_list(list(body.get("items") or []))
        return str((body.get("metadata") or {}).get("resourceVersion", ""))

    async def _watch(self, version: str, resync_at: float) -> None:
        """Watch until the resync is due; raises Gone or ApiError."""
        while (left := resync_at - time.monotonic()) > 0:
            try:
                async with asyncio.timeout(left):
                    version = await self._watch_once(version)
            except TimeoutError:
                return  # the resync is due
            except ApiError as exc:
                if exc.status == 410:
                    raise Gone from None
                raise

    async def _watch_once(self, version: str) -> str:
        async for event in self.client.watch(self.path, {**self.params, "resourceVersion": version}):
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Gone
                raise ApiError(int(obj.get("code") or 0), f"watch {self.path}: {obj.get('message', obj)}")
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                await self.on_event(kind, obj)
            # BOOKMARK: only its resourceVersion, taken above.
        return version
