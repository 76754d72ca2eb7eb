"""TGI's process and its settings from its command line or environment (`text-generation-launcher`).

Every launcher flag may come from an environment variable (clap's `env`): `CUDA_MEMORY_FRACTION`,
`MAX_BATCH_TOTAL_TOKENS`, `MAX_CONCURRENT_REQUESTS`; a flag wins over its variable. Defaults (v2, v3):
`cuda_memory_fraction` 1.0 (a launcher flag: the router has none), `max_concurrent_requests` 128;
`max_batch_total_tokens` is inferred at warm-up when absent: unset.
"""

from __future__ import annotations

from collections.abc import Mapping

from oomguard.exporter.engines.cmdline import Cmdline, Settings, program, settings_from

LAUNCHER = "text-generation-launcher"
ROUTER = "text-generation-router"
_ENV = {
    "cuda_memory_fraction": "CUDA_MEMORY_FRACTION",
    "max_batch_total_tokens": "MAX_BATCH_TOTAL_TOKENS",
    "max_concurrent_requests": "MAX_CONCURRENT_REQUESTS",
}


def matches(argv: Cmdline) -> bool:
    return program(argv)[0] in (LAUNCHER, ROUTER)


def parse_settings(argv: Cmdline, version: str | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    name, args = program(argv)
    return settings_from(
        args,
        (
            ("cuda_memory_fraction", ("--cuda-memory-fraction",), 1.0 if name == LAUNCHER else None),
            ("max_batch_total_tokens", ("--max-batch-total-tokens",), None),
            ("max_concurrent_requests", ("--max-concurrent-requests",), 128.0),
        ),
        environ,
        _ENV,
    )
