"""vLLM's process and its settings from its command line (`vllm serve`, or the OpenAI API server module).

Defaults by version (vllm/engine/arg_utils.py, vllm/config): `gpu_memory_utilization` 0.9 and
`tensor_parallel_size` 1 in every version. `max_num_seqs` was 256 in the V0 engine (before 0.8); from 0.8
the V1 engine sets it by usage context and by the GPU (256, or 1024 on large GPUs in later releases), which a
command line does not tell: left unset there, and unset when the version is unknown. `max_model_len` comes
from the model's config when absent: unset. A `--config file.yaml` is not read (docs/engines.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from oomguard.exporter.engines.cmdline import Cmdline, Settings, flag, program, settings_from, version_tuple
from oomguard.exporter.model import EngineSetting

_MODULES = ("-m vllm.entrypoints.openai.api_server", "-m vllm.entrypoints.api_server")
_SCRIPT = re.compile(r"(^|/)vllm/entrypoints/openai/api_server\.py$")
V1_DEFAULT = (0, 8)  # the first release that runs the V1 engine by default


def matches(argv: Cmdline) -> bool:
    name, args = program(argv)
    if name == "vllm":
        return bool(args) and args[0] == "serve"
    return name in _MODULES or (bool(argv) and any(_SCRIPT.search(a) for a in argv[:3]))


def _model_len(text: str | None) -> float | None:
    """`--max-model-len`: a number, or (recent versions) 32k / 32K: k is 1000, K is 1024, m and M likewise."""
    if text is None:
        return None
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", text)
    if found is None:
        return None
    scale = {"": 1, "k": 1e3, "K": 1024, "m": 1e6, "M": 1024**2, "g": 1e9, "G": 1024**3}[found.group(2)]
    value = float(found.group(1)) * scale
    return value if math.isfinite(value) else None


def parse_settings(argv: Cmdline, version: str | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    _, args = program(argv)
    parsed = version_tuple(version)
    max_num_seqs = 256.0 if parsed is not None and parsed < V1_DEFAULT else None
    out = settings_from(
        args,
        (
            ("gpu_memory_utilization", ("--gpu-memory-utilization",), 0.9),
            ("max_num_seqs", ("--max-num-seqs",), max_num_seqs),
            ("tensor_parallel_size", ("--tensor-parallel-size", "-tp"), 1.0),
        ),
    )
    model_len = _model_len(flag(args, "--max-model-len"))
    if model_len is not None:
        out["max_model_len"] = EngineSetting(model_len, "flag")
    return out
