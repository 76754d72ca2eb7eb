"""A target's state from what one scrape saw: "loading" (no answer yet since we first saw it, or since its
process restarted) told from "down" (it was up, and now refuses, times out or answers 5xx)."""

from __future__ import annotations

import asyncio

from oomguard.exporter.model import ProcessTree
from oomguard.exporter.sources.processes import ProcessFinder
from oomguard.exporter.sources.restarts import RestartTracker


class TargetState:
    def __init__(self, restarts: RestartTracker, finder: ProcessFinder | None = None) -> None:
        """`finder`: the engines' processes on this host, for a local target (None for another)."""
        self.restarts = restarts
        self.finder = finder
        self.state = "loading"
        self.ever_up = False  # healthy since it was first seen (or since its address or container changed)

    def new_life(self) -> None:
        """A new process (a pod replaced, a container restarted): loading until it first answers, not down."""
        self.ever_up = False

    async def judge(self, healthy: bool, health_status: int | None, process: ProcessTree | None, port: int) -> str:
        """The state after a scrape: `healthy` its /health said so, `health_status` (None: no answer), `process`
        the engine's processes found on this host at `port` (None: not looked up, or none)."""
        self.state = await self._next(healthy, health_status, process, port)
        return self.state

    async def _next(self, healthy: bool, health_status: int | None, process: ProcessTree | None, port: int) -> str:
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
            if await asyncio.to_thread(self.finder.restarted, port):  # reads /proc: off the loop
                return "loading"
        return "down"
