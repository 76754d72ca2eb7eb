"""The formulas of docs/diagnose.md, on its worked examples (the same numbers)."""

from __future__ import annotations

from oomguard.diagnose.recommend import gpu_memory_utilization, kv_pool_factor, max_num_seqs, probe_grace

GIB = 1024**3


def test_example_1_incident() -> None:
    # gpu_memory_utilization 0.90 on 80 GiB, peak use beyond the reservation 9.6 %, 16 requests running with the
    # KV cache 100 % full, the pool 40 GiB.
    suggested, cautious, headroom = gpu_memory_utilization(0.90, 0.096)
    assert (suggested, cautious, round(headroom, 3)) == (0.85, 0.80, 0.15)
    factor = kv_pool_factor(0.90, 0.85, 80 * GIB, 40 * GIB)
    assert round(factor, 3) == 0.9
    assert max_num_seqs(16, 1.0, factor) == 11
    assert max_num_seqs(16, 1.0, factor, current=64) == 11
    assert probe_grace(240) == 360


def test_example_2_pool_unknown() -> None:
    # The same without the KV pool exported: the factor is 0.85 / 0.90, an upper bound.
    factor = kv_pool_factor(0.90, 0.85, 80 * GIB, None)
    assert round(factor, 3) == 0.944
    assert max_num_seqs(16, 1.0, factor) == 12


def test_example_3_large_overshoot() -> None:
    # 0.90 with 14 % of the GPU used beyond the reservation: the headroom must hold 14 % + 5 %.
    suggested, cautious, headroom = gpu_memory_utilization(0.90, 0.14)
    assert (suggested, cautious, round(headroom, 2)) == (0.81, 0.80, 0.19)
    # 24 requests at 96 % KV, pool 30 GiB of 80 losing 0.09 x 80 = 7.2 GiB.
    factor = kv_pool_factor(0.90, 0.81, 80 * GIB, 30 * GIB)
    assert round(factor, 2) == 0.76
    assert max_num_seqs(24, 0.96, factor) == 15
    assert probe_grace(75) == 120


def test_never_raises_what_is_already_low() -> None:
    assert gpu_memory_utilization(0.70, 0.02)[0] == 0.70
    assert max_num_seqs(10, 0.5, 1.0) == 10  # a cache that was never full: no more than what ran
    assert max_num_seqs(10, 1.0, 1.0, current=4) == 4
