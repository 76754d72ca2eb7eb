"""One incident, one event: tracebacks in pieces, printed twice, with process prefixes; kinds by priority."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomguard.exporter.engines import ENGINES
from oomguard.exporter.events.catalogue import check_patterns, load_catalogue
from oomguard.exporter.events.detector import IncidentDetector

OOM_TRACEBACK = """(EngineCore pid=77) ERROR 12-02 12:00:00 [core.py:701] EngineCore encountered a fatal error.
(EngineCore pid=77) Traceback (most recent call last):
(EngineCore pid=77)   File "vllm/v1/engine/core.py", line 701, in run_engine_core
(EngineCore pid=77)     engine_core.run_busy_loop()
(EngineCore pid=77) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB
(APIServer pid=70) ERROR 12-02 12:00:01 [async_llm.py:480] AsyncLLM output_handler failed.
(APIServer pid=70) ERROR 12-02 12:00:01 [async_llm.py:480] Traceback (most recent call last):
(APIServer pid=70) ERROR 12-02 12:00:01 [async_llm.py:480]   File "vllm/v1/engine/async_llm.py", line 439, in output_handler
(APIServer pid=70) ERROR 12-02 12:00:01 [async_llm.py:480] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.""".splitlines()

# vLLM 0.32's real startup failure with too little KV cache: the ValueError twice, then the RuntimeError (frames
# left out).
STARTUP_FAILURE = """(EngineCore pid=9) ERROR 12-02 12:00:00 [core.py:1510] EngineCore failed to start.
(EngineCore pid=9) ERROR 12-02 12:00:00 [core.py:1510] Traceback (most recent call last):
(EngineCore pid=9) ERROR 12-02 12:00:00 [core.py:1510] ValueError: To serve at least one request with the model's max seq len (512), (0.0 GiB KV cache is needed, which is larger than the available KV cache memory (0.0 GiB).
Process EngineCore:
Traceback (most recent call last):
ValueError: To serve at least one request with the model's max seq len (512), (0.0 GiB KV cache is needed, which is larger than the available KV cache memory (0.0 GiB).
Traceback (most recent call last):
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}""".splitlines()

NON_MEMORY_DEATH = """(EngineCore pid=5) ERROR 12-02 12:00:00 [core.py:701] EngineCore encountered a fatal error.
(EngineCore pid=5) Traceback (most recent call last):
(EngineCore pid=5) RuntimeError: Unsupported CPU attention configuration: head_dim=16""".splitlines()

STARTUP = "(APIServer pid=80) INFO 12-02 12:05:00 [api_server.py:1000] vLLM server version 0.32.0, serving model tiny"


def detector(**kwargs: float) -> IncidentDetector:
    """A vLLM target's detector: the generic patterns, vLLM's, and vLLM's line prefix."""
    return IncidentDetector(load_catalogue("vllm"), grammar=ENGINES["vllm"].log_grammar, **kwargs)


def feed(d: IncidentDetector, lines: list[str], now: float) -> list[str]:
    return [e.kind for line in lines for e in d.feed(line, now)]


@pytest.mark.parametrize(
    ("lines", "kind"),
    [(OOM_TRACEBACK, "cuda_oom"), (STARTUP_FAILURE, "startup_memory"), (NON_MEMORY_DEATH, "engine_death")],
)
def test_one_incident_is_one_event_of_its_most_telling_kind(lines: list[str], kind: str) -> None:
    d = detector()
    assert feed(d, lines, now=100.0) == []  # not closed yet: more lines may come
    assert [e.kind for e in d.tick(now=104.9)] == []
    events = d.tick(now=105.0)
    assert [(e.kind, e.timestamp) for e in events] == [(kind, 100.0)]
    assert d.tick(now=200.0) == []


def test_a_startup_line_closes_the_incident_at_once() -> None:
    d = detector()
    assert feed(d, [*OOM_TRACEBACK, STARTUP], now=1.0) == ["cuda_oom"]


def test_startup_lines_are_handed_over_with_their_pid_not_counted() -> None:
    """Each start read goes to the restart tracker (take_starts), with the pid the line names, once."""
    d = detector()
    uvicorn = "(APIServer pid=80) INFO:     Started server process [80]"
    assert (
        feed(
            d,
            [STARTUP, "noise", uvicorn, "INFO 07-01 12:00:00 api_server.py:600] vLLM API server version 0.6.3"],
            now=5.0,
        )
        == []
    )
    assert [(e.kind, e.timestamp, e.pid) for e in d.take_starts()] == [
        ("startup", 5.0, 80), ("startup", 5.0, 80), ("startup", 5.0, None)
    ]  # fmt: skip
    assert d.take_starts() == []


def test_a_traceback_flushed_in_pieces_counts_once() -> None:
    d = detector(quiet_seconds=5)
    for i, line in enumerate(OOM_TRACEBACK):  # one line every 2 s: never quiet for 5 s
        assert feed(d, [line], now=2.0 * i) == []
        assert d.tick(now=2.0 * i + 1) == []
    assert [e.kind for e in d.tick(now=2.0 * len(OOM_TRACEBACK) + 10)] == ["cuda_oom"]


def test_incidents_separated_by_restarts_are_separate_events() -> None:
    d = detector()
    kinds = feed(d, [*OOM_TRACEBACK, STARTUP, *NON_MEMORY_DEATH, STARTUP, "noise", *STARTUP_FAILURE], now=0.0)
    assert kinds == ["cuda_oom", "engine_death"]
    assert [e.kind for e in d.tick(now=60.0)] == ["startup_memory"]


def test_lines_that_match_nothing_do_nothing() -> None:
    d = detector()
    assert feed(d, ["INFO all good", "", "\x00\xff garbage", STARTUP], now=0.0) == []
    assert d.open is None


def test_open_incident_survives_a_restart_of_the_exporter() -> None:
    d = detector()
    feed(d, OOM_TRACEBACK[:2], now=10.0)  # fatal error seen, OOM line not yet
    resumed = detector()
    resumed.restore(d.state())
    feed(resumed, OOM_TRACEBACK[2:], now=11.0)
    assert [(e.kind, e.timestamp) for e in resumed.tick(now=30.0)] == [("cuda_oom", 10.0)]


def test_extra_patterns_from_the_configuration() -> None:
    extra = [
        {"kind": "cuda_oom", "at": "exception", "regex": r"torch\.OutOfMemoryError: HIP out of memory"},
        {"kind": "engine_death", "source": r"core\.py", "regex": "EngineCore went away"},
    ]
    d = IncidentDetector(load_catalogue("vllm", extra), grammar=ENGINES["vllm"].log_grammar)
    hip = ["Traceback (most recent call last):", "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1 GiB"]
    feed(d, hip, now=0.0)
    assert [e.kind for e in d.close()] == ["cuda_oom"]
    feed(d, ["(EngineCore pid=7) ERROR 12-02 12:00:00 [core.py:9] EngineCore went away"], now=0.0)
    assert [e.kind for e in d.close()] == ["engine_death"]
    # Not where the pattern says: from another source, or in a line that is no traceback's end.
    feed(d, ["(EngineCore pid=7) ERROR 12-02 12:00:00 [utils.py:9] EngineCore went away", hip[1]], now=0.0)
    assert d.close() == []


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"kind": "oops", "regex": "x"}, "kind 'oops' is not one of"),
        ({"kind": "cuda_oom", "regex": "("}, "not a valid regular"),
    ],
)
def test_bad_patterns_are_refused_with_the_reason(entry: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_catalogue(None, [entry])
    with pytest.raises(ValueError, match=message):
        check_patterns([{"kind": "startup", "regex": "fine"}, entry])  # what the configuration's validator calls


def test_check_patterns_accepts_every_pattern_kind() -> None:
    check_patterns([{"kind": kind, "regex": "x"} for kind in ("cuda_oom", "startup_memory", "engine_death", "startup")])


def test_the_catalogue_is_the_generic_patterns_plus_the_engines() -> None:
    generic = load_catalogue()
    vllm = load_catalogue("vllm")
    assert [p.regex.pattern for p in vllm[: len(generic)]] == [p.regex.pattern for p in generic]
    assert {p.kind for p in generic} == {"cuda_oom"}  # the allocator's own words only
    assert {"startup_memory", "engine_death", "startup"} <= {p.kind for p in vllm}
    with pytest.raises(ValueError, match="unknown engine"):
        load_catalogue("no-such-engine")


def test_engine_lines_count_only_with_the_engines_patterns() -> None:
    """vLLM's fatal error is an engine_death for a vLLM target; the generic catalogue does not know it."""
    vllm = detector()
    feed(vllm, NON_MEMORY_DEATH, now=0.0)
    assert [e.kind for e in vllm.tick(now=10.0)] == ["engine_death"]
    generic = IncidentDetector(load_catalogue())
    feed(generic, NON_MEMORY_DEATH, now=0.0)
    assert generic.tick(now=10.0) == [] and generic.open is None
    # The allocator's own words count whatever the engine, as the exception that ends a traceback.
    feed(
        generic, ["Traceback (most recent call last):", "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB"], 20
    )
    assert [e.kind for e in generic.tick(now=30.0)] == ["cuda_oom"]


def test_the_lines_of_a_traceback_keep_an_incident_open_those_of_another_process_do_not() -> None:
    opener = "(EngineCore pid=7) Traceback (most recent call last):"
    oom = "(EngineCore pid=7) torch.OutOfMemoryError: CUDA out of memory."
    frame = '(EngineCore pid=7)   File "vllm/v1/engine/core.py", line 701, in run_engine_core'
    other = '(Worker pid=8)   File "vllm/v1/engine/core.py", line 701, in run_engine_core'
    d = detector()
    d.feed(opener, 0.0)
    d.feed(frame, 0.0)
    d.feed(oom, 0.0)
    d.feed("(EngineCore pid=7) ", 4.0)  # a chained exception's blank line: still the traceback
    d.feed(other, 8.0)  # another process's frame: not this traceback
    assert d.tick(now=8.9) == [] and d.open is not None
    assert [e.kind for e in d.tick(now=9.0)] == ["cuda_oom"]
    # Python's own traceback, without a tag or header, whatever the engine.
    plain = IncidentDetector(load_catalogue())
    for line in ("Traceback (most recent call last):", '  File "serve.py", line 1, in main', oom[19:]):
        plain.feed(line, 20.0)
    plain.feed('  File "serve.py", line 2, in main', 24.0)  # a frame after the exception: no traceback open
    assert [e.kind for e in plain.tick(now=25.0)] == ["cuda_oom"]


def test_a_death_told_in_parts_seconds_apart_is_one_event() -> None:
    """vLLM 0.32's real startup failure: the engine core's traceback, 3.4 s later its parent's, 2.6 s later
    the API server's RuntimeError (timings measured on a real server here)."""
    d = detector(quiet_seconds=2, rearm_seconds=60)
    engine_core, parent, api_server = STARTUP_FAILURE[:3], STARTUP_FAILURE[3:6], STARTUP_FAILURE[6:]
    events = feed(d, engine_core, now=22.7) + [e.kind for e in d.tick(now=25.0)]
    events += feed(d, parent, now=26.1) + [e.kind for e in d.tick(now=28.2)]
    events += feed(d, api_server, now=28.7) + [e.kind for e in d.tick(now=40.0)]
    assert events == ["startup_memory"]
    # The next life's death counts again: after a startup line, or after a long quiet spell.
    assert feed(d, [STARTUP, *NON_MEMORY_DEATH], now=50.0) == []
    assert [e.kind for e in d.tick(now=60.0)] == ["engine_death"]
    d.tick(now=200.0)
    feed(d, OOM_TRACEBACK, now=201.0)
    assert [e.kind for e in d.tick(now=210.0)] == ["cuda_oom"]


def test_a_recorded_real_vllm_startup_failure_is_one_startup_memory() -> None:
    """A real vLLM 0.32 that cannot fit its KV cache (tests/real/vllm/test_events_realvllm.py wrote the log): the
    engine core's traceback, its parent's, the API server's; one incident, startup_memory."""
    text = (Path(__file__).parent / "fixtures" / "vllm-0.32-cpu-startup-without-kv-cache.log").read_text()
    d = detector()
    kinds = [e.kind for line in text.splitlines() for e in d.feed(line, 0.0)] + [e.kind for e in d.tick(100.0)]
    assert kinds == ["startup_memory"]
    # It never reached uvicorn's "Started server process": its start is the API server's arguments line.
    assert [s.pid for s in d.take_starts()] == [8510]
