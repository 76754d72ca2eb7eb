"""True recipes (issue 49, item 5): the lists written by hand in README.md, docs/ and deploy/ that claim to name every
engine or every GPU source are held to the registries (engines/__init__.py's ENGINES, sources/gpu_source.py's
GPU_SOURCE_PLUGINS), so that adding one fails here, naming the file, the list and what it lacks, until each list
names it; every list of three engines or more is one of those or is said below to be a selection, and why; and
each recipe of docs/architecture.md names every file whose list its step touches (the alert's: every file
`oomguard generate` writes the alerts into).

An engine is written in a list by its `engine:` name or by its title's first word (`vllm` or vLLM, `llamacpp` or
llama.cpp, `triton` or Triton), a GPU source by its name or configuration key (NVML, `NvmlReader`, dcgm-exporter).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import yaml
from support import REPO

from oomguard.bundle.bundle_config import load_bundle_config
from oomguard.bundle.generate import write
from oomguard.exporter.config import Config
from oomguard.exporter.describe import describe
from oomguard.exporter.engines import ENGINES, EnginePlugin
from oomguard.exporter.sources.gpu_source import GPU_SOURCE_PLUGINS


def _all_engines() -> dict[str, EnginePlugin]:
    return dict(ENGINES)


def _local_engines() -> dict[str, EnginePlugin]:
    """The engines local discovery finds: those with a command-line matcher."""
    return {name: plugin for name, plugin in ENGINES.items() if plugin.matches is not None}


def _simulated_engines() -> dict[str, EnginePlugin]:
    return {name: plugin for name, plugin in ENGINES.items() if plugin.simulator is not None}


def _with_settings() -> dict[str, EnginePlugin]:
    """The engines whose command line gives settings (cmdline.py's `settings`)."""
    return {name: plugin for name, plugin in ENGINES.items() if plugin.settings is not None}


def engine_spellings(plugin: EnginePlugin) -> tuple[str, ...]:
    return (plugin.name, plugin.title.split()[0])


def _names_engine(text: str, plugin: EnginePlugin) -> bool:
    return any(re.search(rf"(?<![\w.-]){re.escape(s)}(?![\w-])", text, re.I) for s in engine_spellings(plugin))


def _names_family_prefix(text: str, plugin: EnginePlugin) -> bool:
    """A grep of the families read (docs/runbooks.md): one of its alternatives starts one of the engine's families."""
    alternatives = re.search(r"\^\(([^)]*)\)", text)
    prefixes = alternatives[1].split("|") if alternatives else []
    return any(family.startswith(p) for p in prefixes for family in plugin.reader.families)


@dataclass(frozen=True)
class EngineList:
    path: str
    start: str  # the text the list starts at
    end: str  # the first text after `start` that ends it ("\n": its line; "\n\n": its paragraph or table)
    engines: Callable[[], dict[str, EnginePlugin]] = _all_engines  # which engines it claims to name
    rows: bool = False  # a table: each engine the first cell of one of its rows
    names: Callable[[str, EnginePlugin], bool] = _names_engine


ENGINE_LISTS = [
    EngineList("README.md", "oomguard is for the SREs who run", "on GPUs"),
    EngineList("README.md", "finds the engines running on its host by their command lines", ";", _local_engines),
    EngineList("README.md", "`engines/` one package per engine", "`trend/`"),
    EngineList("docs/architecture.md", "| `exporter/engines/` | one package per engine", "):"),
    EngineList("docs/configuration.md", "| `engine` | `vllm` | which engine serves there:", "([engines.md]"),
    EngineList("docs/configuration.md", "`on`: find the local engines (", ")", _local_engines),
    EngineList(
        "docs/configuration.md", "| `engine` | `vllm` | (file only) | the simulated engine", "\n", _simulated_engines
    ),
    EngineList("docs/events.md", "else the time the engine wrote in its record header", ";\n"),
    EngineList("docs/engines.md", "| engine | families read |", "\n\n", rows=True),
    EngineList("docs/engines.md", "| engine | versions | figure |", "\n\n", rows=True),
    EngineList("docs/engines.md", "| engine | figures it gives |", "\n\n", rows=True),
    EngineList("docs/engines.md", "| engine | while it loads |", "\n\n", _simulated_engines, rows=True),
    EngineList("docs/engines.md", "| engine | command line matched |", "\n\n", _local_engines, rows=True),
    EngineList("docs/engines.md", "| engine | settings (flags) |", "\n\n", _with_settings, rows=True),
    EngineList("docs/runbooks.md", 'grep -E "^(', "\n", names=_names_family_prefix),
    EngineList("deploy/oomguard.yaml", "engine: vllm", "\n"),
    EngineList("deploy/kubernetes/oomguard.yaml", "engine: vllm", "\n"),
    EngineList("deploy/kubernetes-cluster/oomguard.yaml", "engine: vllm", "\n"),
]

# Lines that name three engines or more but are a selection, not all of them: where, and what they select.
SELECTIONS = [
    ("docs/engines.md", "or not yet (vLLM, TGI, Triton while they load)", "the engines that listen only once loaded"),
    ("docs/events.md", "| `record` (the default) |", "examples of record patterns"),
    ("docs/faults.md", "| values | KV cache use NaN", "the engines whose KV cache use is a gauge, and llama.cpp's"),
    ("docs/faults.md", "| vllm, SGLang, llama.cpp |", "the engines whose access log carries a request's path"),
    ("docs/performance.md", "- a **reserving engine**", "the engines that reserve their memory at start"),
    ("docs/runbooks.md", "(`setting`: vLLM `max_num_seqs`", "the engines with a concurrency cap"),
    ("docs/security.md", "(vLLM and SGLang print prompts through `repr`", "how each quotes a request's text"),
    ("docs/trend.md", "rises. vLLM, SGLang and TGI reserve their memory", "the engines that reserve their memory"),
]


def _segment(path: str, start: str, end: str) -> tuple[str, int]:
    """The text of a list, from `start` to the first `end` after it, and the line it starts on."""
    text = (REPO / path).read_text(encoding="utf-8")
    begin = text.find(start)
    assert begin >= 0, f"{path}: the list starting {start!r} is gone: update tests/test_recipes.py"
    stop = text.find(end, begin + len(start))
    assert stop >= 0, f"{path}: the list starting {start!r} has no end {end!r}: update tests/test_recipes.py"
    return text[begin:stop], text.count("\n", 0, begin) + 1


def _first_cells(table: str) -> list[str]:
    return [line.split("|")[1] for line in table.splitlines() if line.startswith("|") and not line.startswith("|--")]


@pytest.mark.parametrize("listing", ENGINE_LISTS, ids=lambda e: f"{e.path}: {e.start[:40]}")
def test_each_engine_list_names_every_registered_engine(listing: EngineList) -> None:
    text, line = _segment(listing.path, listing.start, listing.end)
    items = _first_cells(text) if listing.rows else [text]
    missing = [
        f"{plugin.name} ({plugin.title})"
        for plugin in listing.engines().values()
        if not any(listing.names(item, plugin) for item in items)
    ]
    assert missing == [], f"{listing.path}:{line}, the list starting {listing.start!r}, lacks {', '.join(missing)}"


def _text_files() -> Iterable[Path]:
    """What a user reads: README.md, docs/ (docs/metrics.md is generated from the registry), deploy/."""
    yield REPO / "README.md"
    yield from (p for p in sorted((REPO / "docs").glob("*.md")) if p.name != "metrics.md")
    yield from (p for p in sorted((REPO / "deploy").rglob("*")) if p.is_file() and p.suffix in (".yaml", ".yml"))


def test_every_list_of_three_engines_or_more_is_checked_or_said_to_be_a_selection() -> None:
    """A new list of engines written by hand is either held to the registry (ENGINE_LISTS) or named a selection."""
    checked: dict[str, set[int]] = {}
    for listing in ENGINE_LISTS:
        text, line = _segment(listing.path, listing.start, listing.end)
        checked.setdefault(listing.path, set()).update(range(line, line + text.count("\n") + 1))
    unaccounted = []
    for path in _text_files():
        relative = str(path.relative_to(REPO))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            named = [plugin.name for plugin in ENGINES.values() if _names_engine(line, plugin)]
            if len(named) < 3 or number in checked.get(relative, set()):
                continue
            if not any(relative == where and what in line for where, what, _ in SELECTIONS):
                unaccounted.append(f"{relative}:{number} names {', '.join(named)}: {line.strip()[:100]}")
    assert unaccounted == [], "add each to ENGINE_LISTS (all engines) or SELECTIONS (why not all):\n" + "\n".join(
        unaccounted
    )


def test_every_selection_is_still_there() -> None:
    for path, what, why in SELECTIONS:
        assert what in (REPO / path).read_text(encoding="utf-8"), f"{path}: the selection ({why}) {what!r} is gone"


def test_check_configs_local_engines_are_the_registrys() -> None:
    """`oomguard check-config`'s discovery line is generated from the registry: a new engine appears unwritten."""
    line = next(x for x in describe(Config()) if x.startswith("engines:"))
    listed = re.search(r"by their command lines \(([^)]*)\)", line)[1]
    assert listed == ", ".join(engine_spellings(p)[1] for p in _local_engines().values())
    assert "llama.cpp" in listed  # each engine by its title's first word


def test_check_configs_local_engines_follow_a_new_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ENGINES, "sixth", replace(ENGINES["vllm"], name="sixth", title="Sixth Engine"))
    line = next(x for x in describe(Config()) if x.startswith("engines:"))
    assert ", Sixth)" in line


# The lists of GPU sources that claim every registered one (docs/configuration.md's sections, model.GPU_SOURCES and
# the example configurations are tests/sources/test_gpu_sources.py's).
GPU_SOURCE_LISTS = [
    ("README.md", "`sources/` ", "engine targets", False),
    ("docs/architecture.md", "first registered source its configuration turns on", "`nvml.enabled`)", False),
    ("docs/architecture.md", "| `exporter/sources/` |", "\n", False),
    ("docs/architecture.md", "| who | runs on | what |", "\n\n", True),
    ("docs/architecture.md", "A GPU source reads every GPU's memory", "are registered", False),
]


def _names_gpu_source(text: str, name: str, key: str) -> bool:
    return any(re.search(rf"(?<![a-z]){re.escape(s)}", text, re.I) for s in (name, key))


@pytest.mark.parametrize(("path", "start", "end", "rows"), GPU_SOURCE_LISTS, ids=lambda x: str(x)[:40])
def test_each_gpu_source_list_names_every_registered_source(path: str, start: str, end: str, rows: bool) -> None:
    text, line = _segment(path, start, end)
    items = _first_cells(text) if rows else [text]
    missing = [
        name
        for name, plugin in GPU_SOURCE_PLUGINS.items()
        if not any(_names_gpu_source(item, name, plugin.config_key) for item in items)
    ]
    assert missing == [], f"{path}:{line}, the list starting {start!r}, lacks {', '.join(missing)}"


def _recipe(title: str) -> str:
    """A recipe's section of docs/architecture.md, to the next section or the page's end."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    begin = text.find(f"## {title}\n")
    assert begin >= 0, f"docs/architecture.md: no section {title!r}"
    stop = text.find("\n## ", begin + 1)
    return text[begin : stop if stop >= 0 else len(text)]


def _names_file(recipe: str, path: str) -> bool:
    return path in recipe or (path == "docs/architecture.md" and "this page" in recipe)


def test_the_engine_recipe_names_every_file_with_a_list_of_engines() -> None:
    recipe = _recipe("How to add an engine")
    files = sorted({listing.path for listing in ENGINE_LISTS})
    assert [path for path in files if not _names_file(recipe, path)] == []


def test_the_gpu_source_recipe_names_every_file_with_a_list_of_gpu_sources() -> None:
    recipe = _recipe("How to add a GPU source")
    files = sorted({path for path, *_ in GPU_SOURCE_LISTS})
    assert [path for path in files if not _names_file(recipe, path)] == []


def test_the_alert_recipe_names_every_file_the_alerts_are_generated_into(tmp_path: Path) -> None:
    """A new alert is regenerated into rules/ and into the PrometheusRule copies the Kubernetes bases load."""
    written = write(load_bundle_config(None), tmp_path)
    rules = yaml.safe_load((REPO / "rules" / "oomguard-alerts.yaml").read_text(encoding="utf-8"))
    paging = [
        r["alert"] for g in rules["groups"] for r in g["rules"] if r.get("labels", {}).get("severity") == "critical"
    ]
    assert paging, "no paging alert in rules/oomguard-alerts.yaml"
    holding = sorted(
        str(path.relative_to(tmp_path))
        for path in written
        if any(a in path.read_text(encoding="utf-8") for a in paging)
    )
    assert "rules/oomguard-alerts.yaml" in holding
    recipe = _recipe("How to add an alert")
    assert [path for path in holding if path not in recipe] == []
