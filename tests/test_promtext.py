"""The fast extractor must read exactly what the full Prometheus parser reads."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import VLLM_BODIES, vllm_body

from oomguard.common.promtext import ExpositionError, FamilyExtractor
from oomguard.exporter.engines.vllm.reader import VllmReader


def _reference(body: str, names: frozenset[str]) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name in names:
                found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


@pytest.mark.parametrize("body_file", sorted(p.name for p in VLLM_BODIES.glob("*.txt")))
def test_extract_matches_full_parser(body_file: str) -> None:
    body = vllm_body(body_file)
    extracted = FamilyExtractor(VllmReader.families).extract(body)
    got = {name: [(s.labels, s.value) for s in samples] for name, samples in extracted.items()}
    assert got == _reference(body, VllmReader.families)
    assert got, "the fixture must contain some of the families"


def test_prefix_of_a_longer_name_is_not_matched() -> None:
    body = 'vllm:num_requests_waiting_by_reason{reason="capacity"} 7\nvllm:num_requests_waiting 2\n'
    samples = FamilyExtractor({"vllm:num_requests_waiting"}).extract(body)
    assert [(s.name, s.value) for s in samples["vllm:num_requests_waiting"]] == [("vllm:num_requests_waiting", 2.0)]


def test_escaped_label_values_and_timestamps() -> None:
    body = 'x{a="q\\"uote",b="back\\\\slash",c="new\\nline"} 1.5 1700000000000\n'
    (sample,) = FamilyExtractor({"x"}).extract(body)["x"]
    assert sample.labels == {"a": 'q"uote', "b": "back\\slash", "c": "new\nline"}
    assert sample.value == 1.5


def test_special_values() -> None:
    body = "a NaN\nb +Inf\nc -1e3\n"
    found = FamilyExtractor({"a", "b", "c"}).extract(body)
    assert found["b"][0].value == float("inf") and found["c"][0].value == -1000.0


@pytest.mark.parametrize(
    "body",
    ['x{a="1"} notanumber\n', "x{a=1} 2\n", 'x{a="1" b="2"} 3\n'],
)
def test_malformed_lines_raise(body: str) -> None:
    with pytest.raises(ExpositionError):
        FamilyExtractor({"x"}).extract(body)


def test_windows_line_endings() -> None:
    found = FamilyExtractor({"x"}).extract('x{a="1"} 2\r\ny 3\r\n')
    assert found["x"][0].value == 2.0


def test_parsed_label_sets_are_kept_bounded_and_never_shared() -> None:
    """The second extraction of a body finds its label sets parsed already; each caller gets its own dict, and
    label texts that change at every scrape (a tenant's) empty the cache rather than grow it."""
    from oomguard.common import promtext

    extractor = FamilyExtractor(["m"])
    body = 'm{a="1",b="x\\"y"} 1\n'
    first = extractor.extract(body)["m"][0].labels
    first["a"] = "changed by a caller"
    again = extractor.extract(body)["m"][0].labels
    assert again == {"a": "1", "b": 'x"y'}
    for i in range(promtext._PARSED_MAX + 10):
        extractor.extract(f'm{{a="{i}",pad="{"p" * 200}"}} 1\n')
    assert len(promtext._PARSED) <= promtext._PARSED_MAX
    assert promtext.parsed_cache_chars() <= promtext.PARSED_CACHE_MAX_CHARS
    with pytest.raises(ExpositionError):
        extractor.extract('m{a="1",b=2} 1\n')  # malformed: raised every time, never kept
    with pytest.raises(ExpositionError):
        extractor.extract('m{a="1",b=2} 1\n')
