"""Inference engines, one module each; `ENGINES` maps the config's `engine:` to its reader.

To add an engine (SGLang, TGI, llama.cpp): write a module with a class following
`engines.base.Engine` and register it here.
"""

from oomguard.engines.base import Engine, EngineReading, ModelReading
from oomguard.engines.vllm import Vllm

ENGINES: dict[str, type[Engine]] = {Vllm.name: Vllm}
ENGINE_NAMES = tuple(ENGINES)

__all__ = ["ENGINES", "ENGINE_NAMES", "Engine", "EngineReading", "ModelReading"]
