"""An engine's figures are declared once, in model.ENGINE_FIGURES, and that one declaration is what every part reads:
the exposition exports each (its MetricSpec built from it, its sample written from the reading's field it names),
docs/metrics.md documents each, engines/base.py checks each against its declared bounds and reports it in
oomguard_engine_figure_read where the alerts read it; a figure that names no field of its reading fails loudly."""

from __future__ import annotations

import dataclasses
import math

import pytest

from oomguard.exporter.docs import metrics_markdown
from oomguard.exporter.engines.base import Rejected, checked_fields, figures_read, read_checked
from oomguard.exporter.exposition import METRICS, engine
from oomguard.exporter.exposition.encoder import Exposition
from oomguard.exporter.exposition.spec import CONDITIONAL, ENGINE_UP, POD_LABELS
from oomguard.exporter.model import (
    ABOVE_ZERO_TO_ONE,
    BOUNDS,
    ENGINE_FIGURES,
    FIGURES,
    ZERO_TO_ONE,
    EngineFigure,
    EngineReading,
    ModelReading,
    TargetReading,
)

IDS = [figure.field for figure in ENGINE_FIGURES]


def _reading(figure: EngineFigure, value: float) -> EngineReading:
    """A reading with this figure alone set to `value`."""
    if figure.per_model:
        return EngineReading((ModelReading("m", **{figure.field: value}),))
    return EngineReading((ModelReading("m"),), **{figure.field: value})


def _value(figure: EngineFigure, reading: EngineReading) -> float | None:
    return getattr(reading.models[0] if figure.per_model else reading, figure.field)


def _labels(figure: EngineFigure) -> str:
    names = ("target", "model_name") if figure.per_model else ("target",)
    return ", ".join(f"`{label}`" for label in (*names, *POD_LABELS))


def _checked(reading: EngineReading) -> tuple[EngineReading, Rejected]:
    class Reader:
        def read(self, samples: object) -> EngineReading:
            return reading

    rejected = Rejected()
    return read_checked(Reader(), {}, rejected), rejected  # type: ignore[arg-type]


def test_the_declarations_are_well_formed() -> None:
    assert len({f.field for f in ENGINE_FIGURES}) == len(ENGINE_FIGURES)
    assert len({f.metric for f in ENGINE_FIGURES}) == len(ENGINE_FIGURES)
    for figure in ENGINE_FIGURES:
        assert figure.metric.startswith("engine_") and figure.kind in ("gauge", "counter"), figure
        assert figure.bounds in BOUNDS and figure.help, figure
    assert len(set(FIGURES)) == len(FIGURES)


def test_each_reading_checks_exactly_its_declared_figures() -> None:
    assert checked_fields(ModelReading) == tuple(f.field for f in ENGINE_FIGURES if f.per_model)
    assert checked_fields(EngineReading) == tuple(f.field for f in ENGINE_FIGURES if not f.per_model)


@pytest.mark.parametrize("figure", ENGINE_FIGURES, ids=IDS)
def test_every_figure_is_exported_as_declared(figure: EngineFigure) -> None:
    [spec] = [s for s in METRICS if s.name == f"oomguard_{figure.metric}"]
    labels = ("target", "model_name") if figure.per_model else ("target",)
    assert (spec.kind, spec.unit, spec.help, spec.section) == (figure.kind, figure.unit, figure.help, engine.SECTION)
    assert spec.labels == (*labels, *POD_LABELS)
    assert spec.presence == (CONDITIONAL if figure.conditional else ENGINE_UP)


@pytest.mark.parametrize("figure", ENGINE_FIGURES, ids=IDS)
def test_every_figure_is_written_from_its_field(figure: EngineFigure) -> None:
    target = TargetReading("t", "vllm", "http://x", (0,), True, "up", 0.0, engine_reading=_reading(figure, 0.25))
    out = Exposition(engine.METRICS, frozenset(engine.METRICS))
    engine.add(out, target)
    name = f"oomguard_{figure.metric}" + ("_total" if figure.kind == "counter" else "")
    model = 'model_name="m",' if figure.per_model else ""
    written = [line for line in out.render().decode().splitlines() if not line.startswith("#")]
    assert written.count(f'{name}{{container="",{model}namespace="",pod="",target="t"}} 0.25') == 1
    # ...and no other figure's series: each is written from its own field alone.
    others = {f"oomguard_{f.metric}" for f in ENGINE_FIGURES if f is not figure}
    assert not [line for line in written if line.split("{")[0].removesuffix("_total") in others]


@pytest.mark.parametrize("figure", ENGINE_FIGURES, ids=IDS)
def test_every_figure_is_documented(figure: EngineFigure) -> None:
    name = f"oomguard_{figure.metric}" + ("_total" if figure.kind == "counter" else "")
    # Its row of the section's table (name, type, unit, labels, meaning); the engines' tables of families name it too.
    rows = [line for line in metrics_markdown().splitlines() if line.startswith(f"| `{name}` | {figure.kind} |")]
    assert rows == [f"| `{name}` | {figure.kind} | {figure.unit or '-'} | {_labels(figure)} | {figure.help} |"]


@pytest.mark.parametrize("figure", ENGINE_FIGURES, ids=IDS)
def test_every_figure_is_checked_against_its_bounds(figure: EngineFigure) -> None:
    dropped = {-1.0: "negative", math.nan: "non_finite"}
    if figure.bounds in (ZERO_TO_ONE, ABOVE_ZERO_TO_ONE):
        dropped[1.5] = "out_of_range"
    if figure.bounds == ABOVE_ZERO_TO_ONE:
        dropped[0.0] = "out_of_range"
    for value, reason in dropped.items():
        checked, rejected = _checked(_reading(figure, value))
        assert _value(figure, checked) is None and rejected.counts == {reason: 1}, value
    kept = 0.5 if figure.bounds != ABOVE_ZERO_TO_ONE else 1.0
    checked, rejected = _checked(_reading(figure, kept))
    assert _value(figure, checked) == kept and not rejected


@pytest.mark.parametrize("figure", [f for f in ENGINE_FIGURES if f.figure_read_as], ids=lambda f: f.figure_read_as)
def test_a_figure_the_alerts_read_is_told_read_from_its_field(figure: EngineFigure) -> None:
    assert figures_read([figure.figure_read_as], _reading(figure, 1.0)) == {figure.figure_read_as: True}
    assert figures_read([figure.figure_read_as], EngineReading((ModelReading("m"),))) == {figure.figure_read_as: False}


def test_a_figure_declared_without_its_reading_field_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A figure added to the table before its field (or with the field misspelt): engines/base.py's import fails."""
    misspelt = EngineFigure(
        field="kv_cache_usage_percent", per_model=True, metric="engine_x", kind="gauge", unit="", help="x"
    )
    declared = (*ENGINE_FIGURES, misspelt)
    monkeypatch.setattr(ModelReading, "CHECKED", tuple(f.field for f in declared if f.per_model))
    with pytest.raises(TypeError, match=r"no field of ModelReading \['kv_cache_usage_percent'\]"):
        checked_fields(ModelReading)


def test_a_number_field_declared_as_no_figure_fails_naming_it() -> None:
    """A field added to a reading without its row in the table: it would be neither checked nor exported."""
    extended = dataclasses.make_dataclass(
        "ModelReading", [("kv_cache_free_blocks", "float | None", None)], bases=(ModelReading,), frozen=True
    )
    with pytest.raises(TypeError, match=r"undeclared \['kv_cache_free_blocks'\]"):
        checked_fields(extended)
