"""Fuzzing configuration files: the exporter's (config.load_config) and the bundle's (bundle.bundle_config).

Whatever the file holds (random YAML-ish text, random nested mappings shaped like the models, bytes that
are not UTF-8), and whatever the command line and environment override, the result is a valid
configuration or a ConfigError whose message names the file; never a raw UnicodeDecodeError,
TypeError, KeyError, RecursionError...
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import event, example, given
from hypothesis import strategies as st
from pydantic import BaseModel
from support import REPO

from oomguard.bundle.bundle_config import BundleConfig, defaults_text, load_bundle_config
from oomguard.exporter.config import Config, ConfigError
from oomguard.simulate.checks import load_config
from tests.fuzz.fuzz_strategies import with_invalid_utf8

_FILES = itertools.count()

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(
        ["http://127.0.0.1:8000", "http://[::1", "vllm", "cuda_oom", "a{4294967296}", "(", "5m", ":9847", ".nan"]
    ),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


def _model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds, directly, in a tuple or in an Optional."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for arg in getattr(annotation, "__args__", ()) if (m := _model(arg)) is not None), None)


def shaped_like(model: type[BaseModel], depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """Mappings with the model's keys (a few unknown ones too): nested models nest, other values random."""
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for name, field in model.model_fields.items():
        nested = _model(field.annotation)
        value: st.SearchStrategy[Any] = JSON
        if nested is not None and depth < 3:
            shaped = shaped_like(nested, depth + 1)
            value = st.one_of(shaped, st.lists(shaped, max_size=2), JSON)
        fields[field.alias or name] = value
    keys = st.sampled_from(sorted(fields)) | st.text(max_size=10)
    chosen = st.lists(keys, unique=True, max_size=6)
    return chosen.flatmap(lambda names: st.fixed_dictionaries({k: fields.get(k, JSON) for k in names}))


EXAMPLE = yaml.safe_load((REPO / "deploy" / "oomguard.yaml").read_text(encoding="utf-8"))
BUNDLE_DEFAULTS = yaml.safe_load(defaults_text())


def _paths(node: Any, at: tuple = ()) -> list[tuple]:
    """Every key path of a document: where a mutation may go."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    return [at, *(p for key, child in items for p in _paths(child, (*at, key)))]


@st.composite
def mutated(draw: st.DrawFn, document: dict[str, Any]) -> dict[str, Any]:
    """A valid document with a few of its values replaced by random ones, or deleted: one wrong thing deep
    inside, where random documents rarely get."""
    doc = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from([p for p in _paths(doc) if p]))
        node = doc
        try:
            for key in path[:-1]:
                node = node[key]
            if draw(st.integers(0, 3)) == 0:
                del node[path[-1]]
            else:
                node[path[-1]] = draw(JSON)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation replaced the path
    return doc


YAMLISH = st.text(alphabet=st.sampled_from([*"abc:-[]{},'\"&*!|>#?%@` \n\t.0123456789\\", "\u00e9", "\ufeff"]))
KNOWN_KEYS = st.sampled_from(
    ["targets:", "- url:", "  logs:", "nvml:", "  enabled:", "events:", "  patterns:", "web:", "trend:", "alerts:"]
)
YAML_LINES = st.lists(st.one_of(KNOWN_KEYS, YAMLISH.map(lambda t: t[:30])), max_size=12).map("\n".join)


def write(directory: Path, data: bytes) -> Path:
    path = directory / f"config-{next(_FILES)}.yaml"
    path.write_bytes(data)
    return path


def load(loader, path: Path, *args: Any) -> str:
    """Load `path`: "valid", or "refused" after checking that the ConfigError names the file."""
    try:
        loader(path, *args)
    except ConfigError as exc:
        assert str(path) in str(exc), exc
        return "refused"
    return "valid"


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("configs")


@given(
    document=st.one_of(
        YAML_LINES.map(str.encode),
        st.one_of(shaped_like(Config), mutated(EXAMPLE)).map(lambda d: yaml.safe_dump(d, allow_unicode=True).encode()),
        st.binary(max_size=80),
    )
)
@example(document=b"events:\n  patterns:\n  - kind: cuda_oom\n    regex: 'a{4294967296}'\n")
@example(document=b"[" * 5000)
def test_a_configuration_file_is_valid_or_refused_with_its_name(directory: Path, document: bytes) -> None:
    event(load(load_config, write(directory, document)))


@given(
    document=st.one_of(shaped_like(Config), mutated(EXAMPLE)).map(lambda d: yaml.safe_dump(d).encode()),
    overrides=st.dictionaries(
        st.sampled_from(
            ["web.listen_address", "simulation.scenario", "simulation.gpus", "simulation.time_scale", "nvml.enabled"]
        ),
        SCALARS,
        max_size=3,
    ),
)
@example(document=b"web:\n", overrides={"web.listen_address": ":1234"})
def test_overrides_over_any_file_are_valid_or_refused(directory: Path, document: bytes, overrides) -> None:
    """The command line and the environment (cli._overrides) set dotted keys over whatever the file holds."""
    event(load(load_config, write(directory, document), overrides))


@given(
    document=st.one_of(shaped_like(BundleConfig), mutated(BUNDLE_DEFAULTS)).map(lambda d: yaml.safe_dump(d).encode())
    | YAML_LINES.map(str.encode)
)
@example(document=b"[" * 5000)
def test_a_bundle_configuration_is_valid_or_refused_with_its_name(directory: Path, document: bytes) -> None:
    event(load(load_bundle_config, write(directory, document)))


@given(document=YAML_LINES.map(str.encode).flatmap(with_invalid_utf8), bundle=st.booleans())
@example(document=b"targets:\n  - url: http://caf\xe9:8000\n", bundle=False)  # Latin-1, as some editors save
def test_a_file_that_is_not_utf8_is_refused_with_where_and_the_fix(
    directory: Path, document: bytes, bundle: bool
) -> None:
    path = write(directory, document)
    with pytest.raises(ConfigError) as caught:
        (load_bundle_config if bundle else load_config)(path)
    message = str(caught.value)
    with pytest.raises(UnicodeDecodeError) as bad:
        document.decode("utf-8")
    assert str(path) in message and "save it as UTF-8" in message, message
    assert f"byte {bad.value.start}" in message, message  # where the first byte that is not UTF-8 is
