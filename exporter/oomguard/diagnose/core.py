"""One diagnosis per target (or per GPU where no engine is known), from what `query` read."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from oomguard.bundle.thresholds import DEFAULTS, Thresholds, default_thresholds
from oomguard.diagnose.clock import clock_of
from oomguard.diagnose.evidence import Facts, Item, evidence, gather, gpu_id
from oomguard.diagnose.query import Data, fetch_exporter, fetch_prometheus
from oomguard.diagnose.recommend import Recommendation, recommend
from oomguard.diagnose.verdict import INSUFFICIENT, confidence_label, decide


@dataclass
class Diagnosis:
    target: str | None
    instance: str | None
    gpus: list[str]
    verdict: str
    confidence: float
    summary: str
    evidence: list[Item]
    recommendations: list[Recommendation]
    criteria: dict[str, bool] = field(default_factory=dict)
    facts: Facts | None = None  # the figures behind it, for the report's timeline and plots
    probe_delay: float | None = None  # simulated seconds, like every duration here
    probe_source: str = ""
    time_scale: float = 1.0  # the clock read: simulated seconds per real second (a drill's; 1 outside one)

    @property
    def finding(self) -> bool:
        return self.verdict not in ("healthy", INSUFFICIENT)

    def json(self) -> dict:
        return {
            "target": self.target,
            "instance": self.instance,
            "gpus": self.gpus,
            "verdict": self.verdict,
            "confidence": self.confidence,
            "confidence_label": confidence_label(self.confidence),
            "summary": self.summary,
            "criteria": self.criteria,
            "evidence": [item.json() for item in self.evidence],
            "recommendations": [r.json() for r in self.recommendations],
            # The two-knob check (capacity.py); null for a GPU without a target.
            "concurrency_check": None
            if self.facts is None or self.target is None
            else self.facts.capacity_check.json(),
            # What step 1 stood on (gpu_join, target_level where the per-GPU join was missing, gpu_used where no
            # reservation is known; null without memory series), the series read, and those it lacked.
            "memory_evidence": None if self.facts is None else self.facts.memory_evidence,
            "evidence_used": [] if self.facts is None else sorted(self.facts.evidence_used),
            "evidence_missing": [] if self.facts is None else list(self.facts.evidence_missing),
            "probe_delay_seconds": self.probe_delay,
            "probe_delay_source": self.probe_source,
            "time_scale": self.time_scale,
            # Where the thresholds shared with the shipped rules were read: the bundle's defaults, or a file.
            "thresholds_source": default_thresholds().where if self.facts is None else self.facts.thresholds.where,
            # One reading: the shipped alerts whose conditions hold now (alert, severity, the figures); [] else.
            "pages_now": []
            if self.facts is None
            else [{"alert": p.name, "severity": p.severity, "why": why} for p, why in self.facts.paging],
        }


def default_probe_delay(thresholds: Thresholds | None = None) -> tuple[float, str]:
    """The probe delay where none is given: the bundle configuration's (its defaults' when None)."""
    t = thresholds or default_thresholds()
    where = "the bundle's" if t.source == DEFAULTS else f"{t.source}'s"
    return t.probe_delay_seconds, f"{where} startup_slower_than_probe.probe_initial_delay_seconds"


def _subjects(data: Data) -> list[tuple[str | None, str | None, list[str]]]:
    """(instance, target, gpus) for each target; (instance, None, [gpu]) for each GPU of an instance without one."""
    instances = sorted({s.labels.get("instance") for s in data.series}, key=lambda i: i or "")
    subjects: list[tuple[str | None, str | None, list[str]]] = []
    for instance in instances:
        mine = [s for s in data.series if s.labels.get("instance") == instance]
        gpus = sorted({gpu_id(s.labels) for s in mine if "gpu" in s.labels and s.name.startswith("oomguard_gpu_")})
        targets = sorted({s.labels["target"] for s in mine if "target" in s.labels})
        for target in targets:
            own = sorted(
                {
                    gpu_id(s.labels)
                    for s in mine
                    # a relabelling may have dropped the gpu label: then the instance's GPUs stand in
                    if s.name == "oomguard_target_gpu_info" and s.labels.get("target") == target and "gpu" in s.labels
                }
            )
            subjects.append((instance, target, own or gpus))
        if not targets:
            subjects.extend((instance, None, [gpu]) for gpu in gpus)
    return subjects


def diagnose_data(
    data: Data,
    *,
    target: str | None = None,
    probe_delay: float | None = None,
    probe_source: str | None = None,
    max_num_seqs: int | None = None,
    time_scale: float | None = None,
    thresholds: Thresholds | None = None,
) -> list[Diagnosis]:
    """One diagnosis per target of `data`. `time_scale`: the clock it was recorded on, simulated seconds per real
    second (a drill's compressed clock; 1 outside a drill; None: the bundle configuration's `time_scale`);
    `probe_delay` is in simulated seconds. `thresholds`: the bundle configuration's (thresholds.py's
    `load_thresholds`), the shipped defaults' when None."""
    thresholds = thresholds or default_thresholds()
    clock = clock_of(thresholds.time_scale if time_scale is None else time_scale)
    if probe_delay is None:
        probe_delay, probe_source = default_probe_delay(thresholds)
    probe_source = probe_source or "--probe-delay"
    subjects = [s for s in _subjects(data) if target is None or s[1] == target]
    if not subjects:
        where = f"target {target!r}" if target else "any target or GPU"
        if data.history:
            fix = "check --target/--instance, the window (--at, --window), and that Prometheus scrapes oomguard"
        else:
            # One exporter read now: no window, no Prometheus; what it does serve is the useful answer.
            known = sorted({s.labels["target"] for s in data.series if "target" in s.labels})
            fix = (f"its targets are {', '.join(known)}" if known else "it serves no target or GPU series") + (
                "; check --target" if target else "; check that it is oomguard and that its collectors run"
            )
        summary = f"no oomguard series for {where} in {data.source}: {fix}"
        return [Diagnosis(target, None, [], INSUFFICIENT, 0.0, summary, [], [], time_scale=clock.factor)]
    out = []
    for instance, name, gpus in subjects:
        facts = gather(data, instance, name, gpus, clock, thresholds)
        facts.max_num_seqs_given = max_num_seqs
        verdict = decide(facts, probe_delay)
        items = evidence(facts, probe_delay, probe_source)
        recs = recommend(facts, verdict, probe_delay=probe_delay, probe_source=probe_source)
        out.append(Diagnosis(name, instance, gpus, verdict.name, verdict.confidence, verdict.summary, items, recs,
                             verdict.criteria, facts, probe_delay, probe_source, clock.factor))  # fmt: skip
    return out


def diagnose_prometheus(
    url: str,
    *,
    at: float | None = None,
    window: float = 3600.0,
    target: str | None = None,
    instance: str | None = None,
    probe_delay: float | None = None,
    probe_source: str | None = None,
    max_num_seqs: int | None = None,
    timeout: float = 10.0,
    time_scale: float | None = None,
    thresholds: Thresholds | None = None,
) -> list[Diagnosis]:
    """The diagnoses over the `window` seconds ending at `at` (default now); raises DiagnoseError.

    `at` and `window` are on Prometheus' clock (Unix seconds, real seconds); `time_scale` is a drill's compressed
    clock (simulated seconds per real second; None: the bundle configuration's), and `probe_delay` is in simulated
    seconds. `thresholds`: the bundle configuration's (its defaults' when None).
    """
    thresholds = thresholds or default_thresholds()
    clock = clock_of(thresholds.time_scale if time_scale is None else time_scale)
    end = time.time() if at is None else at
    data = fetch_prometheus(url, start=end - window, end=end, instance=instance, timeout=timeout,
                            time_scale=clock.factor)  # fmt: skip
    return diagnose_data(data, target=target, probe_delay=probe_delay, probe_source=probe_source,
                         max_num_seqs=max_num_seqs, time_scale=clock.factor, thresholds=thresholds)  # fmt: skip


def diagnose_exporter(
    url: str,
    *,
    target: str | None = None,
    probe_delay: float | None = None,
    probe_source: str | None = None,
    max_num_seqs: int | None = None,
    timeout: float = 10.0,
    time_scale: float | None = None,
    thresholds: Thresholds | None = None,
) -> list[Diagnosis]:
    """The diagnoses from one reading of one exporter's /metrics (no history: lower confidence; the present judged
    on the shipped rules' thresholds, `thresholds` or the bundle's defaults).

    `time_scale`: the exporter's simulation runs that many times faster than life (its startup is read x it)."""
    data = fetch_exporter(url, timeout=timeout)
    return diagnose_data(data, target=target, probe_delay=probe_delay, probe_source=probe_source,
                         max_num_seqs=max_num_seqs, time_scale=time_scale, thresholds=thresholds)  # fmt: skip


def exit_status(diagnoses: list[Diagnosis]) -> int:
    """1 when anything was found, else 2 when something could not be judged, else 0."""
    if any(d.finding for d in diagnoses):
        return 1
    return 2 if any(d.verdict == INSUFFICIENT for d in diagnoses) else 0
