"""Fuzzing the log path: bytes to lines (lines.py), a followed file (file_follower.py, followed_file.py), CRI records
(cri.py), incidents (detector.py).

Properties: no exception escapes; every line comes out once, whatever the read boundaries and rotations;
an oversized line keeps its head and counts in `lines_truncated`; N OOM tracebacks written in arbitrary
pieces are N events.
"""

from __future__ import annotations

import json
import os

from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from oomguard.common.kinds import CUDA_OOM, LOG_EVENT_KINDS
from oomguard.exporter.engines import ENGINES
from oomguard.exporter.events.catalogue import load_catalogue
from oomguard.exporter.events.cri import CriDecoder
from oomguard.exporter.events.detector import IncidentDetector
from oomguard.exporter.events.file_follower import FileFollower
from oomguard.exporter.events.lines import PendingLine
from oomguard.exporter.events.source import LogSource
from oomguard.exporter.model import ReadStats
from tests.fuzz.fuzz_strategies import MB, chunked

CATALOGUE = load_catalogue("vllm")
GRAMMAR = ENGINES["vllm"].log_grammar

STARTUP = "(APIServer pid=80) INFO 12-02 12:05:00 [api_server.py:1000] vLLM server version 0.32.0, serving model tiny"
OOM_TRACEBACK = [
    "(EngineCore pid=77) ERROR 12-02 12:00:00 [core.py:701] EngineCore encountered a fatal error.",
    "(EngineCore pid=77) Traceback (most recent call last):",
    '(EngineCore pid=77)   File "vllm/v1/engine/core.py", line 701, in run_engine_core',
    "(EngineCore pid=77)     engine_core.run_busy_loop()",
    "(EngineCore pid=77) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has 79 GiB",
    "(APIServer pid=70) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
]


def _quiet(line: bytes) -> bool:
    """Noise must not be a log pattern's line (a random line that says "CUDA out of memory" is one)."""
    text = line.decode("utf-8", errors="replace")
    return not any(p.regex.search(text) for p in CATALOGUE)


# A line's bytes, without its newline: binary (NUL, invalid UTF-8, CR), text, or a long one built from a
# short piece (up to a bit over 1 MB).
LINE_BYTES = st.one_of(
    st.binary(max_size=60).map(lambda b: b.replace(b"\n", b"")),
    st.text(max_size=60).map(lambda t: t.replace("\n", "").encode("utf-8")),
    st.tuples(st.binary(min_size=1, max_size=4), st.sampled_from([100, 5000, MB + 7])).map(
        lambda t: (t[0] * (t[1] // len(t[0]) + 1))[: t[1]].replace(b"\n", b"x")
    ),
)


def expected_lines(data: bytes, max_line: int, *, discard: bool = False) -> tuple[list[str], int]:
    """What PendingLine must return for `data` fed then flushed: each line's head, and how many were cut."""
    pieces = data.split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()  # the data ends with a newline: no unfinished line
    if discard and pieces:
        pieces.pop(0)  # the unfinished line at the start is skipped up to its newline
    lines = [p[:max_line].decode("utf-8", errors="replace") for p in pieces]
    return lines, sum(1 for p in pieces if len(p) > max_line)


@given(
    lines=st.lists(LINE_BYTES, max_size=12),
    ends_with_newline=st.booleans(),
    max_line=st.sampled_from([1, 7, 64, 4096, MB]),
    discard=st.booleans(),
    data=st.data(),
)
@example(lines=[b"x" * (MB + 7)], ends_with_newline=True, max_line=MB, discard=False, data=None)
@example(lines=["é€😀".encode() * 3], ends_with_newline=False, max_line=7, discard=False, data=None)
def test_lines_come_out_once_with_their_head_kept_and_cut_ones_counted(
    lines: list[bytes], ends_with_newline: bool, max_line: int, discard: bool, data
) -> None:
    stream = b"\n".join(lines) + (b"\n" if ends_with_newline and lines else b"")
    chunks = data.draw(chunked(stream, max_chunks=20)) if data is not None else [stream]
    pending = PendingLine(discard=discard)
    stats = ReadStats()
    out: list[str] = []
    for chunk in chunks:
        pending.feed(chunk, out, max_line, stats)
        assert len(pending.partial) <= max_line  # bounded memory per file
    pending.flush(out, stats)
    want, cut = expected_lines(stream, max_line, discard=discard)
    assert out == want
    assert stats.lines_read == len(want)
    assert stats.lines_truncated == cut
    event(f"truncated lines: {'some' if cut else 'none'}")


# -- a real file, written in pieces and rotated, read by the follower -------------------------------


@st.composite
def writes(draw: st.DrawFn) -> list[tuple[str, bytes]]:
    """What a writer does: ("write", bytes) at arbitrary boundaries, with ("rotate", mode) in between."""
    lines = draw(st.lists(LINE_BYTES.filter(lambda b: len(b) < 10_000), max_size=10))
    stream = b"".join(line + b"\n" for line in lines) + draw(st.binary(max_size=8).map(lambda b: b.replace(b"\n", b"")))
    steps: list[tuple[str, bytes]] = []
    for chunk in draw(chunked(stream, max_chunks=8)):
        steps.append(("write", chunk))
        if draw(st.integers(0, 3)) == 0:
            steps.append(("rotate", draw(st.sampled_from([b"rename", b"copytruncate"]))))
    return steps


@settings(max_examples=max(10, settings.default.max_examples // 2))
@given(steps=writes(), max_line=st.sampled_from([5, 64, 1 << 20]))
def test_a_followed_file_loses_no_line_across_reads_and_rotations(
    tmp_path_factory, steps: list[tuple[str, bytes]], max_line: int
) -> None:
    """Partial lines at a rotation: the unfinished line of the old file comes out as it is, when the old
    file is let go; nothing else changes. The writer's backlog is read before each rotation (a poll), as
    copy-truncate loses what was not read before the truncation (file_follower.py)."""
    directory = tmp_path_factory.mktemp("follow")
    path = directory / "app.log"
    path.touch()
    follower = FileFollower(str(path), from_start=True, max_line_bytes=max_line)
    follower.drain_grace_seconds = 0.0
    out: list[str] = []
    lives: list[list] = [[b"start", b""]]  # how each life of the file began, and what it received
    for action, arg in steps:
        if action == "write":
            with open(path, "ab") as f:
                f.write(arg)
            lives[-1][1] += arg
        else:
            out += follower.poll()
            if arg == b"rename":
                os.rename(path, directory / f"app.log.{len(lives)}")
            else:
                os.truncate(path, 0)
            path.touch()
            lives.append([arg, b""])
            out += follower.poll()  # notices the rotation before new bytes can hide it
        out += follower.poll()
    out += follower.poll()
    out += follower.poll()  # rotated-away files are drained, then let go (their last line flushed)
    follower.close()
    want: list[str] = []
    cut = 0
    skip_nul = False
    for i, (began, content) in enumerate(lives):
        if began == b"rename":
            skip_nul = False  # a new file
        elif began == b"copytruncate" and lives[i - 1][1]:
            skip_nul = True  # a truncation seen (we had read past 0): the NUL hole of a writer is skipped
        if skip_nul and content.lstrip(b"\0"):
            content, skip_nul = content.lstrip(b"\0"), False
        elif skip_nul:
            content = b""
        if i == len(lives) - 1:
            content = content[: content.rfind(b"\n") + 1]  # the live file's unfinished line is held
        lines, n = expected_lines(content, max_line)
        want += lines
        cut += n
    assert out == want
    assert follower.stats.lines_read == len(want)
    assert follower.stats.lines_truncated == cut
    assert follower.stats.read_errors == 0, follower.stats.last_error
    event(f"rotations: {min(len(lives) - 1, 3)}")


# -- N OOM tracebacks, in arbitrary pieces, are N events ----------------------------------------------


@st.composite
def oom_log(draw: st.DrawFn) -> tuple[bytes, int, int]:
    """A log of N lives, each a startup line then an OOM traceback, with noise around: (bytes, N, noise
    lines over the line cap)."""
    n = draw(st.integers(0, 4))
    noise = st.lists(LINE_BYTES.filter(_quiet), max_size=3)
    lines: list[bytes] = []
    for _ in range(n):
        lines += draw(noise)
        lines.append(STARTUP.encode())
        lines += draw(noise)
        lines += [line.encode() for line in OOM_TRACEBACK]
    lines += draw(noise)
    long = sum(1 for line in lines if len(line) > 4096)
    return b"".join(line + b"\n" for line in lines), n, long


@settings(max_examples=max(10, settings.default.max_examples // 2))
@given(log=oom_log(), data=st.data())
def test_n_oom_tracebacks_written_in_pieces_are_n_events(tmp_path_factory, log: tuple[bytes, int, int], data) -> None:
    """A traceback split across reads (a piece may end inside a line, inside a UTF-8 character) is still
    one incident; an oversized noise line is cut and counted, and hides nothing.

    The reads are 0.5 s apart at most, as the poller's are, and all of them together take less than
    quiet_seconds. A writer that stops for longer in the middle of a traceback (even in the middle of a line:
    an unfinished line is not a line yet) ends the incident by the detector's clock: its kind may then be only
    engine_death, and after rearm_seconds the rest counts again (detector.py, by design).
    """
    content, n, long = log
    path = tmp_path_factory.mktemp("oom") / "vllm.log"
    path.touch()
    reader = FileFollower(str(path), from_start=True, max_line_bytes=4096)
    detector = IncidentDetector(CATALOGUE, grammar=GRAMMAR, quiet_seconds=10.0, rearm_seconds=60.0)
    source = LogSource("t", f"file:{path}", reader, detector)
    now = 1000.0
    source.monotonic = lambda: now  # the poller's clock: what the quiet spell runs on
    kinds: list[str] = []
    for chunk in data.draw(chunked(content, max_chunks=10)):
        with open(path, "ab") as f:
            f.write(chunk)
        now += data.draw(st.sampled_from([0.01, 0.1, 0.5]))  # 10 reads: under quiet_seconds
        kinds += [e.kind for e in source.poll(now)]
    now += 3600
    kinds += [e.kind for e in source.poll(now)]  # the last incident ends after quiet_seconds
    kinds += [e.kind for e in source.close()]
    assert [kind for kind in kinds if kind in LOG_EVENT_KINDS] == [CUDA_OOM] * n  # what the runner counts
    health = source.health()
    assert health.lines_truncated == long
    assert health.read_errors == 0


@given(lines=st.lists(st.one_of(st.text(max_size=80), st.sampled_from([STARTUP, *OOM_TRACEBACK])), max_size=40))
def test_the_detector_takes_any_line(lines: list[str]) -> None:
    detector = IncidentDetector(CATALOGUE, grammar=GRAMMAR)
    events = []
    for i, line in enumerate(lines):
        events += detector.feed(line, float(i))
        events += detector.tick(float(i))
    events += detector.close()
    assert all(e.kind in LOG_EVENT_KINDS for e in events)
    # An event needs at least one line of an incident kind.
    assert len(events) <= sum(
        1 for line in lines if any(p.regex.search(line) for p in CATALOGUE if p.kind in LOG_EVENT_KINDS)
    )


# -- CRI records: a message cut into partial records comes out whole ----------------------------------

TS = "2024-05-01T12:00:00.123456789Z"


@st.composite
def cri_records(draw: st.DrawFn, max_bytes: int) -> tuple[list[str], list[str], int, int]:
    """Messages of both streams, each cut into P records then its F, interleaved, with malformed lines:
    (the records, what the decoder must return in order, how many lines are malformed, how many cut)."""
    queues: dict[str, list[tuple[str, str | None]]] = {"stdout": [], "stderr": []}
    cut = 0
    for _ in range(draw(st.integers(0, 6))):
        stream = draw(st.sampled_from(["stdout", "stderr"]))
        message = draw(st.one_of(st.text(max_size=40), st.sampled_from(OOM_TRACEBACK))).replace("\n", " ")
        cuts = sorted(draw(st.lists(st.integers(0, len(message)), max_size=3)))
        parts = [message[a:b] for a, b in zip([0, *cuts], [*cuts, len(message)], strict=True)]
        cut += len(message.encode()) > max_bytes
        for i, part in enumerate(parts):
            final = i == len(parts) - 1
            # A message longer than the cap keeps its head, cut at a character boundary.
            out = message.encode()[:max_bytes].decode("utf-8", errors="ignore") if final else None
            queues[stream].append((f"{TS} {stream} {'F' if final else 'P'} {part}", out))
    records: list[str] = []
    expected: list[str] = []
    malformed = 0
    while queues["stdout"] or queues["stderr"]:  # each stream's records in order, the streams interleaved
        record, out = queues[draw(st.sampled_from([s for s in ("stdout", "stderr") if queues[s]]))].pop(0)
        records.append(record)
        expected += [out] if out is not None else []
        if draw(st.integers(0, 9)) == 0:
            line = draw(st.text(max_size=20).filter(lambda t: "stdout" not in t and "stderr" not in t))
            records.append(line)
            expected.append(line)  # passed through as it is
            malformed += 1
    return records, expected, malformed, cut


@given(max_bytes=st.sampled_from([3, 16, 1 << 20]), data=st.data())
def test_cri_messages_are_joined_capped_and_counted(max_bytes: int, data) -> None:
    records, expected, malformed, cut = data.draw(cri_records(max_bytes))
    decoder = CriDecoder(max_bytes)
    out = [message for line in records for message in decoder.feed(line)]
    assert decoder.flush() == []
    assert out == expected
    assert decoder.stats.lines_malformed == malformed
    assert decoder.stats.lines_truncated == cut


# -- saved state: whatever the state file holds, a source is built and polls -----------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def incident_state(draw: st.DrawFn):
    """A detector's saved state: valid, a valid one with a wrong part, or anything."""
    valid = {"open": [100.0, 101.0, ["cuda_oom"]], "dead_until_startup": None}
    if draw(st.booleans()):
        return draw(JSON)
    key = draw(st.sampled_from(["open", "dead_until_startup"]))
    return {**valid, key: draw(JSON)}


@given(state=incident_state())
@example(state={"open": [1.0, 2.0], "dead_until_startup": None})  # too few fields
@example(state={"open": None, "dead_until_startup": "soon"})
@example(state={"open": [1.0, float("nan"), ["cuda_oom"]], "dead_until_startup": None})
@example(state={"open": [1.0, 2.0, "cuda_oom"], "dead_until_startup": None})  # the kinds as one string
@example(state={"open": None, "dead_until_startup": float("nan")})
@example(state={"open": [10**400, 1.0, ["cuda_oom"]], "dead_until_startup": None})
@example(state=["not", "a", "mapping"])
def test_a_saved_incident_is_resumed_or_dropped_never_a_crash(state) -> None:
    """Bug: a saved incident the detector could not read (a wrong shape, a kind it does not know, a NaN
    time) raised out of `restore`, so out of building the sources at start; a NaN time kept an incident
    open, or the detector unarmed, for ever. Now such a state is dropped, as the follower drops its own."""
    detector = IncidentDetector(CATALOGUE, grammar=GRAMMAR, quiet_seconds=5.0, rearm_seconds=60.0)
    detector.restore(state)
    json.dumps(detector.state(), allow_nan=False)  # what is kept can be saved again
    resumed = detector.tick(1e9) + detector.tick(2e9)  # the resumed incident ends; the detector rearms
    assert all(e.kind in LOG_EVENT_KINDS for e in resumed) and len(resumed) <= 1
    assert detector.open is None and detector.dead_until_startup is None
    # It counts the next death as it would have without a saved state.
    assert [e for line in OOM_TRACEBACK[1:-1] for e in detector.feed(line, 2e9 + 1)] == []  # the traceback
    assert [e.kind for e in detector.tick(3e9)] == [CUDA_OOM]


@given(state=st.one_of(JSON, st.builds(lambda f: {"version": 1, "files": f}, JSON)))
def test_a_saved_follower_state_is_resumed_or_dropped(tmp_path_factory, state) -> None:
    follower = FileFollower(str(tmp_path_factory.getbasetemp() / "none*.log"), state=state)
    assert follower.poll() == []
    json.dumps(follower.state())
