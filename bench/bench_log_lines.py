"""What reading each log line with its engine's grammar costs (events/records.py), against searching the patterns
anywhere in it (one combined regex search a line, which counts what a prompt quotes), in one run: the ratio, not the
times, is what compares across machines.

The lines: a real vLLM 0.32's log with request logging at DEBUG (tests/events/fixtures/), over and over, and the
same with each request line grown to 64 KiB (long prompts: the lines a flood is made of). Each line goes through
the detector a vLLM target gets (IncidentDetector.feed), or, for the baseline, through the combined search alone.
Run: python bench/bench_log_lines.py [--lines 200000]
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from _common import machine

from oomguard.exporter.engines import ENGINES
from oomguard.exporter.events.catalogue import load_catalogue
from oomguard.exporter.events.detector import IncidentDetector

FIXTURE = Path(__file__).parent.parent / "tests/events/fixtures/vllm-0.32-cpu-hostile-requests.log"


def corpus(n: int, long: bool) -> list[str]:
    lines = FIXTURE.read_text().splitlines()
    if long:
        lines = [line + " x" * 32768 if "request_logger" in line else line for line in lines]
    return (lines * (n // len(lines) + 1))[:n]


def per_line_us(fn, lines: list[str]) -> float:  # type: ignore[no-untyped-def]
    start = time.process_time()
    for i, line in enumerate(lines):
        fn(line, float(i))
    return (time.process_time() - start) / len(lines) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=200_000)
    args = parser.parse_args()
    combined = re.compile("|".join(f"(?:{p.regex.pattern})" for p in load_catalogue("vllm")))

    def searched(line: str, now: float) -> object:
        return combined.search(line)

    print(machine())
    for long in (False, True):
        lines = corpus(args.lines if not long else args.lines // 20, long)
        detector = IncidentDetector(load_catalogue("vllm"), grammar=ENGINES["vllm"].log_grammar)  # a vLLM target's
        before = per_line_us(searched, lines)
        after = per_line_us(detector.feed, lines)
        kind = "request lines of 64 KiB" if long else "the recorded log"
        print(f"{kind}: {len(lines)} lines; searched anywhere {before:.2f} us a line, read with the grammar "
              f"{after:.2f} us a line: x{after / before:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
