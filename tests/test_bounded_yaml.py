"""common/bounded_yaml.py: YAML as `yaml.safe_load` reads it, its aliases bounded (the files' readers and their
attacks are in tests/hostile/test_hostile_files.py)."""

from __future__ import annotations

import pytest
import yaml

from oomguard.common import bounded_yaml
from oomguard.common.bounded_yaml import MAX_ALIAS_NODES, YamlRefused, load

ORDINARY = {
    "empty": "",
    "a scalar": "9847\n",
    "a configuration": "web:\n  listen_address: ':9847'\ntargets:\n  - {name: a, url: 'http://127.0.0.1:8000'}\n",
    "anchors reused": "base: &b {x: 1, y: [2, 3]}\none: *b\ntwo: [*b, *b]\n",
    "merge keys": "defaults: &d {timeout_seconds: 2, gpus: [0]}\ntargets: [{<<: *d, name: a}, {<<: [*d], name: b}]\n",
    "an anchor on a scalar": "a: &s text\nb: *s\n",
}


@pytest.mark.parametrize("name", list(ORDINARY))
def test_a_document_reads_as_safe_load_reads_it(name: str) -> None:
    assert load(ORDINARY[name]) == yaml.safe_load(ORDINARY[name])


def test_a_document_without_aliases_has_no_bound_but_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what aliases add is bounded: a file's own nodes cost what its size does (the limit lowered here, so
    that the file stays small)."""
    monkeypatch.setattr(bounded_yaml, "MAX_ALIAS_NODES", 100)
    text = "items:\n" + "".join(f"  - {i}\n" for i in range(1000))
    assert load(text) == {"items": list(range(1000))}
    with pytest.raises(YamlRefused, match="limit of 100;"):
        load(text + "again: &a [1, 2, 3, 4, 5, 6, 7, 8, 9]\nmore: [" + ", ".join(["*a"] * 11) + "]\n")


def _aliases_adding(nodes_each: int, aliases: int, extra: str = "") -> str:
    """A list of `nodes_each` - 1 strings (one node for the list), then `aliases` aliases of it."""
    items = ", ".join(["x"] * (nodes_each - 1))
    return f"a: &a [{items}]\nb: [{', '.join(['*a'] * aliases)}]\n{extra}"


def test_aliases_may_add_up_to_the_limit_and_not_one_node_more() -> None:
    at_limit = _aliases_adding(1000, MAX_ALIAS_NODES // 1000)
    assert len(load(at_limit)["b"]) == MAX_ALIAS_NODES // 1000
    with pytest.raises(YamlRefused, match=rf"would add {MAX_ALIAS_NODES + 1:,} nodes .* limit of {MAX_ALIAS_NODES:,}"):
        load(_aliases_adding(1000, MAX_ALIAS_NODES // 1000, "c: &s one\nd: *s\n"))


def test_a_billion_laughs_is_refused_with_its_count() -> None:
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    # l8 alone is 9^8 strings and the lists above them; the text holds 9 strings, 9 lists, 9 keys and a mapping.
    expanded = sum(sum(9**j for j in range(i + 2)) for i in range(9)) + 9 + 1
    with pytest.raises(YamlRefused, match=rf"an alias bomb: .* would add {expanded - 28:,} nodes"):
        load("\n".join(lines))


def test_a_chain_of_doubling_aliases_is_refused_without_counting_to_its_end() -> None:
    """2^300 nodes: the sizes stop growing at 2^62 rather than be numbers of hundreds of digits."""
    text = "l0: &l0 [x, x]\n" + "".join(f"l{i}: &l{i} [*l{i - 1}, *l{i - 1}]\n" for i in range(1, 300))
    with pytest.raises(YamlRefused, match=r"would add over 4\.6e\+18 nodes"):
        load(text)


@pytest.mark.parametrize("text", ["a: &a [*a]\n", "a: &a {b: [1, {c: *a}]}\n", "a: &a {<<: *a}\n"])
def test_an_alias_inside_the_node_it_names_is_refused(text: str) -> None:
    with pytest.raises(YamlRefused, match=r"an alias refers to the node that holds it \(the anchor at line 1\)"):
        load(text)


def test_other_errors_are_pyyaml_s_own() -> None:
    for text in ("a: [\n", "a: *missing\n", "--- 1\n--- 2\n"):
        with pytest.raises(yaml.YAMLError) as raised:
            load(text)
        assert not isinstance(raised.value, YamlRefused)
