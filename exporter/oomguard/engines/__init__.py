"""The engine registry: the config's `engine:` -> its plugin (one package each under engines/).

To add an engine, write `engines/<name>/` (see docs/architecture.md) and add its plugin here.
"""

from oomguard.engines import llamacpp, sglang, tgi, triton, vllm
from oomguard.engines.base import EnginePlugin, EngineReader, FamilyRow

ENGINES: dict[str, EnginePlugin] = {
    plugin.name: plugin
    for plugin in (
        vllm.PLUGIN,
        sglang.PLUGIN,
        tgi.PLUGIN,
        triton.PLUGIN,
        llamacpp.PLUGIN,
    )
}
ENGINE_NAMES = tuple(ENGINES)

__all__ = ["ENGINES", "ENGINE_NAMES", "EnginePlugin", "EngineReader", "FamilyRow"]
