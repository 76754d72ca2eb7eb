"""One tick of the trend sampler: read the GPUs and the engines' processes, join, observe."""

from __future__ import annotations

import asyncio

from oomguard.model import NvmlReading, Observation, TrendKey
from oomguard.sources.nvml_reader import NvmlReader
from oomguard.sources.process_lookup import ProcessLookup
from oomguard.sources.targets import TargetScraper
from oomguard.trend.sampler import observations

# A tick this soon after a scrape reuses the scrape's lookup of the engines' processes.
PROCESS_LOOKUP_MAX_AGE = 1.0


class TrendObserver:
    def __init__(self, nvml: NvmlReader | None, processes: ProcessLookup, scrapers: list[TargetScraper]) -> None:
        self.nvml = nvml
        self.processes = processes
        self.scrapers = scrapers

    async def observe(self) -> dict[TrendKey, Observation]:
        """GPUs, and each target's GPUs and local processes."""
        nvml: NvmlReading | None = None
        if self.nvml is not None:
            try:
                nvml = await self.nvml.read()
            except TimeoutError:
                nvml = None  # the GPU series miss this tick; the sampler goes on
        trees = await self.processes.get(max_age=PROCESS_LOOKUP_MAX_AGE)
        targets = [(s.name, s.config.gpus, trees.get(s.port) if s.finder else None) for s in self.scrapers]
        return await asyncio.to_thread(observations, nvml, targets)
