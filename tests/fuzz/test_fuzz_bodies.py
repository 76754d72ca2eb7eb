"""Fuzzing engine /metrics bodies: every body is a reading or a counted error kind of the target.

The bulk goes to the parser the scraper uses (`FamilyExtractor` then `VllmReader.read`): it returns a
reading or raises `ExpositionError`, which the scraper turns into error kind "parse". A few bodies go
through the whole path, a real `TargetScraper` scraping a local aiohttp server: the body capped, the
UTF-8 decoding, the parse, and the error counted in `errors_total`.
"""

from __future__ import annotations

import asyncio
import math
import time

from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from support import vllm_body

from oomguard.common.engine_client import EngineClient
from oomguard.common.promtext import ExpositionError, FamilyExtractor, LimitExceeded, Limits
from oomguard.exporter.config import TargetConfig
from oomguard.exporter.engines.base import Rejected, read_checked
from oomguard.exporter.engines.vllm import reader as vllm
from oomguard.exporter.model import ERROR_KINDS, EngineReading
from oomguard.exporter.sources.targets import TargetScraper
from tests.fuzz.fuzz_strategies import MB, big_text, chunked, with_invalid_utf8

READER = vllm.VllmReader()
EXTRACTOR = FamilyExtractor(READER.families, Limits())  # the scraper's default limits
FAMILIES = sorted(READER.families)
REAL_BODY = vllm_body("vllm-0.32.0-cpu-under-load.txt")

LABEL_NAMES = st.sampled_from(
    ["model_name", "engine", "sleep_state", "gpu_memory_utilization", "num_gpu_blocks", "block_size", "le", "x"]
)
LABEL_VALUES = st.one_of(
    st.sampled_from(["tiny", "awake", "weights_offloaded", "discard_all", "0.9", "None", "nan", "-inf", "1e999"]),
    st.text(max_size=12),
)
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "nan", "1e999", "-0", "1_0", "0x10", "", "1.0.0", "\u0661"]),
    st.integers(-(10**30), 10**30).map(str),
    st.text(max_size=6),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def sample_line(draw: st.DrawFn) -> str:
    name = draw(st.one_of(st.sampled_from(FAMILIES), st.sampled_from(["vllm:other", "vllm:num_requests"])))
    labels = draw(st.dictionaries(LABEL_NAMES, LABEL_VALUES, max_size=4))
    text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    braces = f"{{{text}}}" if labels or draw(st.booleans()) else ""
    timestamp = draw(st.sampled_from(["", " 1700000000000", " x"]))
    return f"{name}{braces} {draw(VALUES)}{timestamp}"


@st.composite
def body_line(draw: st.DrawFn) -> str:
    """A line of a body: a sample, a comment, a duplicate or wrong TYPE, a truncated line, noise."""
    kind = draw(st.integers(0, 6))
    if kind <= 2:
        return draw(sample_line())
    if kind == 3:
        family = draw(st.sampled_from(FAMILIES))
        kind_word = draw(st.sampled_from(["gauge", "counter", "histogram", "summary", "untyped", "bogus", ""]))
        return f"# {draw(st.sampled_from(['TYPE', 'HELP']))} {family} {kind_word}"
    if kind == 4:
        line = draw(sample_line())
        return line[: draw(st.integers(0, len(line)))]  # truncated anywhere
    if kind == 5:
        # A 1 MB label value (or a shorter long one).
        name = draw(st.sampled_from(FAMILIES))
        return f'{name}{{model_name="{_escape(draw(big_text(min_size=1000)))}"}} 1'
    return draw(st.text(max_size=40))


BODIES = st.lists(body_line(), max_size=30).map("\n".join)
LINE_ENDS = st.sampled_from(["\n", "\r\n"])


@st.composite
def mutated_real_body(draw: st.DrawFn) -> str:
    """A real vLLM body cut short, with lines duplicated, dropped or replaced."""
    lines = REAL_BODY.splitlines()
    for _ in range(draw(st.integers(0, 6))):
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["dup", "drop", "replace", "cut"]))
        if action == "dup":
            lines.insert(i, lines[i])
        elif action == "drop":
            del lines[i]
        elif action == "replace":
            lines[i] = draw(body_line())
        else:
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
        if not lines:
            break
    text = "\n".join(lines)
    return text[: draw(st.integers(0, len(text)))] if draw(st.booleans()) else text


def parse(text: str) -> EngineReading:
    """What the scraper does with a decoded body (TargetScraper._fetch_metrics): the values checked."""
    return read_checked(READER, EXTRACTOR.extract(text), Rejected())


def check_reading(reading: EngineReading) -> None:
    assert isinstance(reading, EngineReading)
    numbers = [
        reading.memory_utilization_ratio,
        reading.kv_cache_blocks,
        reading.kv_cache_block_size_tokens,
        reading.kv_cache_memory_bytes,
        reading.process_start_time_seconds,
    ]
    for model in reading.models:
        assert isinstance(model.model_name, str)
        numbers += [model.kv_cache_usage_ratio, model.requests_waiting, model.requests_running]
        assert model.kv_cache_usage_ratio is None or 0 <= model.kv_cache_usage_ratio <= 1
    assert all(n is None or isinstance(n, float | int) for n in numbers), numbers
    # Every value checked (engines/base.py): finite and not negative, or absent.
    assert all(n is None or (math.isfinite(n) and n >= 0) for n in numbers), numbers
    assert reading.memory_utilization_ratio is None or 0 < reading.memory_utilization_ratio <= 1
    # Values read from labels ("None" included) and the start time are finite or absent, never NaN.
    config = numbers[:5]
    assert all(n is None or math.isfinite(n) for n in config), config
    assert reading.sleep_state in (None, "awake", "weights_offloaded", "discard_all")


@settings(max_examples=settings.default.max_examples * 5)  # cheap: a few ms each
@given(body=st.one_of(BODIES, mutated_real_body()), end=LINE_ENDS)
@example(body='vllm:num_requests_waiting{model_name="m"} 1.0.0', end="\n")
@example(body='vllm:num_requests_waiting{model_name="m"} NaN\nvllm:num_requests_waiting{model_name="m"} +Inf', end="\n")
@example(body='vllm:num_requests_waiting{model_name="m",} 1\n# TYPE vllm:num_requests_waiting gauge\n' * 2, end="\n")
@example(body='vllm:num_requests_waiting{model_name="' + "x" * MB + '"} 1', end="\n")
@example(body='vllm:num_requests_waiting{model_name="m} 1\nvllm:num_requests_running{model_name=m} 1', end="\n")
def test_a_body_is_a_reading_or_an_exposition_error(body: str, end: str) -> None:
    text = body.replace("\n", end)
    started = time.perf_counter()
    try:
        reading = parse(text)
    except ExpositionError as exc:
        assert str(exc), "an ExpositionError says what is wrong"
    else:
        check_reading(reading)
    # No regular expression may backtrack badly, even on a 1 MB line.
    assert time.perf_counter() - started < 2 + len(text) / MB * 2


@settings(max_examples=settings.default.max_examples * 3)
@given(
    samples=st.lists(
        st.tuples(
            st.sampled_from([vllm.WAITING, vllm.RUNNING]),
            st.sampled_from(["a", "b", 'q"uo\\te']),
            st.sampled_from(["0", "1", "2.5", "1e3", "-1"]),
        ),
        min_size=1,
        max_size=20,
        unique_by=lambda sample: sample[:2],  # a series written twice is malformed, not summed
    ),
    noise=st.lists(
        st.one_of(
            st.text(max_size=30).map(lambda t: "# " + t.replace("\n", " ")),
            st.sampled_from(FAMILIES).map(lambda f: f"# TYPE {f} counter"),  # duplicate and wrong TYPE lines
            st.text(alphabet="{}= \t\"'0123456789xyz", max_size=30),
        ),
        max_size=20,
    ),
    order=st.randoms(use_true_random=False),
    end=LINE_ENDS,
)
def test_no_sample_is_lost_or_added_among_noise(samples, noise, order, end) -> None:
    """Every well-formed sample line counts once (a negative one not at all), whatever lines surround it; the
    text parser of prometheus_client reads the same samples where it can read the body at all."""
    lines = [f'{name}{{model_name="{_escape(model)}",engine="0"}} {value}' for name, model, value in samples]
    body = lines + noise
    order.shuffle(body)
    text = end.join(body) + end
    reading = parse(text)
    by_model = {m.model_name: m for m in reading.models}
    for name, field in ((vllm.WAITING, "requests_waiting"), (vllm.RUNNING, "requests_running")):
        for model in {m for n, m, _ in samples if n == name}:
            [value] = [float(v) for n, m, v in samples if n == name and m == model]
            got = getattr(by_model[model], field) if model in by_model else None
            assert got == (value if value >= 0 else None), (name, model)
    extracted = EXTRACTOR.extract(text)
    got = sorted((s.name, sorted(s.labels.items()), s.value) for found in extracted.values() for s in found)
    # The extractor reads no TYPE line (a wrong one included): the reference parser is given none.
    uncommented = end.join(line for line in body if not line.lstrip().startswith("#")) + end
    try:
        reference = sorted(
            (s.name, sorted(s.labels.items()), s.value)
            for family in text_string_to_metric_families(uncommented)
            for s in family.samples
            if s.name in READER.families
        )
    except ValueError:
        return  # prometheus_client refuses some noise that the extractor rightly skips
    assert got == reference


# -- through the real scraper ---------------------------------------------------------------


async def _serve_and_scrape(chunks: list[bytes], *, length: bool, cap: int, times: int) -> list:
    """Serve `chunks` as /metrics (with a Content-Length, or streamed without one) and scrape it `times` times."""

    async def metrics(request: web.Request) -> web.StreamResponse:
        if length:
            return web.Response(body=b"".join(chunks), content_type="text/plain")
        response = web.StreamResponse()
        await response.prepare(request)
        try:
            for chunk in chunks:
                await response.write(chunk)
            await response.write_eof()
        except ConnectionError:  # the scraper hangs up at its cap
            pass
        return response

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        scraper = TargetScraper(
            TargetConfig(url=f"http://127.0.0.1:{server.port}", name="fuzz", local_process="no"),
            timeout=10.0,
            max_body_bytes=cap,
        )
        async with EngineClient() as session:
            return [await scraper.scrape(session) for _ in range(times)]
    finally:
        await server.close()


@st.composite
def served_body(draw: st.DrawFn) -> tuple[bytes, int]:
    data = draw(st.one_of(BODIES, mutated_real_body()).map(lambda t: t.encode("utf-8")))
    data = draw(st.one_of(st.just(data), with_invalid_utf8(data), st.binary(max_size=200)))
    cap = draw(st.one_of(st.just(8 * MB), st.integers(1, max(1, len(data) * 2))))
    return data, cap


@settings(max_examples=max(10, settings.default.max_examples // 3))  # a server per example
@given(served=served_body(), length=st.booleans(), data=st.data())
@example(served=(b"\xff" + REAL_BODY.encode(), 8 * MB), length=True, data=None)
@example(served=(REAL_BODY.encode(), 100), length=False, data=None)
def test_the_scraper_counts_every_failed_body(served: tuple[bytes, int], length: bool, data) -> None:
    body, cap = served
    chunks = data.draw(chunked(body)) if data is not None else [body]
    readings = asyncio.run(_serve_and_scrape(chunks, length=length, cap=cap, times=2))
    kind = "parse"
    try:
        expected = parse(body.decode("utf-8"))
    except LimitExceeded:
        expected, kind = None, "limit"
    except (UnicodeDecodeError, ExpositionError):
        expected = None
    for n, reading in enumerate(readings, 1):
        assert reading.error_kind in ("", *ERROR_KINDS)
        event(f"scraped: {reading.error_kind or 'up'}")
        if len(body) > cap:
            assert (reading.up, reading.error_kind) == (False, "too_large"), reading.error
        elif expected is None:
            assert (reading.up, reading.error_kind) == (False, kind), reading.error
        else:
            assert reading.up and reading.error_kind == "" and reading.engine_reading == expected, reading.error
        if reading.error_kind:
            assert reading.error and reading.errors_total[reading.error_kind] == n  # counted, every time
        assert sum(reading.errors_total.values()) == (n if reading.error_kind else 0)
        assert reading.state == "up"  # /health answers 200: a bad body is a parse error, not a dead target
