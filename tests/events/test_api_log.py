"""A log read through the API (events/api_log.py): the kubelet's timestamps read, a resumed stream's repeats
dropped and nothing else, the position saved and restored, a damaged one refused."""

from __future__ import annotations

import time

import pytest

from oomguard.events.api_log import ApiLogReader, parse_timestamp, since_time


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
    assert reader.new_stream() is None  # a new pod's log: from its start
    assert lines(reader, ("2026-12-05T12:00:01.1Z", "a"), ("2026-12-05T12:00:02.5Z", "b"),
                 ("2026-12-05T12:00:02.5Z", "c")) == [True, True, True]  # fmt: skip
    assert reader.poll() == ["a", "b", "c"]
    # The stream drops; the next one starts at the second of the last line, which the API includes.
    assert reader.new_stream() == "2026-12-05T12:00:02Z"
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


def test_a_pod_found_at_start_is_read_from_now() -> None:
    reader = ApiLogReader(from_start=False)
    since = reader.new_stream()
    assert since is not None and abs(parse_timestamp(since)[0] - time.time()) < 5  # type: ignore[index]
    old = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 3600)) + ".0Z"
    assert lines(reader, (old, "an OOM an hour ago, perhaps counted already")) == [False]


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
    assert again.new_stream() == "2026-12-05T12:00:02Z"
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
    assert reader.new_stream() is None


def test_what_the_poller_has_not_taken_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("oomguard.events.api_log.MAX_HELD_BYTES", 20)
    reader = ApiLogReader(from_start=True)
    for i in range(5):
        reader.offer(f"2026-12-05T12:00:0{i}Z line {i}")  # 6 characters each: 3 fit
    assert reader.poll() == ["line 2", "line 3", "line 4"]
    assert reader.stats.lines_truncated == 2
    reader.offer("2026-12-05T12:00:06Z line 6")
    assert reader.poll() == ["line 6"]  # the count starts afresh after a poll


def test_the_saved_position_is_the_last_line_the_poller_took() -> None:
    """Lines held for the poller when the exporter stops were not read: the next exporter reads them again."""
    reader = ApiLogReader(from_start=True)
    lines(reader, ("2026-12-05T12:00:01Z", "a"))
    assert reader.state() == {}  # nothing taken by the poller yet
    assert reader.poll() == ["a"]
    lines(reader, ("2026-12-05T12:00:02Z", "b"))
    assert reader.state() == {"last": "2026-12-05T12:00:01.000000000Z", "same": 1}  # b is still held
    again = ApiLogReader(state=reader.state())
    again.new_stream()
    assert lines(again, ("2026-12-05T12:00:01Z", "a"), ("2026-12-05T12:00:02Z", "b")) == [False, True]
