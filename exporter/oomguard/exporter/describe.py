"""What a configuration will monitor, in words: `oomguard check-config` prints it, so that an empty or
half-written file is not taken for a working one."""

from __future__ import annotations

import glob
import os

from oomguard.exporter.config import Config, TargetConfig
from oomguard.exporter.engines import ENGINES
from oomguard.exporter.events.cgroup import V2_FILE, counter_file
from oomguard.exporter.sources.gpu_source import describe_gpus


def _logs(target: TargetConfig) -> str:
    sources = [*target.logs]
    if target.journald_unit:
        sources.append(f"journald unit {target.journald_unit}")
    if target.k8s_pod_logs is not None:
        p = target.k8s_pod_logs
        sources.append(f"pod logs {p.namespace}/{p.pod}/{p.container}")
    text = ", log: " + ", ".join(sources) if sources else ", no log (its OOMs are not counted: add logs:)"
    return text + _cgroup(target)


def _cgroup(target: TargetConfig) -> str:
    """Which counter of the target's cgroup its kernel OOM kills are read from (v2 or v1), or why none."""
    if not target.cgroup:
        return ""
    found = counter_file(target.cgroup)
    if found is None:
        return (
            f", cgroup {target.cgroup}: no memory.events (v2) or memory.oom_control (v1) there yet, its OOM kills "
            "are counted once one appears (is it the engine's cgroup, with the memory controller?)"
        )
    version = "cgroup v2" if found.endswith(V2_FILE) else "cgroup v1"
    return f", OOM kills: oom_kill of {found} ({version})"


def _local_engines() -> str:
    """The engines local discovery finds (those with a command-line matcher), from the registry: by the first word
    of their titles (vLLM, SGLang, TGI, Triton, llama.cpp)."""
    return ", ".join(plugin.title.split()[0] for plugin in ENGINES.values() if plugin.matches is not None)


def describe(config: Config) -> list[str]:
    """One line per thing watched; the first says whether any engine is, and how to add one where none is."""
    lines = []
    engines = [f"{t.label} ({t.engine} at {t.url}{_logs(t)})" for t in config.targets]
    k8s = config.kubernetes
    if k8s is not None:
        namespaces = ", ".join(k8s.namespaces) or "every namespace"
        where, logs = (
            ("every node", "their logs followed through the API (pods/log)")
            if k8s.scope == "cluster"
            else (f"node {k8s.node_name}", "their logs followed")
        )
        engines.append(
            f"the {k8s.engine} pods of {where} matching {k8s.label_selector or 'any label'}, port "
            f"{k8s.port}, in {namespaces} (discovered, {logs})"
        )
    if config.simulation.scenario:
        engines.append(f"the simulated {config.simulation.engine} of scenario {config.simulation.scenario}")
    discovery = config.discovery
    if config.discovers_local:
        how = (
            "no targets configured: local engines are discovered"
            if not engines
            else "and the engines on this host, discovered"
        )
        engines.append(
            f"{how} by their command lines ({_local_engines()}) every "
            f"{discovery.interval_seconds:g}s, forgotten {discovery.forget_after_seconds:g}s after they go "
            "(discovery.local: off to stop)"
        )
    if engines:
        lines.append("engines: " + "; ".join(engines))
    else:
        lines.append(
            "engines: none. No targets:, no kubernetes: block and discovery.local is off, so only the GPUs are "
            "watched; add the engines under targets: (docs/configuration.md), a kubernetes: block "
            "(docs/kubernetes.md), or set discovery.local to auto"
        )
    lines.append(describe_gpus(config))  # the chosen GPU source's line (sources/gpu_source.py)
    lines.append(
        f"kernel OOM kills: from {config.events.kernel_log_path} where readable, each also counted for the target "
        "whose process or pod it killed"
        if config.events.kernel_log
        else "kernel OOM kills: not counted (events.kernel_log is false)"
    )
    lines.append(
        f"state: {config.state_dir} (event counts and read positions survive a restart)"
        if config.state_dir
        else "state: in memory only (no state_dir): event counts start from zero at each restart"
    )
    return lines


def warnings(config: Config) -> list[str]:
    """What is valid but will count nothing: a `logs:` pattern that matches no file now (a typo there means no OOM
    is ever counted, and nothing else says so)."""
    out = []
    for target in config.targets:
        for pattern in target.logs:
            matched = [p for p in glob.glob(pattern) if os.path.isfile(p)]
            followed = [p for p in matched if target.follow_symlinks or not os.path.islink(p)]
            if followed:
                continue
            why = (
                f"matches only symbolic links ({len(matched)}), which are skipped (follow_symlinks: false)"
                if matched
                else "matches no file now"
            )
            out.append(
                f"warning: logs pattern {pattern!r} of {target.label} {why}: if it is not the engine's log (a typo?), "
                "its OOMs are never counted; while it runs, oomguard_event_source_files says how many files it follows"
            )
    return out
