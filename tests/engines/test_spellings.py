"""Every engine's names in both spellings: `vllm:num_requests_waiting` and `vllm_num_requests_waiting`.

Some prometheus_client versions, OpenMetrics' underscore escaping and relabelling proxies serve an
engine's colon names with underscores: the same figures must be read either way (the extractor
maps the underscore spelling back, for every engine at once). Real bodies from tests/fixtures/,
each rewritten in the other spelling.
"""

from __future__ import annotations

import re

import pytest
from support import FIXTURES

from oomguard.common.promtext import FamilyExtractor
from oomguard.exporter.engines import ENGINES

BODIES = sorted(
    (engine, path.name)
    for engine in ENGINES
    for path in (FIXTURES / engine).glob("*")
    if path.suffix in (".prom", ".txt") and engine in ENGINES
)


def underscored(body: str) -> str:
    """The body as a proxy that escapes colons would serve it: every metric name's colons as underscores."""
    return re.sub(r"^(# (?:HELP|TYPE) )?([a-zA-Z_][a-zA-Z0-9_:]*)", lambda m: (m[1] or "") + m[2].replace(":", "_"),
                  body, flags=re.M)  # fmt: skip


def read(engine: str, body: str):
    reader = ENGINES[engine].reader()
    return reader.read(FamilyExtractor(reader.families).extract(body))


def test_every_engine_has_a_recorded_body() -> None:
    assert {engine for engine, _ in BODIES} == set(ENGINES)


@pytest.mark.parametrize(("engine", "name"), BODIES)
def test_a_real_body_reads_the_same_in_both_spellings(engine: str, name: str) -> None:
    body = (FIXTURES / engine / name).read_text()
    colons = [n for n in ENGINES[engine].reader().families if ":" in n]
    if not colons:
        pytest.skip(f"{engine}'s names have no colon ({sorted(ENGINES[engine].reader().families)[:3]}...)")
    other = underscored(body)
    assert other != body and not re.search(r"^[a-z_]+:", other, re.M)  # the rewrite did rewrite
    assert read(engine, other) == read(engine, body)


def test_a_body_with_both_spellings_of_a_series_reads_it_once() -> None:
    body = (FIXTURES / "vllm" / "vllm-0.32.0-cpu-under-load.txt").read_text()
    # A proxy that adds the underscore spelling of each colon name beside the original.
    added = [line for line in underscored(body).splitlines() if line.startswith("vllm_")]
    both = body + "\n" + "\n".join(added) + "\n"
    assert added
    assert read("vllm", both) == read("vllm", body)


def test_llamacpp_older_builds_kv_gauge_is_read() -> None:
    """llama.cpp removed llamacpp:kv_cache_usage_ratio; where an older build still writes it, it is read (the
    current builds' KV use comes from /slots)."""
    body = (FIXTURES / "llamacpp" / "metrics.prom").read_text()
    assert read("llamacpp", body).models[0].kv_cache_usage_ratio is None
    older = body + "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.42\n"
    assert read("llamacpp", older).models[0].kv_cache_usage_ratio == pytest.approx(0.42)
    assert read("llamacpp", underscored(older)).models[0].kv_cache_usage_ratio == pytest.approx(0.42)
