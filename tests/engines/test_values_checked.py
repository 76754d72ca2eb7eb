"""Which of a reading's fields engines/base.py checks: those its class declares in `CHECKED`, and no number field
left out of the declaration, whatever its annotation's spelling (`float | None`, `Optional[float]`, `float`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import pytest

from oomguard.exporter.engines.base import Rejected, checked_fields, read_checked
from oomguard.exporter.model import EngineReading, ModelReading


@dataclass(frozen=True)
class _Declared:
    CHECKED: ClassVar[tuple[str, ...]] = ("b", "a")
    name: str = ""
    a: float | None = None
    b: int = 0


@dataclass(frozen=True)
class _Optional:
    CHECKED: ClassVar[tuple[str, ...]] = ("a",)
    a: float | None = None
    b: Optional[float] = None  # noqa: UP045 (a spelling a check by annotation text misses)


@dataclass(frozen=True)
class _Plain:
    CHECKED: ClassVar[tuple[str, ...]] = ()
    a: float = 0.0


@dataclass(frozen=True)
class _NotANumber:
    CHECKED: ClassVar[tuple[str, ...]] = ("name",)
    name: str = ""


def test_the_declared_number_fields_are_checked_in_the_models_order() -> None:
    assert checked_fields(_Declared) == ("a", "b")


@pytest.mark.parametrize("reading", [_Optional, _Plain])
def test_a_number_field_left_undeclared_fails_loudly(reading: type) -> None:
    with pytest.raises(TypeError, match=r"undeclared \[.*'(b|a)'"):
        checked_fields(reading)


def test_a_number_field_checked_on_its_own_is_named_so() -> None:
    assert checked_fields(_Optional, own=("b",)) == ("a",)


def test_a_declared_field_that_is_no_number_fails_loudly() -> None:
    with pytest.raises(TypeError, match=r"not a number field \['name'\]"):
        checked_fields(_NotANumber)


def test_every_number_field_of_the_readings_is_checked() -> None:
    """Each declared field of a real reading is dropped when negative: the declaration is the one read."""
    model = ModelReading("m", **{name: -1.0 for name in ModelReading.CHECKED})
    engine = EngineReading((model,), **{name: -1.0 for name in EngineReading.CHECKED})

    class Reader:
        def read(self, samples: object) -> EngineReading:
            return engine

    rejected = Rejected()
    checked = read_checked(Reader(), {}, rejected)  # type: ignore[arg-type]
    assert rejected.counts == {"negative": len(ModelReading.CHECKED) + len(EngineReading.CHECKED)}
    assert all(getattr(checked, name) is None for name in EngineReading.CHECKED)
    assert all(getattr(checked.models[0], name) is None for name in ModelReading.CHECKED)
