"""A log read through the API (events/api_log.py): the kubelet's timestamps read, a resumed stream's repeats
dropped and nothing else, the position saved and restored, a damaged one refused."""

from __future__ import annotations

import pytest

from oomguard.exporter.events.api_log import ApiLogReader, parse_timestamp, since_time
from oomguard.exporter.events.source import EventSource


def test_timestamps_as_the_kubelet_writes_them() -> None:
    assert parse_timestamp("2026-12-05T12:00:01.123456789Z") == (1796472001, 123456789)
    # RFC 3339 with nanoseconds drops trailing zeros (Go's RFC3339Nano): the fraction is still nanoseconds.
    assert parse_timestamp("2026-12-05T12:00:01.5Z") == (1796472001, 500000000)
    assert parse_timestamp("2026-12-05T12:00:01Z") == (1796472001, 0)
    for bad in ("", "12:00:01", "2026-12-05T12:00:01", "2026-12-05T12:00:01.1234567891Z", "2026-13-05T12:00:01Z",
                "2026-12-05T12:00:01.12a4Z", "2026-12-05T12:00:01.123+01:00"):  # fmt: skip
        assert parse_timestamp(bad) is None, bad
    assert since_time((1796472001, 999999999)) == "2026-12-05T12:00:01Z"  # whole seconds: the API's unit


def lines(reader: ApiLogReader, *items: tuple[str, str]) -> list[bool]:
    return [reader.offer(f"{at} {text}") for at, text in items]


def test_a_resumed_stream_repeats_its_last_second_and_only_that_is_dropped() -> None:
    reader = ApiLogReader(from_start=True)
    assert reader.new_stream() == {}  # a new pod's log: from its start
    assert lines(reader, ("2026-12-05T12:00:01.1Z", "a"), ("2026-12-05T12:00:02.5Z", "b"),
                 ("2026-12-05T12:00:02.5Z", "c")) == [True, True, True]  # fmt: skip
    assert reader.poll() == ["a", "b", "c"]
    # The stream drops; the next one starts an hour before the last line's second (the kubelet includes it, and
    # sends every line stamped from then: a node's clock that stepped back since is covered).
    assert reader.new_stream() == {"sinceTime": "2026-12-05T11:00:02Z"}
    got = lines(
        reader,
        ("2026-12-05T12:00:02.1Z", "before b, seen"),
        ("2026-12-05T12:00:02.5Z", "b"),
        ("2026-12-05T12:00:02.5Z", "c"),
        ("2026-12-05T12:00:02.5Z", "d, the same nanosecond, new"),
        ("2026-12-05T12:00:03Z", "e"),
    )
    assert got == [False, False, False, True, True]
    assert reader.poll() == ["d, the same nanosecond, new", "e"]
    assert reader.stats.lines_read == 5


def test_a_pod_found_at_start_is_read_from_now_on_the_nodes_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now, as the node counts it: the last seconds (`sinceSeconds`), the seconds on the exporter's monotonic
    clock, never its wall clock (an hour ahead of the node's, it read none of the pod's lines)."""
    mono = [500.0]
    monkeypatch.setattr("oomguard.exporter.events.api_log.time.monotonic", lambda: mono[0])
    monkeypatch.setattr(
        "oomguard.exporter.events.api_log.time.time", lambda: 1e10
    )  # the exporter's wall clock, far off
    reader = ApiLogReader(from_start=False)
    assert reader.new_stream() == {"sinceSeconds": "1"}
    mono[0] += 42.5  # the stream dropped before any line came: asked again for all it may have missed
    assert reader.new_stream() == {"sinceSeconds": "43"}
    assert lines(reader, ("2026-12-05T12:00:01Z", "a line an hour behind the exporter's clock")) == [True]
    assert reader.new_stream() == {"sinceTime": "2026-12-05T11:00:01Z"}  # then from the node's own stamps


def test_the_nodes_clock_stepping_back_loses_and_repeats_nothing() -> None:
    """The node's clock steps back an hour: the lines after the step are taken in the same stream, and a stream
    resumed after it neither repeats the lines from before the step (sent again first: their stamps are later)
    nor loses those after it."""
    reader = ApiLogReader(from_start=True)
    reader.new_stream()
    before = [("2026-12-05T13:00:00Z", "a"), ("2026-12-05T13:00:01Z", "b")]
    after = [("2026-12-05T12:00:02Z", "OOM after the step"), ("2026-12-05T12:00:03Z", "c")]
    assert lines(reader, *before, *after) == [True] * 4
    assert reader.poll() == ["a", "b", "OOM after the step", "c"]
    assert reader.state()["high"] == "2026-12-05T13:00:01.000000000Z"
    # The stream drops; asked again from the last line's second, the API sends every line stamped at or after it:
    # those before the step, then those after it.
    assert reader.new_stream() == {"sinceTime": "2026-12-05T11:00:03Z"}
    again = [*before, ("2026-12-05T12:00:03Z", "c"), ("2026-12-05T12:00:04Z", "d, new")]
    assert lines(reader, *again) == [False, False, False, True]
    # The same from a restarted exporter's saved position.
    restarted = ApiLogReader(state={"last": "2026-12-05T12:00:03.000000000Z", "same": 1,
                                    "high": "2026-12-05T13:00:01.000000000Z"})  # fmt: skip
    restarted.new_stream()
    assert lines(restarted, *again) == [False, False, False, True]
    # Once the clock passes the step, nothing older comes again.
    assert lines(reader, ("2026-12-05T13:00:02Z", "e")) == [True]
    reader.poll()
    assert "high" not in reader.state()


def test_a_step_back_the_reader_never_saw_is_read_after_the_position_whatever_the_stamps() -> None:
    """The stream dropped before any line after the step came: the request asked again an hour before the position
    is sent the lines before it (repeats) and the position, then the lines written after the step, stamped earlier:
    new, by their place in the file. A turn that follows a busy one asks from the position itself."""
    reader = ApiLogReader(from_start=True)
    reader.new_stream()
    taken = [("2026-12-05T13:00:00Z", "a"), ("2026-12-05T13:00:01Z", "b")]
    assert lines(reader, *taken) == [True, True]
    assert reader.new_stream(lookback=False) == {"sinceTime": "2026-12-05T13:00:01Z"}
    assert reader.new_stream() == {"sinceTime": "2026-12-05T12:00:01Z"}
    after = [("2026-12-05T12:00:05Z", "Traceback"), ("2026-12-05T12:00:05.1Z", "OOM after the step")]
    assert lines(reader, ("2026-12-05T12:59:59Z", "before a"), *taken, *after) == [False, False, False, True, True]
    assert reader.poll() == ["a", "b", "Traceback", "OOM after the step"]
    assert reader.state()["high"] == "2026-12-05T13:00:01.000000000Z"
    assert reader.stats.read_errors == 0  # an hour back at most: nothing could be skipped


def test_the_current_containers_lines_after_the_previous_one_held_the_position_are_new() -> None:
    """The position is the last line of a container that died; the clock stepped back before its successor
    started. The previous container's log, read first, holds the position; the current one's lines, stamped
    before it, all come after it."""
    reader = ApiLogReader(from_start=True)
    reader.new_stream()
    lines(reader, ("2026-12-05T13:00:00Z", "started"), ("2026-12-05T13:00:01Z", "OOM, the container dies"))
    reader.poll()
    reader.new_stream(previous=True)
    assert lines(reader, ("2026-12-05T13:00:00Z", "started"), ("2026-12-05T13:00:01Z", "OOM, the container dies")) == [
        False,
        False,
    ]
    reader.new_stream()
    successor = [("2026-12-05T12:00:10Z", "started again"), ("2026-12-05T12:00:11Z", "OOM")]
    assert lines(reader, *successor) == [True, True]
    # Where the position is not in the previous container's log (no restart since), the current one's repeats
    # are dropped as before.
    reader.new_stream(previous=True)
    assert lines(reader, ("2026-12-05T13:00:00Z", "started"), ("2026-12-05T13:00:01Z", "OOM, the container dies")) == [
        False,
        False,
    ]
    reader.new_stream()
    assert lines(reader, *successor, ("2026-12-05T12:00:12Z", "new")) == [False, False, True]


def test_a_step_back_beyond_the_lookback_is_said_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    reader = ApiLogReader(from_start=True)
    reader.new_stream()
    lines(reader, ("2026-12-05T13:00:00Z", "a"), ("2026-12-05T10:00:00Z", "three hours back"))
    lines(reader, ("2026-12-05T13:00:00Z", "c"), ("2026-12-05T09:00:00Z", "again"))
    assert reader.stats.read_errors == 1 and "stepped back by 10800 s" in reader.stats.last_error
    assert len([r for r in caplog.records if "stepped back" in r.getMessage()]) == 1


def test_lines_without_a_timestamp_are_counted_malformed_not_taken() -> None:
    reader = ApiLogReader(from_start=True)
    assert reader.offer("no timestamp here") is False
    assert reader.offer("") is False
    assert reader.stats.lines_malformed == 2 and reader.poll() == []


def test_the_position_is_saved_and_restored() -> None:
    reader = ApiLogReader(from_start=True)
    lines(reader, ("2026-12-05T12:00:02.5Z", "b"), ("2026-12-05T12:00:02.5Z", "c"))
    reader.poll()  # the poller took them: their position is what is saved
    state = reader.state()
    assert state == {"last": "2026-12-05T12:00:02.500000000Z", "same": 2}
    again = ApiLogReader(state=state)  # an exporter restarted: not "from now", from where it was
    assert again.new_stream() == {"sinceTime": "2026-12-05T11:00:02Z"}
    assert lines(again, ("2026-12-05T12:00:02.5Z", "b"), ("2026-12-05T12:00:02.5Z", "c"),
                 ("2026-12-05T12:00:02.6Z", "new")) == [False, False, True]  # fmt: skip


@pytest.mark.parametrize(
    "state",
    [
        {"last": "yesterday", "same": 1},
        {"last": "2026-12-05T12:00:02Z", "same": -1},
        {"last": 5, "same": 1},
        {"last": "2026-12-05T12:00:02Z", "same": True},
        {"same": 1},
        {},
    ],
    ids=["not-a-time", "negative", "not-a-string", "a-bool", "no-last", "empty"],
)
def test_a_damaged_position_is_refused_and_the_log_read_as_if_none_was_saved(state: dict) -> None:
    reader = ApiLogReader(state=state, from_start=True)
    assert reader.new_stream() == {}


def test_what_the_poller_has_not_taken_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the budget, lines are let go down to half of it (so that a flood asks of each line once), the oldest
    first, and counted."""
    monkeypatch.setattr("oomguard.exporter.events.api_log.MAX_HELD_BYTES", 20)
    reader = ApiLogReader(from_start=True)
    for i in range(5):
        reader.offer(f"2026-12-05T12:00:0{i}Z line {i}")  # 6 characters each: over 20 at the 4th, down to 10
    assert reader.poll() == ["line 3", "line 4"]
    assert reader.stats.lines_dropped == 3
    reader.offer("2026-12-05T12:00:06Z line 6")
    assert reader.poll() == ["line 6"]  # the count starts afresh after a poll


def test_the_lines_that_could_count_are_let_go_last(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("oomguard.exporter.events.api_log.MAX_HELD_BYTES", 40)
    asked: list[str] = []

    def keep(line: str) -> bool:
        asked.append(line)
        return line.startswith("OOM")

    reader = ApiLogReader(from_start=True, keep=keep)
    for i, text in enumerate(["noise 0", "OOM 1", "noise 2", "noise 3", "OOM 4", "noise 5", "noise 6", "OOM 7"]):
        reader.offer(f"2026-12-05T12:00:0{i}Z {text}")
    assert reader.poll() == ["OOM 1", "OOM 4", "noise 6", "OOM 7"]
    assert reader.stats.lines_dropped == 4
    assert len(asked) == len(set(asked)), "each line asked once"
    # Only lines that could count, over the budget: the oldest of them go (no engine writes that many at once).
    for i in range(9):  # 5 characters each: 45 over 40
        reader.offer(f"2026-12-05T12:01:0{i}Z OOM {i}")
    assert reader.poll() == [f"OOM {i}" for i in range(1, 9)]


def kinds_counted(log: EventSource, reader: ApiLogReader, texts: list[str]) -> list[str]:
    """The kinds the pod's log source counts of `texts`, streamed within one second: one poll, then another past
    the quiet spell (100 s later on its monotonic clock) that closes what is open."""
    for i, text in enumerate(texts):
        reader.offer(f"2026-12-05T12:00:01.{i:09d}Z {text}")
    now = [100.0]
    log.monotonic = lambda: now[0]  # type: ignore[attr-defined]
    kinds = [e.kind for e in log.poll(100.0)]
    now[0] = 200.0
    return kinds + [e.kind for e in log.poll(200.0)]


def test_a_flood_of_long_request_lines_does_not_push_out_the_oom(tmp_path) -> None:
    """40 lines of 64 KiB (request logging of long prompts) around one OOM traceback, all within one poll: more
    than a poll holds, so lines are dropped, and the OOM must not be among them. It counts, once."""
    from oomguard.exporter.config import EventsConfig, TargetConfig
    from oomguard.exporter.events.registry import SavedState, pod_api_log

    target = TargetConfig(url="http://10.0.0.1:8000", name="llm/vllm-0", engine="vllm")
    log, reader = pod_api_log(target, EventsConfig(), SavedState(), ("llm", "vllm-0", "vllm"), from_start=True)
    head = "(APIServer pid=1) INFO 12-05 12:00:01 [logger.py:39] Received request cmpl-1: prompt: "
    request = head + repr("torch.OutOfMemoryError: CUDA out of memory " * 1600)[: 64 * 1024 - len(head)]
    oom = [
        "(EngineCore pid=7) ERROR 12-05 12:00:01 [core.py:701] EngineCore encountered a fatal error.",
        "(EngineCore pid=7) ERROR 12-05 12:00:01 [core.py:701] Traceback (most recent call last):",
        '(EngineCore pid=7) ERROR 12-05 12:00:01 [core.py:701]   File "vllm/v1/engine/core.py", line 701',
        "(EngineCore pid=7) ERROR 12-05 12:00:01 [core.py:701] torch.OutOfMemoryError: CUDA out of memory.",
    ]
    assert kinds_counted(log, reader, [request] * 20 + oom + [request] * 20) == ["cuda_oom"]
    health = log.health()
    assert health.lines_dropped > 0 and health.lines_read == 44


def test_the_saved_position_is_the_last_line_the_poller_took() -> None:
    """Lines held for the poller when the exporter stops were not read: the next exporter reads them again."""
    reader = ApiLogReader(from_start=True)
    lines(reader, ("2026-12-05T12:00:01Z", "a"))
    assert reader.state() == {"since": "start"}  # nothing taken by the poller yet: the next reads it whole
    assert reader.poll() == ["a"]
    lines(reader, ("2026-12-05T12:00:02Z", "b"))
    assert reader.state() == {"last": "2026-12-05T12:00:01.000000000Z", "same": 1}  # b is still held
    again = ApiLogReader(state=reader.state())
    again.new_stream()
    assert lines(again, ("2026-12-05T12:00:01Z", "a"), ("2026-12-05T12:00:02Z", "b")) == [False, True]


def test_a_quiet_pods_oom_written_while_no_exporter_ran_is_read_by_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod with no line taken yet saves where it is read from: found at start, "since" that moment on the wall
    clock, which the next exporter turns into `sinceSeconds` by the time gone (its downtime included), whatever the
    node's clock says; one that came while we watched, its log's start. (The bench killed a shard whose quiet pods
    then logged an OOM: 0 of 10 were counted after its restart.)"""
    wall, mono = [1_000_000.0], [500.0]
    monkeypatch.setattr("oomguard.exporter.events.api_log.time.time", lambda: wall[0])
    monkeypatch.setattr("oomguard.exporter.events.api_log.time.monotonic", lambda: mono[0])
    found = ApiLogReader(from_start=False)
    wall[0] += 30.0
    mono[0] += 30.0
    saved = found.state()
    assert saved == {"since": "1970-01-12T13:46:40.000000000Z"}
    # The exporter stops for 90 s; the next one starts (a new monotonic clock) and asks from before its stop.
    wall[0] += 90.0
    mono[0] = 7.0
    assert ApiLogReader(state=saved, from_start=False).new_stream() == {"sinceSeconds": "120"}
    came = ApiLogReader(from_start=True)
    assert came.state() == {"since": "start"}
    assert ApiLogReader(state=came.state(), from_start=False).new_stream() == {}
    # A damaged `since` is as if none was saved: from now.
    assert ApiLogReader(state={"since": "yesterday"}, from_start=False).new_stream() == {"sinceSeconds": "1"}


@pytest.mark.parametrize(
    "tag",
    [
        "(RayWorkerWrapper pid=263, ip=10.0.16.95) ",  # a worker on another node, as Ray forwards its lines
        "(RayWorkerWrapper pid=13210) ",  # a worker on the driver's node
        "(pid=776, ip=10.0.3.4) ",  # a Ray task without an actor's name
        "\x1b[36m(RayWorkerWrapper pid=123, ip=10.0.0.2)\x1b[0m ",  # in colour
    ],
)
def test_an_oom_of_a_ray_worker_on_another_node_counts_in_the_leaders_log(tag: str) -> None:
    """vLLM over several nodes on Ray: the workers' lines reach the leader's (the driver's) log under Ray's prefix,
    where the OOM of the GPU on another node is first written. Its traceback is the worker's own: it counts once."""
    from oomguard.exporter.config import EventsConfig, TargetConfig
    from oomguard.exporter.events.registry import SavedState, pod_api_log

    target = TargetConfig(url="http://10.0.0.1:8080", name="inference/vllm-0", engine="vllm")
    log, reader = pod_api_log(target, EventsConfig(), SavedState(), ("inference", "vllm-0", "vllm"), from_start=True)
    header = "ERROR 12-05 12:00:01 [worker_base.py:620] "
    oom = [
        "INFO 12-05 12:00:01 [ray_distributed_executor.py:358] non-carry-over env vars",
        f"{tag}{header}Error executing method 'execute_model'. This might cause deadlock in distributed execution.",
        f"{tag}{header}Traceback (most recent call last):",
        f'{tag}{header}  File "vllm/worker/worker_base.py", line 612, in execute_method',
        f"{tag}{header}torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total "
        "capacity of 79.19 GiB of which 1.06 GiB is free.",
        # A prompt echoed in the driver's log counts nothing, prefix or not.
        f"{tag}INFO 12-05 12:00:02 [logger.py:39] Received request cmpl-1: prompt: 'torch.OutOfMemoryError: CUDA "
        "out of memory'",
    ]
    assert kinds_counted(log, reader, oom) == ["cuda_oom"]


def test_a_quiet_logs_saved_state_is_the_same_at_every_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod found at start whose log says nothing: its `since` is one moment, not recomputed from two clocks whose
    jitter changed its nanoseconds at every poll (the runner then wrote the whole state file twice a second: a fifth
    of a core at 1,000 quiet pods)."""
    wall, mono = [1_000_000.0], [500.0]
    monkeypatch.setattr("oomguard.exporter.events.api_log.time.time", lambda: wall[0])
    monkeypatch.setattr("oomguard.exporter.events.api_log.time.monotonic", lambda: mono[0])
    reader = ApiLogReader(from_start=False)
    first = reader.state()
    for jitter in (0.0000012, -0.0000007, 0.0000031):  # the two clocks read a few hundred nanoseconds apart
        wall[0] += 0.5 + jitter
        mono[0] += 0.5
        assert reader.poll() == []
        assert reader.state() == first
    restored = ApiLogReader(state=first, from_start=False)
    wall[0] += 0.5000009
    mono[0] += 0.5
    assert restored.state() == first  # what it goes on from is saved as it was read
