"""The acceptance run, step by step (scripts/gpu-acceptance.sh starts it; docs/testing.md says what it checks).

1. The exporter (`oomguard serve` with the run's configuration: NVML, a state_dir, one target whose log is the
   file the allocating child writes) against `nvidia-smi`, per GPU: total, used and reserved memory, each reading
   of the exporter taken between two of nvidia-smi's, at idle and while memory climbs.
2. The allocating child (allocate.py) on one idle GPU not in MIG mode: its per-process series, the trend calling
   the climb with a time to full before the OOM, the OOM counted once, the GPU left as found.
3. NVML's cost per GPU a scrape: the exporter's own `oomguard_source_duration_seconds{source="nvml"}`.
4. MIG as found, never changed.

Without a GPU (no NVML driver or no nvidia-smi) the same steps run on the stand-in NVML, whose GPU follows a
stand-in allocator: every figure is labelled simulated, and what needs a GPU is skipped, with the reason.

The run is synchronous: it waits on child processes and HTTP answers, with no event loop of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .exposition import Exposition, answers, scrape
from .nvml_facts import GpuFact, gpu_facts, mig_instances
from .reference import (
    GIB,
    MIB,
    FakeGpuSpec,
    FakeSpec,
    FakeTruth,
    NvidiaSmi,
    RefGpu,
    SmiError,
    host_facts,
    read_state,
)
from .report import Check, Results

TARGET = "acceptance-engine"
# Tolerances of the comparison with nvidia-smi. Both read the same NVML call of the same driver, nvidia-smi in
# whole MiB: the totals agree to the MiB. Used memory moves: the exporter's reading must lie between the two
# nvidia-smi readings taken around its scrape, give or take USED_TOLERANCE_MIB.
TOTAL_TOLERANCE_MIB = 1.0
USED_TOLERANCE_MIB = 32.0
RESERVED_TOLERANCE_MIB = 1.0
# The GPU is left as found when its used memory is back within this of what it was before the child.
LEFT_AS_FOUND_MIB = 64.0
COST_SCRAPES = 50
DEFAULT_MAX_SECONDS = 450.0  # under the 8 minutes the run must take, with room for the exporter's stop
ROOT = Path(__file__).resolve().parents[2]  # the repository: the children run its modules from there


class SetupError(RuntimeError):
    """The run could not start what it checks (the exporter, the GPU): exit 2, nothing judged."""


def _pids(exposition: Exposition, gpu: int) -> dict[int, float]:
    return {
        int(s.labels["pid"]): s.value
        for s in exposition.find("oomguard_gpu_process_memory_used_bytes", gpu=str(gpu))
        if s.labels.get("pid", "").isdigit()
    }


def _stats_ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "min_ms": ordered[0] * 1000,
        "median_ms": statistics.median(ordered) * 1000,
        "p90_ms": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] * 1000,
        "max_ms": ordered[-1] * 1000,
        "mean_ms": statistics.fmean(ordered) * 1000,
    }


# -- the two benches: a real GPU, or the stand-in -------------------------------------------------------------


@dataclass
class Bench:
    """What differs between a real GPU and the stand-in; every check is the same code on both."""

    mode: str  # "gpu" or "simulated"
    reference_name: str
    reference: Callable[[], list[RefGpu]]
    nvml_lib: Any
    exporter_argv: Callable[[Path], list[str]]
    allocator_args: list[str] = field(default_factory=list)
    skipped: list[Check] = field(default_factory=list)


def gpu_available() -> str:
    """ "" where the run can use a real GPU, else why not (every reason found)."""
    why = []
    if shutil.which("nvidia-smi") is None:
        why.append("nvidia-smi is not on PATH")
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # the driver's absence has several faces: a missing library, a failed load
        why.append(f"NVML does not start: {exc}")
    else:
        try:
            if pynvml.nvmlDeviceGetCount() == 0:
                why.append("NVML reports no GPU")
        finally:
            pynvml.nvmlShutdown()
    return "; ".join(why)


def gpu_bench() -> Bench:
    import pynvml

    smi = NvidiaSmi()
    return Bench(
        mode="gpu",
        reference_name="nvidia-smi",
        reference=smi.read,
        nvml_lib=pynvml,
        exporter_argv=lambda config: [sys.executable, "-m", "oomguard", "serve", "--config", str(config)],
    )


def simulated_bench(work: Path, why: str) -> Bench:
    from .fake_exporter import fake_nvml

    # Two H100s as the stand-in's defaults make them: the child fills GPU 0 at the real run's pace (the same steps,
    # the same windows); GPU 1 stays idle, as a second GPU does.
    spec = FakeSpec(
        gpus=(FakeGpuSpec(80 * GIB, 768 * MIB, 512 * MIB), FakeGpuSpec(80 * GIB, 0, 512 * MIB)),
        child_state=str(work / "child-state.json"),
    )
    spec_path = work / "fake-spec.json"
    spec.save(spec_path)
    reason = f"no GPU here ({why})"
    return Bench(
        mode="simulated",
        reference_name="the stand-in NVML's own figures",
        reference=FakeTruth(spec).read,
        nvml_lib=fake_nvml(spec),
        exporter_argv=lambda config: [
            sys.executable,
            "-m",
            "scripts.gpu_acceptance.fake_exporter",
            "--config",
            str(config),
            "--spec",
            str(spec_path),
        ],
        allocator_args=["--fake-spec", str(spec_path)],
        skipped=[
            Check(
                "nvidia_smi",
                "skipped",
                "simulated",
                f"{reason}: the exporter was compared with the stand-in's "
                "own figures instead, which proves its reading and exposition, not NVML's agreement with "
                "nvidia-smi",
            ),
            Check(
                "cuda_driver_api",
                "skipped",
                "simulated",
                f"{reason}: no libcuda; a stand-in allocator took the same steps on the stand-in GPU",
            ),
        ],
    )


# -- the run --------------------------------------------------------------------------------------------------


class Run:
    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        self.args = args
        self.out = out
        self.started = time.monotonic()
        self.deadline = self.started + args.max_seconds
        self.work = Path(tempfile.mkdtemp(prefix="oomguard-acceptance-"))
        self.results = Results(mode="?", started_at=time.time())
        self.exporter: subprocess.Popen[bytes] | None = None
        self.exporter_log = self.out / "exporter.log"
        self.engine_log = self.work / "engine.log"
        self.base_url = ""
        self.bench: Bench | None = None
        self.rounds: list[dict[str, Any]] = []  # the comparisons with the reference, judged at the end

    # -- set-up --------------------------------------------------------------------------------------------
    def left(self) -> float:
        return self.deadline - time.monotonic()

    def choose_bench(self) -> Bench:
        why = gpu_available()
        if self.args.mode == "gpu" and why:
            raise SetupError(f"--mode gpu, but {why}")
        if self.args.mode == "simulated" or why:
            return simulated_bench(self.work, why or "--mode simulated")
        return gpu_bench()

    def trend_config(self) -> dict[str, float]:
        """The trend's windows fitted to a climb of --climb-seconds (docs/trend.md), where the defaults judge
        climbs of many minutes: the run must see the call, and a time to full, within its 8 minutes."""
        climb = self.args.climb_seconds
        interval = 0.5 if climb >= 40 else 0.25
        short = max(10 * interval, climb / 8)
        climb_min = max(3.0, climb / 6)
        return {
            "interval_seconds": interval,
            "short_window_seconds": short,
            "long_window_seconds": 600.0,
            "climb_min_seconds": climb_min,
            "climb_soonest_seconds": climb_min,
            "analysis_interval_seconds": 0.0,
        }

    def write_config(self) -> Path:
        port, closed = _free_port(), _free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        config = {
            "web": {"listen_address": f"127.0.0.1:{port}"},
            "nvml": {"enabled": True, "per_process": True},
            "state_dir": str(self.work / "state"),
            "discovery": {"local": "off"},
            # The engine is the allocating child: it serves no /metrics (a target that never answers reads
            # loading), claims no GPU (so the GPU's trend is sampled), and its log is the one the child writes.
            "targets": [
                {
                    "name": TARGET,
                    "url": f"http://127.0.0.1:{closed}",
                    "engine": "vllm",
                    "local_process": "no",
                    "logs": [str(self.engine_log)],
                },
            ],
            # The kernel log is not what this run checks, and a container may not let it be read.
            "events": {"kernel_log": False},
            "trend": self.trend_config(),
        }
        path = self.work / "oomguard.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        shutil.copy(path, self.out / "oomguard.yaml")
        self.results.config = config
        return path

    def start_exporter(self, bench: Bench, config: Path) -> None:
        self.engine_log.touch()
        with self.exporter_log.open("wb") as log:
            self.exporter = subprocess.Popen(
                bench.exporter_argv(config),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env(),
                cwd=ROOT,
                preexec_fn=_die_with_parent,
            )
        expected = {g.index for g in bench.reference()}
        until = time.monotonic() + min(60.0, self.left())
        while time.monotonic() < until:
            if self.exporter.poll() is not None:
                raise SetupError(f"the exporter exited with {self.exporter.returncode}: {_tail(self.exporter_log)}")
            if answers(f"{self.base_url}/-/healthy"):
                ex = scrape(self.base_url)
                shown = {int(s.labels["gpu"]) for s in ex.find("oomguard_gpu_memory_total_bytes")}
                if expected <= shown and ex.value("oomguard_nvml_up") == 1:
                    return
            time.sleep(0.3)
        raise SetupError(f"the exporter did not show every GPU within 60 s: {_tail(self.exporter_log)}")

    def stop_exporter(self) -> None:
        if self.exporter is None or self.exporter.poll() is not None:
            return
        self.exporter.send_signal(signal.SIGTERM)
        try:
            self.exporter.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.exporter.kill()
            self.exporter.wait(timeout=5)

    # -- 1. memory against the reference --------------------------------------------------------------------
    def compare(self, bench: Bench, phase: str) -> list[dict[str, Any]]:
        """One round: the reference, a scrape, the reference again; per GPU, the exporter's figures judged."""
        t0 = time.monotonic()
        before = {g.index: g for g in bench.reference()}
        ex = scrape(self.base_url)
        after = {g.index: g for g in bench.reference()}
        span = time.monotonic() - t0
        rows = []
        for index, b in sorted(before.items()):
            a = after.get(index, b)
            rows.append(_judge_gpu(ex, index, b, a, phase, span))
        return rows

    # -- 2. the allocating child ----------------------------------------------------------------------------
    def allocation(self, bench: Bench, rounds: list[dict[str, Any]]) -> list[Check]:
        names = (
            "allocation_per_process",
            "allocation_trend",
            "allocation_oom_counted_once",
            "allocation_left_as_found",
        )
        gpu, why = self.pick_gpu(bench)
        if gpu is None:
            return [Check(n, "skipped", bench.mode, why) for n in names]
        state_path = self.work / "child-state.json"
        before_ref = {g.index: g for g in bench.reference()}
        ex0 = scrape(self.base_url)
        pids_before = set(_pids(ex0, gpu.index))
        oom0 = ex0.value("oomguard_target_events_total", target=TARGET, kind="cuda_oom")
        death0 = ex0.value("oomguard_target_events_total", target=TARGET, kind="engine_death")
        argv = [
            sys.executable,
            "-m",
            "scripts.gpu_acceptance.allocate",
            "--uuid",
            gpu.uuid,
            "--gpu-index",
            str(gpu.index),
            "--log",
            str(self.engine_log),
            "--state",
            str(state_path),
            "--step-mib",
            str(self.args.step_mib),
            "--climb-seconds",
            str(self.args.climb_seconds),
            *bench.allocator_args,
        ]
        # NVML's numbering is by PCI bus; CUDA's, by default, fastest first. The child finds its GPU by UUID anyway.
        env = child_env(CUDA_DEVICE_ORDER="PCI_BUS_ID")
        child_err = self.out / "allocate.log"
        with child_err.open("wb") as err:
            child = subprocess.Popen(
                argv, stdout=err, stderr=subprocess.STDOUT, env=env, cwd=ROOT, preexec_fn=_die_with_parent
            )
        try:
            watch = self.watch_climb(bench, child, gpu.index, state_path, rounds)
        finally:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)  # it frees its memory on the way out
                try:
                    child.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait(timeout=5)
        state = read_state(state_path)
        watch["child_exit"] = child.returncode
        watch["child_state"] = state
        if child.returncode != 0 or state.get("phase") != "freed" or "oom_at" not in state:
            why = f"the allocating child exited {child.returncode} in phase {state.get('phase')!r}: {_tail(child_err)}"
            checks = [Check(n, "fail", bench.mode, why, {"watch": _brief(watch)}) for n in names[:3]]
        else:
            checks = [
                _per_process_check(bench.mode, watch, child.pid, pids_before, state),
                _trend_check(bench.mode, watch, state),
                self.oom_check(bench.mode, oom0, death0, float(state["oom_at"])),
            ]
        checks.append(self.left_as_found(bench, gpu.index, before_ref[gpu.index], child.pid))
        return checks

    def pick_gpu(self, bench: Bench) -> tuple[GpuFact | None, str]:
        """The GPU the child may fill: the one asked for, else the first one not in MIG mode and running nothing
        (filling a GPU another process uses would take its memory)."""
        if bench.mode == "gpu":
            try:
                ctypes.CDLL("libcuda.so.1")
            except OSError as exc:
                return None, f"libcuda.so.1 does not load ({exc}): no CUDA driver API to allocate with"
        driver, facts = gpu_facts(bench.nvml_lib)
        self.results.host["nvml_driver_version"] = driver
        self.results.host["nvml_gpus"] = [f.__dict__ for f in facts]
        if bench.mode == "simulated":
            return facts[0], ""
        wanted = [f for f in facts if self.args.gpu is None or f.index == self.args.gpu]
        if not wanted:
            return None, f"--gpu {self.args.gpu}: NVML has no such GPU"
        for fact in wanted:
            if fact.mig == "enabled":
                continue
            if fact.processes:
                continue
            return fact, ""
        told = "; ".join(f"GPU {f.index}: MIG {f.mig}, processes {list(f.processes or ())}" for f in wanted)
        return None, f"no GPU is free to fill (a GPU in MIG mode, or one that runs processes, is left alone): {told}"

    def watch_climb(
        self, bench: Bench, child: subprocess.Popen[bytes], gpu: int, state_path: Path, rounds: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Scrapes every half second while the child allocates; a comparison round with the reference now and
        then. Returns what was seen, for the checks."""
        seen: list[dict[str, Any]] = []
        started = time.time()
        until = time.monotonic() + min(self.args.climb_seconds * 3 + 60, max(30.0, self.left() - 90))
        next_round = time.monotonic() + max(2.0, self.args.climb_seconds / 5)
        while child.poll() is None and time.monotonic() < until:
            state = read_state(state_path)
            ex = scrape(self.base_url)
            states = {s.labels["state"]: s.value for s in ex.find("oomguard_gpu_memory_trend_state", gpu=str(gpu))}
            seen.append(
                {
                    "at": ex.at,
                    "child_phase": state.get("phase"),
                    "child_allocated_bytes": int(state.get("allocated_bytes", 0)),
                    "used_bytes": ex.value("oomguard_gpu_memory_used_bytes", gpu=str(gpu)),
                    "pids": _pids(ex, gpu),
                    "trend": next((k for k, v in states.items() if v == 1), None),
                    "seconds_to_full": ex.value("oomguard_gpu_memory_seconds_to_full", gpu=str(gpu)),
                }
            )
            if time.monotonic() >= next_round and state.get("phase") == "allocating":
                rounds.extend(self.compare(bench, "allocating"))
                next_round = time.monotonic() + max(2.0, self.args.climb_seconds / 5)
            time.sleep(0.5)
        return {"started_at": started, "seen": seen, "timed_out": child.poll() is None}

    def oom_check(self, mode: str, oom0: float | None, death0: float | None, oom_at: float) -> Check:
        """Counted once: the counter rises by one, and stays there past the incident's quiet spell."""
        figures: dict[str, Any] = {"cuda_oom_before": oom0, "engine_death_before": death0}
        if oom0 is None:
            return Check(
                "allocation_oom_counted_once",
                "fail",
                mode,
                f"no oomguard_target_events_total{{target={TARGET!r},kind='cuda_oom'}} series",
                figures,
            )
        counted_at = None
        until = time.monotonic() + min(40.0, max(10.0, self.left() - 60))
        while time.monotonic() < until:
            ex = scrape(self.base_url)
            if (ex.value("oomguard_target_events_total", target=TARGET, kind="cuda_oom") or 0) > oom0:
                counted_at = ex.at
                break
            time.sleep(0.5)
        if counted_at is None:
            return Check(
                "allocation_oom_counted_once",
                "fail",
                mode,
                f"the OOM the child logged was not counted within 40 s (see {self.engine_log.name})",
                figures,
            )
        figures["counted_after_seconds"] = round(counted_at - oom_at, 2)
        # The incident stays open for events.quiet_seconds (5 s) after its last line: a second count would come
        # then, or at the re-arm; this waits past the quiet spell.
        time.sleep(min(8.0, max(0.0, self.left() - 60)))
        ex = scrape(self.base_url)
        oom1 = ex.value("oomguard_target_events_total", target=TARGET, kind="cuda_oom") or 0
        death1 = ex.value("oomguard_target_events_total", target=TARGET, kind="engine_death") or 0
        figures |= {"cuda_oom_after": oom1, "engine_death_after": death1}
        once = oom1 - oom0 == 1 and death1 == (death0 or 0)
        return Check(
            "allocation_oom_counted_once",
            "pass" if once else "fail",
            mode,
            f"cuda_oom {oom0:g} -> {oom1:g}, engine_death {death0 or 0:g} -> {death1:g}, counted "
            f"{counted_at - oom_at:.1f} s after the OOM was logged"
            + ("" if once else ": expected exactly one cuda_oom"),
            figures,
        )

    def left_as_found(self, bench: Bench, gpu: int, before: RefGpu, pid: int) -> Check:
        until = time.monotonic() + min(30.0, max(5.0, self.left() - 45))
        while True:
            now = {g.index: g for g in bench.reference()}[gpu]
            ex = scrape(self.base_url)
            pids = _pids(ex, gpu)
            back = now.used_mib - before.used_mib <= LEFT_AS_FOUND_MIB and pid not in pids
            if back or time.monotonic() >= until:
                break
            time.sleep(1.0)
        figures = {"used_mib_before": before.used_mib, "used_mib_after": now.used_mib, "pids_after": sorted(pids)}
        return Check(
            "allocation_left_as_found",
            "pass" if back else "fail",
            bench.mode,
            f"GPU {gpu}: {before.used_mib:.0f} MiB used before the child, {now.used_mib:.0f} MiB after "
            f"({bench.reference_name}; tolerance {LEFT_AS_FOUND_MIB:.0f} MiB); the child's pid "
            f"{'gone from' if pid not in pids else 'STILL in'} the exporter's process list",
            figures,
        )

    # -- 3. NVML's cost -------------------------------------------------------------------------------------
    def nvml_cost(self, mode: str, gpus: int) -> Check:
        durations, walls, failures = [], [], 0
        for _ in range(COST_SCRAPES):
            if self.left() < 20:
                break
            ex = scrape(self.base_url)
            walls.append(ex.seconds)
            if ex.value("oomguard_source_success", source="nvml") != 1:
                failures += 1
            duration = ex.value("oomguard_source_duration_seconds", source="nvml")
            if duration is not None:
                durations.append(duration)
        if not durations:
            return Check("nvml_cost", "fail", mode, "no oomguard_source_duration_seconds{source='nvml'} series")
        per_gpu = _stats_ms([d / gpus for d in durations])
        figures = {
            "scrapes": len(walls),
            "gpus": gpus,
            "nvml_read_per_gpu": per_gpu,
            "nvml_read_all_gpus": _stats_ms(durations),
            "metrics_request": _stats_ms(walls),
            "nvml_failures": failures,
        }
        ok = failures == 0
        return Check(
            "nvml_cost",
            "pass" if ok else "fail",
            mode,
            f"{len(walls)} scrapes: NVML {per_gpu['median_ms']:.2f} ms per GPU (median; p90 {per_gpu['p90_ms']:.2f}, "
            f"max {per_gpu['max_ms']:.2f}) over {gpus} GPU(s), the exporter's own timing; /metrics "
            f"{figures['metrics_request']['median_ms']:.1f} ms median"
            + ("" if ok else f"; {failures} NVML reads failed"),
            figures,
        )

    # -- 4. MIG ---------------------------------------------------------------------------------------------
    def mig(self, bench: Bench) -> Check:
        if not hasattr(bench.nvml_lib, "nvmlDeviceGetMigMode"):
            return Check(
                "mig",
                "skipped",
                bench.mode,
                "the stand-in NVML has no MIG calls (nvmlDeviceGetMigMode): nothing to read",
            )
        found = mig_instances(bench.nvml_lib)
        ex = scrape(self.base_url)
        parts = []
        for index, gpu in found.items():
            if gpu["mode"] != "enabled":
                parts.append(f"GPU {index}: MIG {gpu['mode']}")
                continue
            uuids = {i.get("uuid") for i in gpu["instances"] if i.get("uuid")}
            shown = [s for s in ex.samples if s.name.startswith("oomguard_gpu") and uuids & set(s.labels.values())]
            gpu["exporter_series_naming_an_instance"] = len(shown)
            gpu["exporter_total_mib"] = (ex.value("oomguard_gpu_memory_total_bytes", gpu=str(index)) or 0) / MIB
            gpu["exporter_used_mib"] = (ex.value("oomguard_gpu_memory_used_bytes", gpu=str(index)) or 0) / MIB
            reads = (
                f"the exporter shows {len(shown)} series naming an instance"
                if shown
                else "the exporter reads no instance (only the parent device, "
                f"{gpu['exporter_used_mib']:.0f} of {gpu['exporter_total_mib']:.0f} MiB)"
            )
            parts.append(f"GPU {index}: MIG enabled, {len(gpu['instances'])} instance(s); {reads}")
        return Check("mig", "info", bench.mode, "; ".join(parts) + " (read only: no mode was changed)", {"gpus": found})

    # -- all of it ------------------------------------------------------------------------------------------
    def execute(self) -> None:
        bench = self.bench = self.choose_bench()
        self.results.mode = bench.mode
        self.results.host["python"] = f"{sys.executable} ({sys.version.split()[0]})"
        self.results.checks.extend(bench.skipped)
        if bench.mode == "gpu":
            self.results.host |= host_facts()
        self.start_exporter(bench, self.write_config())
        for _ in range(3):
            self.rounds.extend(self.compare(bench, "idle"))
        allocation = self.allocation(bench, self.rounds)
        self.rounds.extend(self.compare(bench, "after"))
        self.results.checks.append(_memory_check(bench, self.rounds))
        self.results.checks.extend(allocation)
        self.results.checks.append(self.nvml_cost(bench.mode, len(bench.reference())))
        self.results.checks.append(self.mig(bench))

    def finish(self) -> int:
        self.stop_exporter()
        judged = any(c.name == "memory_vs_reference" for c in self.results.checks)
        if self.bench is not None and self.rounds and not judged:
            # The run stopped early: the comparisons made so far are still figures.
            self.results.checks.append(_memory_check(self.bench, self.rounds))
        if self.engine_log.exists():
            shutil.copy(self.engine_log, self.out / "engine.log")
        shutil.rmtree(self.work, ignore_errors=True)
        self.results.duration_seconds = time.monotonic() - self.started
        js, md = self.results.write(self.out)
        sys.stdout.write(self.results.markdown())
        print(f"\nfigures: {js}\nsummary: {md}")
        return self.results.exit_code()


# -- the checks' judgements ------------------------------------------------------------------------------------


def _judge_gpu(ex: Exposition, index: int, before: RefGpu, after: RefGpu, phase: str, span: float) -> dict[str, Any]:
    total = ex.value("oomguard_gpu_memory_total_bytes", gpu=str(index))
    used = ex.value("oomguard_gpu_memory_used_bytes", gpu=str(index))
    reserved = ex.value("oomguard_gpu_memory_reserved_bytes", gpu=str(index))
    row: dict[str, Any] = {
        "phase": phase,
        "gpu": index,
        "uuid": before.uuid,
        "bracket_seconds": round(span, 3),
        "ref_used_mib": [before.used_mib, after.used_mib],
        "ref_total_mib": before.total_mib,
        "ref_reserved_mib": before.reserved_mib,
    }
    if total is None or used is None:
        row |= {"ok": False, "why": "the exporter shows no total or used memory for this GPU"}
        return row
    total_mib, used_mib = total / MIB, used / MIB
    reserved_mib = reserved / MIB if reserved is not None else None
    row |= {"exporter_total_mib": total_mib, "exporter_used_mib": used_mib, "exporter_reserved_mib": reserved_mib}
    row["total_diff_mib"] = total_mib - before.total_mib
    low, high = min(before.used_mib, after.used_mib), max(before.used_mib, after.used_mib)
    # nvidia-smi's "used" excludes the driver's reservation on recent drivers, and includes it on older ones.
    candidates = {"used": used_mib}
    if reserved_mib is not None:
        candidates["used+reserved"] = used_mib + reserved_mib
    outside = {k: max(low - v, v - high, 0.0) for k, v in candidates.items()}
    matched = min(outside, key=lambda k: outside[k])
    row |= {
        "used_matches": matched,
        "used_outside_bracket_mib": outside[matched],
        "used_diff_mib": [candidates[matched] - before.used_mib, candidates[matched] - after.used_mib],
    }
    why = []
    if abs(row["total_diff_mib"]) > TOTAL_TOLERANCE_MIB:
        why.append(f"total differs by {row['total_diff_mib']:.1f} MiB")
    if outside[matched] > USED_TOLERANCE_MIB:
        why.append(f"used {used_mib:.0f} MiB lies {outside[matched]:.0f} MiB outside [{low:.0f}, {high:.0f}]")
    if reserved_mib is not None and before.reserved_mib is not None:
        row["reserved_diff_mib"] = reserved_mib - before.reserved_mib
        if abs(row["reserved_diff_mib"]) > RESERVED_TOLERANCE_MIB:
            why.append(f"reserved differs by {row['reserved_diff_mib']:.1f} MiB")
    row |= {"ok": not why, "why": "; ".join(why)}
    return row


def _memory_check(bench: Bench, rounds: list[dict[str, Any]]) -> Check:
    bad = [r for r in rounds if not r["ok"]]
    phases = sorted({r["phase"] for r in rounds})
    worst_used = max((abs(r.get("used_outside_bracket_mib", 0.0)) for r in rounds), default=0.0)
    worst_total = max((abs(r.get("total_diff_mib", 0.0)) for r in rounds), default=0.0)
    matches = sorted({r["used_matches"] for r in rounds if "used_matches" in r})
    summary = (
        f"{len(rounds)} readings ({', '.join(phases)}) against {bench.reference_name}: total within "
        f"{worst_total:.2f} MiB (tolerance {TOTAL_TOLERANCE_MIB:g}), used at most {worst_used:.1f} MiB outside the "
        f"two reference readings around each scrape (tolerance {USED_TOLERANCE_MIB:g}; nvidia-smi's used read as the "
        f"exporter's {' or '.join(matches)})"
    )
    if bad:
        summary += f"; {len(bad)} off: " + "; ".join(f"GPU {r['gpu']} ({r['phase']}): {r['why']}" for r in bad[:3])
    return Check("memory_vs_reference", "fail" if bad else "pass", bench.mode, summary, {"rounds": rounds})


def _per_process_check(
    mode: str, watch: dict[str, Any], pid: int, pids_before: set[int], state: dict[str, Any]
) -> Check:
    seen = [s for s in watch["seen"] if s["child_phase"] in ("allocating", "oom")]
    mine = [(s["child_allocated_bytes"], s["pids"].get(pid)) for s in seen]
    shown = [(a, v) for a, v in mine if v is not None]
    step = int(state.get("step_bytes", 0))
    figures: dict[str, Any] = {
        "child_pid": pid,
        "scrapes_while_allocating": len(seen),
        "scrapes_with_child": len(shown),
    }
    if shown:
        # The child's own count is read just before the scrape: NVML may show one step more, never one step less.
        short = [(a, v) for a, v in shown if v < a - step]
        peak = max(v for _, v in shown)
        figures |= {"peak_exporter_bytes": peak, "child_peak_bytes": state.get("peak_bytes"), "short": short[:5]}
        ok = not short
        return Check(
            "allocation_per_process",
            "pass" if ok else "fail",
            mode,
            f"pid {pid} in oomguard_gpu_process_memory_used_bytes in {len(shown)} of {len(seen)} scrapes, up to "
            f"{peak / GIB:.2f} GiB (the child held {int(state.get('peak_bytes') or 0) / GIB:.2f} GiB at the OOM by its "
            f"own count)" + ("" if ok else f"; {len(short)} readings below what the child held"),
            figures,
        )
    # In a container without the host's PID namespace NVML lists the child under the host's pid, which this run
    # cannot tell from its own: said as found, not judged (the exporter needs the host's PID namespace for names).
    others = {p for s in seen for p in s["pids"]} - pids_before - {pid}
    peak_other = max((v for s in seen for p, v in s["pids"].items() if p in others), default=0.0)
    figures |= {"other_new_pids": sorted(others), "peak_other_bytes": peak_other}
    why = f"pid {pid} never in oomguard_gpu_process_memory_used_bytes ({len(seen)} scrapes while it allocated)"
    if len(others) == 1 and peak_other >= int(state.get("peak_bytes") or 0) - step:
        return Check(
            "allocation_per_process",
            "info",
            mode,
            f"{why}; its memory ({peak_other / GIB:.2f} GiB) shown under NVML's pid {others.pop()}: this "
            "machine runs the run in a PID namespace other than the host's",
            figures,
        )
    if others:
        why += f"; NVML listed new pid(s) {sorted(others)}"
    return Check("allocation_per_process", "fail", mode, why, figures)


def _trend_check(mode: str, watch: dict[str, Any], state: dict[str, Any]) -> Check:
    oom_at = float(state["oom_at"])
    started = float(state.get("started_at") or watch["started_at"])
    climbing = [s for s in watch["seen"] if s["trend"] == "climbing" and s["at"] < oom_at]
    with_ttf = [s for s in climbing if s["seconds_to_full"] is not None and s["seconds_to_full"] > 0]
    states = sorted({s["trend"] for s in watch["seen"] if s["trend"]})
    figures: dict[str, Any] = {"states_seen": states, "climb_seconds_until_oom": round(oom_at - started, 1)}
    if not with_ttf:
        return Check(
            "allocation_trend",
            "fail",
            mode,
            f"no 'climbing' with a time to full before the OOM (states seen: {states})",
            figures,
        )
    first = with_ttf[0]
    predicted = first["at"] + first["seconds_to_full"]
    figures |= {
        "first_climbing_after_seconds": round(first["at"] - started, 1),
        "lead_before_oom_seconds": round(oom_at - first["at"], 1),
        "seconds_to_full_at_first_call": round(first["seconds_to_full"], 1),
        "predicted_full_error_seconds": round(predicted - oom_at, 1),
        "ttf_series": [(round(s["at"] - started, 1), round(s["seconds_to_full"], 1)) for s in with_ttf][:40],
    }
    return Check(
        "allocation_trend",
        "pass",
        mode,
        f"'climbing' {first['at'] - started:.0f} s into a {oom_at - started:.0f} s climb, {oom_at - first['at']:.0f} s "
        f"before the OOM, time to full {first['seconds_to_full']:.0f} s then (off by "
        f"{predicted - oom_at:+.0f} s); states seen: {', '.join(states)}",
        figures,
    )


# -- helpers -------------------------------------------------------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    """The environment of the run's children: the checkout's package and this one importable whatever the
    interpreter (a virtual environment carried to another path loses its editable install's path)."""
    paths = [str(ROOT / "exporter"), str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)), "PYTHONUNBUFFERED": "1", **extra}


class Stopped(Exception):
    """SIGTERM (`timeout`'s): the run stops, its children with it, and writes what it has."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped(f"stopped by signal {signum}")


def _die_with_parent() -> None:
    """In the child before it runs: SIGTERM when the run dies, however it dies (a SIGKILL leaves no cleanup), so
    that no exporter outlives it and no allocation outlives it on the GPU (the allocator frees on SIGTERM)."""
    # Not Linux's libc: the run's own cleanup still stops them.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _brief(watch: dict[str, Any]) -> dict[str, Any]:
    seen = watch.get("seen", [])
    return {"scrapes": len(seen), "last": seen[-1] if seen else None, "timed_out": watch.get("timed_out")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu-acceptance.sh", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="where the figures go (default $OUT)")
    parser.add_argument(
        "--mode",
        choices=("auto", "gpu", "simulated"),
        default="auto",
        help="auto: a real GPU where NVML and nvidia-smi find one, else the stand-in",
    )
    parser.add_argument(
        "--gpu",
        type=int,
        default=None,
        help="the NVML index the child fills (default: the first idle GPU not in MIG mode)",
    )
    parser.add_argument("--step-mib", type=int, default=1024, help="the child's allocation step (default 1024)")
    parser.add_argument(
        "--climb-seconds",
        type=float,
        default=80.0,
        help="about how long the child's climb to the OOM takes (default 80)",
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=DEFAULT_MAX_SECONDS,
        help=f"the whole run's budget (default {DEFAULT_MAX_SECONDS:g})",
    )
    args = parser.parse_args(argv)
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    if out is None:
        print("say where the figures go: $OUT or --out DIR", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _stop)
    run = Run(args, out)
    try:
        run.execute()
    except (SetupError, SmiError, OSError, Stopped) as exc:
        run.results.setup_error = f"{type(exc).__name__}: {exc}"
        if run.exporter is not None and run.exporter.poll() is not None:
            run.results.setup_error += f"; the exporter exited {run.exporter.returncode}: {_tail(run.exporter_log)}"
    except KeyboardInterrupt:
        run.results.setup_error = "interrupted"
    return run.finish()
