"""The settings to change, with numbers: the formulas of docs/diagnose.md, and nothing else.

gpu_memory_utilization and max_num_seqs are lowered together, never one alone (the postmortem):
a smaller reservation shrinks the KV cache pool, and the same concurrency then preempts or runs out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from oomguard.diagnose import capacity
from oomguard.diagnose.evidence import Facts
from oomguard.diagnose.verdict import Verdict

HEADROOM = 0.15  # the postmortem's 15-20 % headroom: the least...
HEADROOM_CAUTIOUS = 0.20  # ...and the cautious end
BEYOND_MARGIN = 0.05  # headroom must hold the peak use beyond the reservation plus this share of the GPU
KV_TARGET = 0.80  # KV cache use to aim for at saturation: a fifth of the cache left, no preemptions
PROBE_MARGIN = 1.5  # probe grace >= measured startup x this
START_MARGIN = 0.05  # free memory to leave at start beside what others hold


@dataclass(frozen=True)
class Recommendation:
    setting: str
    current: float | str | None  # None: unknown (with the reason in `why`)
    suggested: float | str | None
    unit: str
    why: str
    formula: str = ""

    def json(self) -> dict:
        return {k: getattr(self, k) for k in ("setting", "current", "suggested", "unit", "why", "formula")}


def _floor(x: float, step: float = 0.01) -> float:
    """Round down to `step`, forgiving float noise (0.85 stays 0.85)."""
    return round(math.floor(round(x / step, 6)) * step, 10)


def gpu_memory_utilization(current: float, beyond_peak: float) -> tuple[float, float, float]:
    """(suggested at 15 % headroom, cautious at 20 %, headroom kept): 1 - max(h, beyond + 5 %), never above now."""
    headroom = max(HEADROOM, beyond_peak + BEYOND_MARGIN)
    cautious = max(HEADROOM_CAUTIOUS, beyond_peak + BEYOND_MARGIN)
    return _floor(min(current, 1 - headroom)), _floor(min(current, 1 - cautious)), headroom


def kv_pool_factor(current: float, suggested: float, total_bytes: float | None, pool_bytes: float | None) -> float:
    """How much of the KV cache pool is left after lowering gpu_memory_utilization from current to suggested.

    Exact where the engine exports its pool (the weights do not shrink: the whole cut comes off the pool),
    else suggested / current, an upper bound.
    """
    if pool_bytes and total_bytes:
        return max(0.0, pool_bytes - (current - suggested) * total_bytes) / pool_bytes
    return suggested / current


def max_num_seqs(running: float, kv_use: float, factor: float, current: int | None = None) -> int:
    """floor(running at saturation x min(1, 0.80 / KV use there) x pool factor), never above the current value."""
    value = max(1, math.floor(round(running * min(1.0, KV_TARGET / kv_use) * factor, 6)))
    return min(value, current) if current else value


def concurrency_over_kv_cache(facts: Facts) -> Recommendation:
    """The two-knob check's advice (capacity.py), where no memory verdict already sized the cap.

    The cap to floor(capacity x 0.80): the same aim as max_num_seqs() (the cache 80 % full when the cap runs; capacity
    x 0.80 is running x 0.80 / KV use), and with the reservation changed, the same pool factor."""
    check = facts.capacity_check
    assert check.cap is not None and check.capacity is not None  # flagged
    name, now, held = check.cap_name, int(check.cap.value), check.capacity
    keep = max(1, min(now, math.floor(round(held * KV_TARGET, 6))))
    corroborated = (f"; {check.preemptions:g} preemption(s) in the window confirm it" if check.preemptions
                    else "; no preemption yet: the load has not reached the cap, the risk is latent")  # fmt: skip
    why = (
        f"the KV cache held {held:.0f} requests of the observed size at most, and {name} {now} admits "
        f"{check.ratio:.1f}x that{corroborated}; {name} {now} -> {keep} fills the cache to {100 * KV_TARGET:.0f} %"
    )
    formula = "floor(kv_cache_capacity_requests x 0.80), never above the current value"
    reservation = check.reservation
    if reservation is None:
        why += "; the reservation (gpu_memory_utilization) is unknown: tune it with the cap, never one alone"
        return Recommendation(name, now, keep, "sequences", why, formula)
    r = reservation.value
    if check.reservation_high:
        # No room to grow the cache: the cap comes down. Lowering the reservation too (the postmortem's 15 % headroom)
        # shrinks the pool, and the cap with it.
        lower = _floor(min(r, 1 - HEADROOM))
        factor = kv_pool_factor(r, lower, facts.total_bytes, facts.kv_cache_memory_bytes)
        both = max(1, min(now, math.floor(round(held * KV_TARGET * factor, 6))))
        high = facts.thresholds.reservation_high
        why += (f"; keep {reservation.name} at {r:g} (from {high:g} up the cache cannot grow), "
                f"or lower both: {reservation.name} {lower:g} and {name} {both} (a pool {100 * factor:.0f} % of "
                "today's)")  # fmt: skip
    elif r < _floor(1 - HEADROOM):
        # Room left under the 15 % headroom: growing the cache is the other way, never past it.
        higher = _floor(1 - HEADROOM)
        factor = kv_pool_factor(r, higher, facts.total_bytes, facts.kv_cache_memory_bytes)
        grown = max(1, min(now, math.floor(round(held * KV_TARGET * factor, 6))))
        why += (f"; or raise {reservation.name} {r:g} -> {higher:g} (15 % headroom, no further) for a pool "
                f"{100 * factor:.0f} % of today's, with {name} {grown}: the two together")  # fmt: skip
    else:
        why += f"; {reservation.name} {r:g} leaves less than 15 % headroom already: the cache cannot grow"
    return Recommendation(name, now, keep, "sequences", why, formula)


def probe_grace(startup_seconds: float) -> int:
    """Measured startup x 1.5, rounded up to 10 s."""
    return int(math.ceil(round(startup_seconds * PROBE_MARGIN / 10, 6)) * 10)


@dataclass(frozen=True)
class _Cap:
    """The concurrency cap as this engine names it (max_num_seqs, SGLang's max_running_requests), from
    oomguard_engine_setting or diagnose's --max-num-seqs: its value now, and what to say where it is unknown."""

    name: str
    now: int | None
    unknown: str  # "" where the value is known


def _cap(facts: Facts) -> _Cap:
    check = facts.capacity_check
    seqs = check.cap_name or "max_num_seqs"
    now = int(check.cap.value) if check.cap is not None else None
    flag = capacity.FLAGS.get(seqs, "--max-num-seqs")
    unknown = "" if now else (
        f" (current value unknown: no oomguard_engine_setting series; oomguard reads {flag} from a local engine's "
        "command line, so set it there explicitly, or pass --max-num-seqs)")  # fmt: skip
    if unknown and facts.has_engine and check.cap_name:
        # Step 3's evidence says the whole of it already (evidence.py's _capacity_items): not twice.
        unknown = " (current value unknown: step 3 says how to give it)"
    return _Cap(seqs, now, unknown)


def recommend(facts: Facts, verdict: Verdict, *, probe_delay: float, probe_source: str) -> list[Recommendation]:
    """The settings to change for the verdict, each with the figures it stands on and its formula."""
    out: list[Recommendation] = []
    cap = _cap(facts)
    util_now = facts.gpu_memory_utilization or facts.reserved_ratio
    peak = facts.peak[1] if facts.peak else None
    if verdict.name in ("memory_overcommit", "foreign_process") and util_now and peak is not None:
        out += _overcommit(facts, verdict, cap, util_now, peak)
    elif facts.capacity_check.flagged:
        out.append(concurrency_over_kv_cache(facts))
    if verdict.name == "memory_leak":
        out.append(_leak(facts))
    if verdict.name == "startup_memory":
        out += _startup_memory(facts, cap, util_now)
    out += _probe(facts, verdict, probe_delay, probe_source)
    if verdict.name == "probe_kill" and not any(r.unit == "seconds" for r in out):
        out.append(Recommendation(
            "liveness probe", None, None, "",
            "the engine starts within the probe's grace, yet dies with no OOM while serving: a liveness probe "
            "(timeoutSeconds, failureThreshold) or a watchdog that a busy engine fails; give /health a longer "
            "timeout under load, and check the orchestrator's events for who killed it",
        ))  # fmt: skip
    return out


def _overcommit(facts: Facts, verdict: Verdict, cap: _Cap, util_now: float, peak: float) -> list[Recommendation]:
    """Over-provisioning (or another process): a lower gpu_memory_utilization, and the cap lowered with it."""
    beyond = facts.unreserved_peak_ratio if facts.unreserved_peak_ratio is not None else max(0.0, peak - util_now)
    suggested, cautious, headroom = gpu_memory_utilization(util_now, beyond)
    # Over a history the peak; one reading knows only the value now, and says so.
    seen = (f"peak use beyond the reservation was {100 * beyond:.1f} % of the GPU" if facts.history else
            f"use beyond the reservation is {100 * beyond:.1f} % of the GPU now (one reading: its peak is not "
            "known, --prometheus with a window reads it)")  # fmt: skip
    utilization = Recommendation(
        "gpu_memory_utilization", util_now, suggested, "ratio",
        f"{seen}; {100 * headroom:.0f} % headroom "
        f"holds it with {100 * BEYOND_MARGIN:.0f} % to spare ({cautious:g} for 20 %)"
        + ("; move the other process off this GPU first" if verdict.name == "foreign_process" else ""),
        "1 - max(0.15, beyond_peak + 0.05), never above the current value",
    )  # fmt: skip
    return [utilization, _cap_with_utilization(facts, cap, util_now, suggested)]


def _cap_with_utilization(facts: Facts, cap: _Cap, util_now: float, suggested: float) -> Recommendation:
    """The concurrency cap lowered together with gpu_memory_utilization: sized from the requests that ran at the KV
    cache's saturation (else its peak) in the smaller pool, where the history has enough points."""
    check = facts.capacity_check
    running = facts.running_at_saturation if facts.kv_saturated else None
    kv_use = facts.kv_at_saturation if facts.kv_saturated else facts.kv_peak
    if running is None and facts.running and facts.kv:
        t_peak = max(facts.kv, key=lambda p: p[1])[0]
        running = dict(facts.running).get(t_peak)
    if facts.history and check.capacity is None:
        # Too few points to say what the cache holds (step 3 says so): no figure from them either.
        return Recommendation(
            cap.name, cap.now, None, "sequences",
            f"too few points in the window to size it ({check.samples} of the {capacity.MIN_SAMPLES} step 3 "
            "needs: a longer --window); lower it in proportion to gpu_memory_utilization, never one alone"
            + cap.unknown)  # fmt: skip
    if running and kv_use:
        factor = kv_pool_factor(util_now, suggested, facts.total_bytes, facts.kv_cache_memory_bytes)
        value = max_num_seqs(running, kv_use, factor, cap.now)
        held = (f" (the KV cache held {check.capacity:.0f} requests of the observed size at most)"
                if check.capacity is not None else "")  # fmt: skip
        return Recommendation(
            cap.name, cap.now, value, "sequences",
            f"{running:g} requests ran with the KV cache {100 * kv_use:.0f} % full{held}; aim at "
            f"{100 * KV_TARGET:.0f} % in a pool {100 * factor:.0f} % of today's once gpu_memory_utilization is "
            f"{suggested:g}; lower it together with gpu_memory_utilization, never one alone" + cap.unknown,
            "floor(running_at_saturation x min(1, 0.80 / kv_use_at_saturation) x pool_factor)",
        )  # fmt: skip
    return Recommendation(cap.name, cap.now, None, "sequences",
                          "no engine series to size it from: lower it in proportion to "
                          "gpu_memory_utilization, never one alone" + cap.unknown)  # fmt: skip


def _leak(facts: Facts) -> Recommendation:
    """No setting fixes a leak: its pace, and what to look for."""
    pace = ""
    if facts.climb:
        rise, seconds, _ = facts.climb  # simulated seconds: the pace per minute of the scenario's clock
        pace = f"memory climbs {100 * rise / seconds * 60:.2f} % of the GPU per minute; "
    return Recommendation(
        "the leak", None, None, "",
        pace + "no setting fixes a leak, and lowering gpu_memory_utilization only delays it: find what holds "
        "memory (streams or connections never released, a malformed request leaving blocks unreclaimed, a "
        "version's known leak); meanwhile restart the engine before it reaches the top",
    )  # fmt: skip


def _startup_memory(facts: Facts, cap: _Cap, util_now: float | None) -> list[Recommendation]:
    """Memory short at start: a reservation that fits beside what others hold."""
    held = facts.other_peak_ratio
    if held is None and facts.memory:
        held = min(v for _, v in facts.memory)  # what the GPU holds while the engine holds nothing
    if held is None:
        return []
    suggested = _floor(min(util_now or 1.0, 1 - held - START_MARGIN))
    return [Recommendation(
        "gpu_memory_utilization", util_now, suggested, "ratio",
        f"{100 * held:.1f} % of the GPU is held by others when the engine starts; the reservation must fit "
        "in the rest with 5 % to spare (or free the GPU, or lower max_model_len); lower max_num_seqs with "
        "it" + cap.unknown + ("" if util_now else "; the current value is unknown: the engine never "
                              "answered, so its configuration was never read"),
        "1 - held_by_others - 0.05, never above the current value",
    )]  # fmt: skip


def _probe(facts: Facts, verdict: Verdict, probe_delay: float, probe_source: str) -> list[Recommendation]:
    """A probe's grace shorter than the measured startup, where the engine restarted (or a probe kills it)."""
    if facts.startup_seconds is None or not (facts.restart_count or verdict.name == "probe_kill"):
        return []
    grace = probe_grace(facts.startup_seconds)
    if grace <= probe_delay:
        return []
    return [Recommendation(
        "probe initial delay (or startup probe budget)", probe_delay, grace, "seconds",
        f"the engine took {facts.startup_seconds:.0f}s to start; a probe that judges it before then kills "
        f"it while it loads: a restart storm (current value from {probe_source})",
        "ceil10(startup_seconds x 1.5)",
    )]  # fmt: skip
