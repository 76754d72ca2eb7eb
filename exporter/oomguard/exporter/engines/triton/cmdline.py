"""Triton's process (`tritonserver`). Its KV cache share (`kv_cache_free_gpu_mem_fraction`) lives in the model's
config.pbtxt, not on its command line: it has no settings here, and is still discovered."""

from __future__ import annotations

from oomguard.exporter.engines.cmdline import Cmdline, program


def matches(argv: Cmdline) -> bool:
    return program(argv)[0] == "tritonserver"
