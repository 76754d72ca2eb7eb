"""CRI container log lines: partial records joined per stream, malformed lines passed through."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomguard.exporter.events.cri import CriDecoder, PodLogReader, parse
from oomguard.exporter.events.file_follower import FileFollower

TS = "2024-05-01T12:00:00.123456789Z"


def test_full_records() -> None:
    decoder = CriDecoder()
    assert decoder.feed(f"{TS} stdout F hello world") == ["hello world"]
    assert decoder.feed(f"{TS} stderr F  two  spaces kept ") == [" two  spaces kept "]
    assert decoder.feed(f"{TS} stdout F ") == [""]
    assert decoder.feed(f"{TS} stdout F") == [""]  # no separator after an empty message
    assert decoder.stats.lines_malformed == 0


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
    assert decoder.stats.lines_malformed == 0


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
    assert decoder.stats.lines_malformed == 1
    assert parse(line) is None


def test_a_malformed_line_between_partials_does_not_break_the_join() -> None:
    decoder = CriDecoder()
    assert decoder.feed(f"{TS} stdout P abc") == []
    assert decoder.feed("garbage") == ["garbage"]
    assert decoder.feed(f"{TS} stdout F def") == ["abcdef"]
    assert decoder.stats.lines_malformed == 1


def test_a_joined_message_is_capped_at_1_mib() -> None:
    decoder = CriDecoder()
    chunk = "x" * 16 * 1024
    for _ in range(100):  # 1.6 MiB in 16 KiB partial records, as the runtime splits them
        assert decoder.feed(f"{TS} stdout P {chunk}") == []
    [message] = decoder.feed(f"{TS} stdout F end")
    assert len(message) == 1024 * 1024
    assert decoder.stats.lines_truncated == 1
    assert decoder.feed(f"{TS} stdout F small") == ["small"]
    assert decoder.stats.lines_truncated == 1


def test_the_cap_counts_utf8_bytes_and_never_cuts_a_character_in_two() -> None:
    decoder = CriDecoder(max_message_bytes=10)
    assert decoder.feed(f"{TS} stdout P \u00e9\u00e9\u00e9\u00e9") == []  # 8 bytes
    [message] = decoder.feed(f"{TS} stdout F \u00e9\u00e9")  # 2 of the 4 bytes fit: one character
    assert message == "\u00e9" * 5
    assert decoder.stats.lines_truncated == 1
    [long] = decoder.feed(f"{TS} stdout F {'y' * 50}")  # a single full record is capped too
    assert long == "y" * 10
    assert decoder.stats.lines_truncated == 2


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


def pod_reader(tmp_path: Path) -> tuple[PodLogReader, Path]:
    container = tmp_path / "pods" / "ns_vllm-0_1234" / "vllm"
    container.mkdir(parents=True)
    (container / "0.log").write_text("")
    reader = PodLogReader(str(tmp_path / "pods" / "*" / "vllm" / "*.log"))
    reader.follower.drain_grace_seconds = 0.0  # a rotated-away file is let go as soon as it is drained
    assert reader.poll() == []
    return reader, container


def test_a_partial_record_is_returned_when_its_file_is_rotated_away_for_good(tmp_path: Path) -> None:
    reader, container = pod_reader(tmp_path)
    with open(container / "0.log", "a") as f:
        f.write(f"{TS} stderr F first\n{TS} stderr P torch.OutOfMemoryError: CUDA out of memory.\n")
    assert reader.poll() == ["first"]  # the partial record waits for its final one
    (container / "0.log").rename(container / "0.log.20240501-120000")  # rotated, and the pod is gone: no 0.log
    assert reader.poll() == ["torch.OutOfMemoryError: CUDA out of memory."]
    assert reader.decoders == {} and reader.poll() == []


def test_a_partial_record_is_returned_when_its_file_is_deleted(tmp_path: Path) -> None:
    reader, container = pod_reader(tmp_path)
    with open(container / "0.log", "a") as f:
        f.write(f"{TS} stdout P half a line\n")
    assert reader.poll() == []
    (container / "0.log").unlink()
    assert reader.poll() == ["half a line"]


def test_a_record_cut_by_the_kubelets_rotation_goes_on_in_the_new_file(tmp_path: Path) -> None:
    reader, container = pod_reader(tmp_path)
    with open(container / "0.log", "a") as f:
        f.write(f"{TS} stderr P torch.OutOfMemoryError: CUDA \n")
    assert reader.poll() == []
    (container / "0.log").rename(container / "0.log.20240501-120000")
    (container / "0.log").write_text(f"{TS} stderr F out of memory.\n")
    messages = reader.poll() + reader.poll()
    assert messages == ["torch.OutOfMemoryError: CUDA out of memory."]


def test_close_returns_the_partial_records_held(tmp_path: Path) -> None:
    reader, container = pod_reader(tmp_path)
    with open(container / "0.log", "a") as f:
        f.write(f"{TS} stdout P out: unfinished\n{TS} stderr P err: unfinished\n")
    assert reader.poll() == []
    assert sorted(reader.close()) == ["err: unfinished", "out: unfinished"]
    assert reader.close() == []


def test_malformed_and_truncated_lines_are_counted_in_the_readers_stats(tmp_path: Path) -> None:
    reader, container = pod_reader(tmp_path)
    reader.decoders[str(container / "0.log")] = CriDecoder(10, stats=reader.stats)  # a 10-byte cap
    with open(container / "0.log", "a") as f:
        f.write(f"not a CRI line\n{TS} stdout F {'x' * 20}\n")
    assert reader.poll() == ["not a CRI line", "x" * 10]
    assert reader.stats.lines_malformed == 1 and reader.stats.lines_truncated == 1
    assert reader.stats.lines_read == 2
