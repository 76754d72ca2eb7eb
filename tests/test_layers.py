"""The package's rooms stand on floors, and no import runs back up one (docs/architecture.md, "Layers").

A room is a module or package in one of the package's folders of rooms (`exporter/config.py`,
`exporter/engines/`, `common/`'s modules...) or a product of its own at the top (`bundle/`, `diagnose/`,
`simulate/`, `drill/`, `backtest/`, `cli.py`). Its imports of other rooms are read from the source, every
import counted: at module level, in a function, under TYPE_CHECKING (a type named there is a dependency all
the same). The rooms must form no cycle; each room's floor is one above the highest room it imports. The
floors are printed, to be compared with the doc.
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import pytest

import oomguard

PACKAGE = Path(oomguard.__file__).parent


# Folders that hold rooms rather than being one: the exporter's parts, and the parts every product shares.
FOLDERS = ("exporter", "common")
# The products that run offline, beside the exporter: it imports none of them.
OFFLINE_TOOLS = ("diagnose", "drill", "backtest")
# The products from the bottom up (the product grain, docs/architecture.md "The folders"): each imports only those
# below it. The exporter stands on the shared parts alone: `serve` runs without the bundle, the simulator or an
# offline tool; whoever builds it (cli.py, the drill) hands it a simulation (simulate/host.py) and thresholds.
PRODUCTS = ("common", "exporter", "bundle", "simulate", "diagnose", "backtest", "drill", "cli", "__main__")
MAX_FLOOR = 10  # 11 floors, 0 to 10


def room_of(module: str) -> str | None:
    """`oomguard.exporter.events.runner` -> `exporter/events`, `oomguard.drill.run` -> `drill`; the package
    itself (its `__version__`) and a folder's `__init__` are no room."""
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "oomguard":
        return None
    if parts[1] in FOLDERS:
        return f"{parts[1]}/{parts[2]}" if len(parts) > 2 else None
    return parts[1]


def is_room(name: str) -> bool:
    """A module or package of its own (not a name of the package's, as `__version__`)."""
    return (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file()


def imports() -> dict[str, dict[str, set[str]]]:
    """room -> the rooms it imports -> the modules' imports that make each arrow (for the error)."""
    arrows: dict[str, dict[str, set[str]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        here = room_of(module)
        if here is None:
            continue
        arrows.setdefault(here, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from oomguard.exporter import web` imports the room `exporter/web`, not the folder.
                named = [node.module]
                if room_of(node.module) is None:
                    named = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            else:
                continue
            for name in named:
                there = room_of(name)
                if there is not None and there != here and is_room(there):
                    arrows[here].setdefault(there, set()).add(f"{module} imports {name}")
    return arrows


def floors(arrows: dict[str, dict[str, set[str]]]) -> dict[str, int]:
    """Each room's floor: 0 for a room that imports no other, else one above the highest it imports. Raises
    naming a cycle's arrows when there is one."""
    floor: dict[str, int] = {}
    visiting: list[str] = []

    def visit(room: str) -> int:
        if room in floor:
            return floor[room]
        if room in visiting:
            cycle = [*visiting[visiting.index(room) :], room]
            steps = [sorted(arrows[a][b])[0] for a, b in itertools.pairwise(cycle)]
            pytest.fail("an import runs back up a floor: " + " -> ".join(cycle) + "\n  " + "\n  ".join(steps))
        visiting.append(room)
        floor[room] = 1 + max((visit(other) for other in arrows.get(room, {})), default=-1)
        visiting.pop()
        return floor[room]

    for room in sorted(arrows):
        visit(room)
    return floor


def test_no_import_runs_back_up_a_floor() -> None:
    found = floors(imports())
    by_floor: dict[int, list[str]] = {}
    for room, level in found.items():
        by_floor.setdefault(level, []).append(room)
    for level in sorted(by_floor):
        print(f"floor {level}: {', '.join(sorted(by_floor[level]))}")
    assert all(level == 0 for room, level in found.items() if room.startswith("common/"))
    assert found["exporter/model"] == 0  # plain data at the bottom
    assert found["exporter/config"] <= 1  # plain data on the leaves: the parts check their own sections
    assert max(found.values()) <= MAX_FLOOR, f"{max(found.values()) + 1} floors"


def test_the_exporter_imports_no_offline_tool() -> None:
    """`serve` runs without diagnose, the drill or the backtest: none of the exporter's rooms imports them (the
    status page judges with the bundle's thresholds, `bundle/thresholds.py`, as diagnose does)."""
    arrows = imports()
    reached = {
        arrow
        for room, theirs in arrows.items()
        if room.startswith("exporter/")
        for there, made_by in theirs.items()
        if there in OFFLINE_TOOLS
        for arrow in made_by
    }
    assert not reached, sorted(reached)


def product_of(room: str) -> str:
    """`exporter/events` -> `exporter`, `drill` -> `drill`."""
    return room.split("/", 1)[0]


def test_no_product_imports_one_above_it() -> None:
    arrows = imports()
    assert {product_of(room) for room in arrows} <= set(PRODUCTS), "a product missing from PRODUCTS"
    rank = {product: level for level, product in enumerate(PRODUCTS)}
    upward = sorted(
        arrow
        for room, theirs in arrows.items()
        for there, made_by in theirs.items()
        if rank[product_of(there)] > rank[product_of(room)]
        for arrow in made_by
    )
    assert not upward, upward


def test_the_exporter_imports_neither_the_bundle_nor_the_simulator() -> None:
    """The exporter knows no simulator (a simulation is handed to its runtime, `Runtime(simulated=...)`) and reads no
    bundle configuration (the status page's thresholds are handed to it, common/thresholds.py)."""
    arrows = imports()
    reached = sorted(
        arrow
        for room, theirs in arrows.items()
        if product_of(room) == "exporter"
        for there, made_by in theirs.items()
        if product_of(there) in ("bundle", "simulate")
        for arrow in made_by
    )
    assert not reached, reached


def test_a_cycle_is_found_and_named() -> None:
    """The check itself: two rooms importing each other fail it, naming the arrows."""
    with pytest.raises(pytest.fail.Exception, match="a -> b -> a"):
        floors({"a": {"b": {"oomguard.a.x imports oomguard.b"}}, "b": {"a": {"oomguard.b.y imports oomguard.a"}}})


def test_pod_discovery_reaches_the_event_runner_through_one_door() -> None:
    """sources/ imports of events/ are `events/kubernetes.py` only (`PodEvents`, the API's times): the rest of
    the event machinery (the runner, the registry, the sources' protocol) is behind it (docs/architecture.md)."""
    arrows = imports()["exporter/sources"]["exporter/events"]
    assert {arrow.split(" imports ")[1] for arrow in arrows} == {"oomguard.exporter.events.kubernetes"}, sorted(arrows)


def test_the_architecture_map_shows_the_floors_as_they_are() -> None:
    """docs/architecture.md's table of floors is the map a newcomer reads: it must say what the imports say."""
    doc = (Path(__file__).parents[1] / "docs" / "architecture.md").read_text()
    table = doc[doc.index("| floor | rooms |") :].split("\n\n", 1)[0]
    written: dict[str, int] = {}
    for row in table.splitlines()[2:]:
        level, rooms = (cell.strip() for cell in row.strip("|").split("|"))
        for room in re.findall(r"`([a-z_/]+?)(?:\.py|/)`", rooms):
            written[room] = int(level)
    found = floors(imports())
    # Written beside cli.py, "and __main__.py above it".
    assert written.pop("__main__") == found["cli"] and found.pop("__main__") == found["cli"] + 1
    assert written == found
