"""SGLang's process and its settings from its command line (`python -m sglang.launch_server`).

SGLang derives `mem_fraction_static`, `max_running_requests` and `context_length` when they are absent
(from the GPU's memory, the tensor parallel size and the model), so only the flags given are known;
`tp_size` defaults to 1. The reservation the server settled on is read from /server_info (settings.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from oomguard.exporter.engines.cmdline import Cmdline, Settings, program, settings_from

_SCRIPT = re.compile(r"(^|/)sglang/launch_server\.py$")


def matches(argv: Cmdline) -> bool:
    name, args = program(argv)
    if name == "sglang":
        return bool(args) and args[0] == "serve"
    return name == "-m sglang.launch_server" or (bool(argv) and any(_SCRIPT.search(a) for a in argv[:3]))


def parse_settings(argv: Cmdline, version: str | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    _, args = program(argv)
    return settings_from(
        args,
        (
            ("mem_fraction_static", ("--mem-fraction-static",), None),
            ("max_running_requests", ("--max-running-requests",), None),
            ("context_length", ("--context-length",), None),
            ("tp_size", ("--tp-size", "--tp", "--tensor-parallel-size"), 1.0),
        ),
    )
