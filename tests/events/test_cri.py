"""CRI container log lines: partial records joined per stream, malformed lines passed through."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomguard.events.cri import CriDecoder, parse
from oomguard.events.follow import FileFollower

TS = "2024-05-01T12:00:00.123456789Z"


def test_full_records() -> None:
    decoder = CriDecoder()
    assert decoder.feed(f"{TS} stdout F hello world") == ["hello world"]
    assert decoder.feed(f"{TS} stderr F  two  spaces kept ") == [" two  spaces kept "]
    assert decoder.feed(f"{TS} stdout F ") == [""]
    assert decoder.feed(f"{TS} stdout F") == [""]  # no separator after an empty message
    assert decoder.malformed == 0


def test_partial_records_are_joined_per_stream() -> None:
    decoder = CriDecoder()
    assert decoder.feed(f"{TS} stdout P torch.OutOfMemoryError: CUDA ") == []
    assert decoder.feed(f"{TS} stderr P err ") == []
    assert decoder.feed(f"{TS} stdout P out of memory. ") == []
    assert decoder.feed(f"{TS} stderr F line") == ["err line"]
    assert decoder.feed(f"{TS} stdout F Tried to allocate 2.00 GiB") == [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    ]
    assert decoder.feed(f"{TS} stdout F next") == ["next"]


def test_tags_after_the_first_and_timestamps_with_an_offset() -> None:
    decoder = CriDecoder()
    assert decoder.feed("2024-05-01T14:00:00+02:00 stdout P:x a") == []
    assert decoder.feed("2024-05-01T14:00:00.5-07:00 stdout F:y b") == ["ab"]
    assert decoder.malformed == 0


@pytest.mark.parametrize(
    "line",
    [
        "plain text from a non-CRI file",
        "",
        f"{TS} stdin F wrong stream",
        f"{TS} stdout X wrong tag",
        f"2024-05-01 stdout F date only {TS}",
        f"{TS}stdout F no space",
        "2024-05-01T12:00:00Z stdout",
    ],
)
def test_malformed_lines_pass_through_and_are_counted(line: str) -> None:
    decoder = CriDecoder()
    assert decoder.feed(line) == [line]
    assert decoder.malformed == 1
    assert parse(line) is None


def test_a_malformed_line_between_partials_does_not_break_the_join() -> None:
    decoder = CriDecoder()
    assert decoder.feed(f"{TS} stdout P abc") == []
    assert decoder.feed("garbage") == ["garbage"]
    assert decoder.feed(f"{TS} stdout F def") == ["abcdef"]
    assert decoder.malformed == 1


def test_a_joined_message_is_capped_at_1_mib() -> None:
    decoder = CriDecoder()
    chunk = "x" * 16 * 1024
    for _ in range(100):  # 1.6 MiB in 16 KiB partial records, as the runtime splits them
        assert decoder.feed(f"{TS} stdout P {chunk}") == []
    [message] = decoder.feed(f"{TS} stdout F end")
    assert len(message) == 1024 * 1024
    assert decoder.truncated == 1
    assert decoder.feed(f"{TS} stdout F small") == ["small"]
    assert decoder.truncated == 1


def test_the_cap_counts_utf8_bytes_and_never_cuts_a_character_in_two() -> None:
    decoder = CriDecoder(max_message_bytes=10)
    assert decoder.feed(f"{TS} stdout P \u00e9\u00e9\u00e9\u00e9") == []  # 8 bytes
    [message] = decoder.feed(f"{TS} stdout F \u00e9\u00e9")  # 2 of the 4 bytes fit: one character
    assert message == "\u00e9" * 5
    assert decoder.truncated == 1
    [long] = decoder.feed(f"{TS} stdout F {'y' * 50}")  # a single full record is capped too
    assert long == "y" * 10
    assert decoder.truncated == 2


def test_flush_returns_what_never_got_its_final_record() -> None:
    decoder = CriDecoder()
    decoder.feed(f"{TS} stdout P unfinished")
    assert decoder.flush() == ["unfinished"]
    assert decoder.flush() == []


def test_with_the_follower_on_a_pod_log(tmp_path: Path) -> None:
    pod = tmp_path / "pods" / "ns_vllm-0_1234" / "vllm"
    pod.mkdir(parents=True)
    log = pod / "0.log"
    log.write_text("")
    follower = FileFollower(str(tmp_path / "pods" / "*" / "vllm" / "*.log"))
    decoder = CriDecoder()
    assert follower.poll() == []
    with open(log, "a") as f:
        f.write(f"{TS} stderr P (EngineCore pid=42) torch.OutOfMemoryError: CUDA out of")
        f.write(f" memory.\n{TS} stderr F  Tried to allocate 20.00 MiB\n{TS} stdout F INFO ok\n")
    messages = [m for line in follower.poll() for m in decoder.feed(line)]
    assert messages == [
        "(EngineCore pid=42) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
        "INFO ok",
    ]
    follower.close()
