"""llama-server's process and its settings from its command line or environment.

`-c`/`--ctx-size` and `-np`/`--parallel`, or `LLAMA_ARG_CTX_SIZE` and `LLAMA_ARG_N_PARALLEL` (common/arg.cpp);
a flag wins over its variable. Their defaults moved between builds (the context 512, then 4096, then 0: the
model's own; the slots 1, then -1: chosen at load), and a build's number is not on its command line: only
what is given is known. `-c 0` is exported as given (the model's context length).
"""

from __future__ import annotations

from collections.abc import Mapping

from oomguard.exporter.engines.cmdline import Cmdline, Settings, program, settings_from

_ENV = {"ctx_size": "LLAMA_ARG_CTX_SIZE", "parallel": "LLAMA_ARG_N_PARALLEL"}


def matches(argv: Cmdline) -> bool:
    return program(argv)[0] == "llama-server"


def parse_settings(argv: Cmdline, version: str | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    _, args = program(argv)
    return settings_from(
        args, (("ctx_size", ("-c", "--ctx-size"), None), ("parallel", ("-np", "--parallel"), None)), environ, _ENV
    )
