"""Choose a verdict from the facts, with a confidence: the share of the verdict's criteria the evidence meets.

The rules, first match wins (docs/diagnose.md explains each):
insufficient_data -> startup_memory -> (memory in trouble: foreign_process -> memory_overcommit -> memory_leak)
-> probe_kill -> (one reading: the KV cache full with a queue now: memory_overcommit) -> healthy.

Memory in trouble is an OOM, memory at the top (GpuMemoryCritical's threshold, from the bundle configuration), a
climb, a spike or saturated trend state, or, in one reading of an exporter, a memory page's condition now
(GpuMemoryCritical, TargetMemoryOverBudget, GpuMemoryExhaustedSoon): a reading where one of the shipped pages'
conditions holds is never healthy.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomguard.common import kinds
from oomguard.diagnose.evidence import Facts

INSUFFICIENT = "insufficient_data"
HEALTHY = "healthy"
NO_HISTORY_FACTOR = 0.7  # one reading of one exporter: the trend is its word, not ours


@dataclass(frozen=True)
class Verdict:
    name: str
    confidence: float
    summary: str
    criteria: dict[str, bool]  # what was checked, and whether the evidence met it

    @property
    def finding(self) -> bool:
        return self.name not in (HEALTHY, INSUFFICIENT)


def confidence_label(confidence: float) -> str:
    return "high" if confidence >= 0.75 else "medium" if confidence >= 0.5 else "low"


def _make(name: str, summary: str, facts: Facts, criteria: dict[str, bool]) -> Verdict:
    confidence = sum(criteria.values()) / len(criteria)
    # Judged without the per-GPU join: the same criteria on coarser evidence (evidence.py's fallback).
    confidence *= facts.evidence_factor
    if not facts.history:
        confidence *= NO_HISTORY_FACTOR
    return Verdict(name, round(confidence, 2), summary, criteria)


def _pages_words(facts: Facts) -> str:
    """One reading: the memory pages whose conditions hold now, by the rules' names, in parentheses."""
    paging = facts.memory_paging
    return " (" + "; ".join(f"{page.name}: {why}" for page, why in paging) + ")" if paging else ""


def _memory_words(facts: Facts, at_top: bool, spiked: bool, ooms: float) -> str:
    """What memory did, as words after a comma: only what the figures say (the criteria print the same ones); in one
    reading, the memory pages whose conditions hold now, by name, as the rules page on them."""
    paging = facts.memory_paging
    if at_top:
        words = ", memory went to the top" if facts.history else ", memory is at the top now"
    elif spiked:
        words = ", memory spiked toward the top (the exporter's trend: spike)"
    elif paging:
        words = ", memory is in a state the shipped rules page on now"
    else:
        words = ""
    words += _pages_words(facts)
    if ooms:
        words += f" and ran out ({ooms:g} OOM(s))" if words else f", memory ran out ({ooms:g} OOM(s))"
    return words


def decide(facts: Facts, probe_delay: float) -> Verdict:
    """The verdict, the first that holds of: no series at all, memory short at start, memory in trouble (another
    process, a full cache, a climb, else over-provisioning), a probe killing the engine, no memory series, a full
    cache now (one reading), else healthy."""
    what = f"target {facts.target}" if facts.target is not None else f"GPU {','.join(facts.gpus)}"
    startup_memory = facts.event_counts.get(kinds.STARTUP_MEMORY, 0.0)
    # An engine that never came up in the window is loading: its memory rises with the load, which is no leak.
    loading = facts.ever_up is False
    climbing = facts.climbing and not loading
    trouble = _memory_trouble(facts, climbing)
    return (
        _no_series(facts, what)
        or _startup_memory(facts, what, startup_memory)
        or (_trouble_verdict(facts, what, climbing) if trouble and facts.has_memory else None)
        or _probe_kill(facts, what, probe_delay, startup_memory)
        or _present(facts, what)
        or _healthy(facts, what, loading, trouble)
    )


def _no_series(facts: Facts, what: str) -> Verdict | None:
    """Insufficient where none of oomguard's memory, engine or event series was found."""
    if facts.has_memory or facts.has_engine or facts.event_counts or facts.restart_count:
        return None
    where = (
        "in the window; check --instance/--target, the window, and that oomguard is scraped"
        if facts.history
        else "in the exporter's /metrics; check --target and the exporter's targets"
    )
    return Verdict(INSUFFICIENT, 0.0, f"{what}: none of oomguard's memory, engine or event series {where}",
                   {})  # fmt: skip


def _startup_memory(facts: Facts, what: str, startup_memory: float) -> Verdict | None:
    """The engine cannot allocate its memory at start: it never came up, or rarely stays up without a CUDA OOM."""
    cuda_oom = facts.event_counts.get(kinds.CUDA_OOM, 0.0)
    never_up = facts.ever_up is False
    if startup_memory and (never_up or not cuda_oom):
        return _make("startup_memory", f"{what} cannot allocate its memory at start ({startup_memory:g} "
                     "startup_memory event(s)) and " + ("never came up" if never_up else "rarely stays up") +
                     ": lower gpu_memory_utilization (or max_model_len), or free the GPU",
                     facts, {"startup_memory events": True, "never up": never_up, "no CUDA OOM while serving":
                             not cuda_oom})  # fmt: skip
    return None


def _memory_trouble(facts: Facts, climbing: bool) -> bool:
    """Memory in trouble: an OOM, memory at the top, a climb, a spike or saturation, or (one reading) a memory
    page's condition now."""
    # One reading: a memory page's condition now (its figure, not the trend, which may still be `unknown`).
    paging = bool(facts.memory_paging)
    return (facts.ooms > 0 or facts.memory_top or climbing or bool({"spike", "saturated"} & set(facts.trend_states))
            or paging)  # fmt: skip


def _trouble_verdict(facts: Facts, what: str, climbing: bool) -> Verdict:
    """Memory in trouble: another process grew, the concurrency overran the cache, a leak, else over-provisioning."""
    ooms = facts.ooms
    paging = bool(facts.memory_paging)
    # Memory at the top by diagnose's measure or by the exporter's (saturated: pinned near the top): what a summary
    # that says "went to the top" stands on, and the criterion that says so, the same figure.
    at_top = facts.memory_top or "saturated" in facts.trend_states
    spiked = "spike" in facts.trend_states
    if facts.foreign_growth:
        grew = (f"another process on the GPU grew by {100 * facts.other_rise_ratio:.1f} % of it" if facts.history
                else f"other processes hold {100 * facts.other_rise_ratio:.1f} % of the GPU now")  # fmt: skip
        return _make("foreign_process", f"{what}: {grew} while the engine stayed within its "
                     "reservation" + _memory_words(facts, at_top, spiked, 0), facts, {
                         "other processes grew": True, "engine within its reservation": True,
                         "memory at the top or OOM": at_top or ooms > 0,
                         "KV cache not saturated": not facts.kv_saturated})  # fmt: skip
    if facts.kv_saturated and facts.backlog:
        return _make("memory_overcommit", f"{what}: over-provisioned concurrency: the KV cache was full, "
                     "requests waited and were preempted" + _memory_words(facts, at_top, spiked, ooms), facts, {
                         "KV cache saturated": True, "requests waiting or preempted": True,
                         "memory at the top or a spike": at_top or spiked, "OOM": ooms > 0})  # fmt: skip
    if climbing:
        return _make("memory_leak", f"{what}: memory climbs and does not fall back" + _pages_words(facts) +
                     ", with no matching rise in KV cache use or concurrency" + (f"; {ooms:g} OOM(s)" if ooms else
                                                                                ""), facts, {
                         "memory climbs": True, "KV cache not saturated": not facts.kv_saturated,
                         "no request backlog": not facts.backlog,
                         "climb confirmed by the exporter's trend and by the history":
                             "climbing" in facts.trend_states and (facts.climb is not None or not facts.history),
                         "OOM or over budget": ooms > 0 or (facts.over_budget_peak_bytes or 0) > 0})  # fmt: skip
    # Memory ran out, or is at the top, or spiked, or (one reading) a memory page's condition holds now, with
    # neither a climb nor a full cache. A history tells a spike from a climb; one reading of the exporter cannot
    # (a climb the user watched ends at the top too). Every way into `trouble` ends here at the latest.
    how = " without a climb" if facts.history else ""
    unread = ("; one reading cannot tell a climb from a spike: --prometheus with a window can"
              if not facts.history else "")  # fmt: skip
    criteria = {"memory at the top": at_top, "OOM": ooms > 0, "KV cache saturated": facts.kv_saturated,
                "requests waiting or preempted": facts.backlog}  # fmt: skip
    if not facts.history:
        criteria["a memory page's condition holds now"] = paging
    return _make("memory_overcommit", f"{what}:" + _memory_words(facts, at_top, spiked, ooms).lstrip(",")
                 + how + ": over-provisioning, though the engine's queue does not show it" + unread,
                 facts, criteria)  # fmt: skip


def _probe_kill(facts: Facts, what: str, probe_delay: float, startup_memory: float) -> Verdict | None:
    """Restarts with no OOM: a probe or watchdog kills the engine, its startup longer than the probe's grace or not."""
    restarts = facts.restart_count
    if restarts < 2 or facts.ooms != 0 or startup_memory:
        return None
    slow = facts.startup_seconds is not None and facts.startup_seconds > probe_delay
    return _make("probe_kill", f"{what}: {restarts:g} restarts with no OOM; " + (
        f"its startup ({facts.startup_seconds:.0f}s) is longer than the probe's grace ({probe_delay:g}s)"
        if slow else "a probe or watchdog kills the engine (check the liveness probe)"), facts, {
            "restarts": True, "no OOM": True, "startup longer than the probe's grace": slow,
            "memory normal": not facts.memory_top,
            "no engine_death in the log": not facts.event_counts.get(kinds.ENGINE_DEATH)})  # fmt: skip


def _present(facts: Facts, what: str) -> Verdict | None:
    """No memory series to judge, or (one reading) the KV cache full and requests queued now."""
    if not facts.has_memory:
        return Verdict(INSUFFICIENT, 0.0, f"{what}: no GPU memory series in the window, so the first question "
                       "(the memory trend) cannot be answered; check that NVML is enabled", {})  # fmt: skip
    if not facts.history and facts.kv_saturated and facts.backlog:
        # One reading, the present: the KV cache full and requests queued or preempted now is the over-provisioned
        # concurrency the incident began with, whatever the trend says yet (a history weighs its peaks, which need
        # not be at one time, and keeps to its memory verdicts).
        t = facts.thresholds
        return _make("memory_overcommit", f"{what}: over-provisioned concurrency now: the KV cache is full (>= "
                     f"{100 * t.kv_saturated:g} %), requests wait or are preempted; no memory page's condition holds "
                     "yet; one reading cannot tell where memory goes: --prometheus with a window can", facts, {
                         "KV cache saturated": True, "requests waiting or preempted": True,
                         "memory at the top or a spike": False, "OOM": False})  # fmt: skip
    return None


def _healthy(facts: Facts, what: str, loading: bool, trouble: bool) -> Verdict:
    """Memory within its headroom, with what a healthy engine may still be warned of."""
    ooms, restarts = facts.ooms, facts.restart_count
    state = " (not up in the window: still loading; memory rising with a load is no leak)" if loading else ""
    check = facts.capacity_check
    if check.flagged and check.cap is not None:
        # Healthy today, and a configuration the postmortem warns of: said here, sized in the recommendations.
        state += (f"; but {check.cap.name} {check.cap.value:g} admits {check.ratio:.1f}x the requests its KV cache "
                  "held (step 3)")  # fmt: skip
    if not facts.history:
        state += "; no shipped page's condition holds now"
    return _make(HEALTHY, f"{what}: memory within its headroom, no OOM, no restart storm{state}", facts, {
        "no OOM": ooms == 0, "no climb or spike": not trouble,
        "KV cache not saturated": not facts.kv_saturated, "fewer than 2 restarts": restarts < 2})  # fmt: skip
