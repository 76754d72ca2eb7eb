"""The engine registry: the config's `engine:` -> its plugin (one package each under engines/).

To add an engine, write `engines/<name>/` (see docs/architecture.md) and add its plugin here.
"""

import difflib

from oomguard.common.excerpt import excerpt
from oomguard.exporter.engines import llamacpp, sglang, tgi, triton, vllm
from oomguard.exporter.engines.base import EnginePlugin, EngineReader, FamilyRow

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


def check_engine(name: str) -> None:
    """The configuration's `engine:` (config_loader.py): one of the plugins'."""
    if name not in ENGINES:
        close = difflib.get_close_matches(name, ENGINE_NAMES, n=1, cutoff=0.75) if len(name) <= 100 else []
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"unknown engine {excerpt(name)!r}; {hint}known engines: {', '.join(ENGINES)}")


def simulated_engines() -> list[str]:
    """The engines with a simulator (simulate/engines/<name>.py), read from the registry when asked."""
    return [name for name, plugin in ENGINES.items() if plugin.simulator is not None]


def check_simulated_engine(name: str) -> None:
    """The simulation's `engine:` (config_loader.py): one whose plugin has a simulator."""
    simulated = simulated_engines()
    if name not in simulated:
        raise ValueError(f"engine {name!r} has no simulator; choose one of: {', '.join(simulated)}")


__all__ = [
    "ENGINES", "ENGINE_NAMES", "EnginePlugin", "EngineReader", "FamilyRow", "check_engine", "check_simulated_engine",
    "simulated_engines",
]  # fmt: skip
