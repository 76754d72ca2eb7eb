"""YAML read with its aliases bounded: an alias bomb ("billion laughs") is refused before it is built.

PyYAML's `safe_load` builds an alias (`*name`) as a second reference to the anchored node's object, so 1 KB of
nested aliases loads at once as a few hundred objects; but whatever walks the result afterwards (pydantic's
validation, a merge, an error message that lists each bad item, `repr`) follows every reference, and 9 levels of
9 aliases are 387 million items: minutes and gigabytes before any error. Here the document is composed first (its
nodes, as many as its text holds), the nodes its aliases add are counted on that graph, each node once, and the
document is refused when they pass `MAX_ALIAS_NODES`, or when an alias sits inside the node it names (a document
without end), before any Python object is made of it. A document without aliases is read as `yaml.safe_load` reads
it: its cost is its size, which each caller bounds (or not) as before.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

# Nodes (scalars, lists, mappings, a mapping's keys) that aliases may add to a document, each alias counted as the
# whole node it names. A configuration that reuses a block of settings with `<<: *defaults` across a few hundred
# targets adds a few thousand; validation walks this many in a fraction of a second.
MAX_ALIAS_NODES = 100_000
# Sizes stop growing here: a chain of a million doubling aliases gives no number millions of digits long.
_SATURATED = 1 << 62


class YamlRefused(yaml.YAMLError):
    """The document is YAML but is refused whole: an alias bomb, or an alias inside the node it names."""


def load(text: str) -> Any:
    """The document in `text`, as `yaml.safe_load` gives it; YamlRefused (a `yaml.YAMLError`, one line) when its
    aliases would add more than MAX_ALIAS_NODES nodes or refer to a node that holds them. Other `yaml.YAMLError`s
    and RecursionError (nesting hundreds deep) as `yaml.safe_load` raises them."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_aliases(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_aliases(root: Node) -> None:
    """Each node's size with its aliases expanded (itself and all below it), computed once per node, without
    recursion; the nodes aliases add are the root's size less the nodes the text holds."""
    size: dict[int, int] = {}
    open_nodes: set[int] = set()  # the nodes being sized: the path from the root to the node at hand
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_sized = stack.pop()
        key = id(node)
        if children_sized:
            open_nodes.discard(key)
            size[key] = min(_SATURATED, 1 + sum(size[id(child)] for child in _children(node)))
            continue
        if key in size:
            continue  # an alias of a node sized already
        if key in open_nodes:
            line = node.start_mark.line + 1 if node.start_mark else 0
            raise YamlRefused(
                f"an alias refers to the node that holds it (the anchor at line {line}): the document would never "
                "end; write the value out instead"
            )
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node))
    total = size[id(root)]
    added = total - len(size)  # each node of the text counted once, the rest is what the aliases repeat
    if added > MAX_ALIAS_NODES:
        count = f"over {_SATURATED:.1e}" if total >= _SATURATED else f"{added:,}"
        raise YamlRefused(
            f"an alias bomb: its aliases (*name) would add {count} nodes (values and keys) to the document, over "
            f"the limit of {MAX_ALIAS_NODES:,}; write the repeated values out, or repeat them less"
        )
