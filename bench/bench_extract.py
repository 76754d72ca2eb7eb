"""Extraction cost per /metrics body: oomguard's FamilyExtractor + Vllm.read vs prometheus_client's full parser.

Goal: extraction at least 40x faster than the full parser.
Run: python bench/bench_extract.py [--number 200] [--repeat 9]
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable

from _common import FIXTURE, cpu_mark, machine, median, other_load
from prometheus_client.parser import text_string_to_metric_families

from oomguard.common.promtext import FamilyExtractor
from oomguard.exporter.engines.vllm.reader import VllmReader
from oomguard.exporter.model import EngineReading

GOAL_RATIO = 40.0


def interleaved_ms(fns: list[tuple[Callable[[], object], int]], repeat: int) -> list[list[float]]:
    """Per function, `repeat` timings in ms per call; the functions take turns, so load that comes and goes on a
    shared machine hits them alike instead of whichever ran during the burst."""
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for times, (fn, number) in zip(out, fns, strict=True):
            times.append(timeit.timeit(fn, number=number) / number * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--number", type=int, default=200, help="calls per timed run")
    parser.add_argument("--repeat", type=int, default=9, help="timed runs of each, taking turns; medians reported")
    args = parser.parse_args()
    where = machine()

    text = FIXTURE.read_text(encoding="utf-8")
    extractor = FamilyExtractor(VllmReader.families)  # compiled once, as the exporter does per engine
    engine = VllmReader()

    def ours() -> EngineReading:
        return engine.read(extractor.extract(text))

    def full() -> list[object]:
        # Consumed in full: the parser is a generator, and the exporter would need every family to find ours.
        return [sample for family in text_string_to_metric_families(text) for sample in family.samples]

    # A sanity check first: timing an extractor that finds nothing would mean nothing.
    reading = ours()
    assert reading.models, "no vLLM model read from the fixture"

    for _ in range(args.number):  # warm up (caches, CPU clock) so the first timing is not penalised
        ours()
    mark = cpu_mark()
    # The full parser is ~20x slower: fewer calls per run, so each run lasts about as long.
    extract_t, ours_t, full_t = interleaved_ms(
        [(lambda: extractor.extract(text), args.number), (ours, args.number), (full, max(1, args.number // 20))],
        args.repeat,
    )
    extract_ms, ours_ms, full_ms = median(extract_t), median(ours_t), median(full_t)
    ratio = median([f / o for f, o in zip(full_t, ours_t, strict=True)])  # per turn: both saw the same load
    other = other_load(mark)

    print(
        f"## Extraction: one {len(text.encode()) / 1000:.1f} kB body ({FIXTURE.name}; {where}; "
        f"other processes used {other:.0f} % of the CPUs meanwhile)\n"
    )
    print("| measure | median ms per call |")
    print("|---|---:|")
    print(f"| FamilyExtractor.extract only | {extract_ms:.3f} |")
    print(f"| FamilyExtractor.extract + Vllm.read | {ours_ms:.3f} |")
    print(f"| prometheus_client text_string_to_metric_families, consumed | {full_ms:.3f} |")
    verdict = "met" if ratio >= GOAL_RATIO else "not met"
    print(f"| **speed-up**, median of per-turn ratios (goal >= {GOAL_RATIO:g}x) | **{ratio:.1f}x** ({verdict}) |")


if __name__ == "__main__":
    main()
