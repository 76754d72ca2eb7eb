"""The run's results: `gpu-acceptance.json` (every figure) and `gpu-acceptance.md` (a short summary)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("pass", "fail", "skipped", "info")


@dataclass
class Check:
    name: str
    status: str  # one of STATUSES; "info": a report, never a pass or a failure (MIG as found)
    source: str  # "gpu": figures from a real GPU; "simulated": from the stand-in NVML, no GPU involved
    summary: str
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class Results:
    mode: str
    started_at: float
    duration_seconds: float = 0.0
    host: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    setup_error: str = ""

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def passed(self) -> bool:
        return not self.setup_error and not self.failed and any(c.status == "pass" for c in self.checks)

    def exit_code(self) -> int:
        """0 everything that ran passed; 1 a check failed; 2 the run could not be set up."""
        if self.setup_error:
            return 2
        return 0 if self.passed else 1

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["passed"] = self.passed
        out["exit_code"] = self.exit_code()
        out["skipped"] = [{"check": c.name, "why": c.summary} for c in self.checks if c.status == "skipped"]
        return out

    def markdown(self) -> str:
        label = "a real GPU" if self.mode == "gpu" else "the stand-in NVML (no GPU here: SIMULATED figures)"
        lines = [
            "# oomguard GPU acceptance run",
            "",
            f"Mode: **{self.mode}**, on {label}. Took {self.duration_seconds:.0f} s. "
            f"Result: **{'passed' if self.passed else 'FAILED'}** (exit {self.exit_code()}).",
            "",
        ]
        if self.setup_error:
            lines += [f"Setup failed: {self.setup_error}", ""]
        gpus = self.host.get("gpus") or []
        for gpu in gpus:
            lines.append(f"- GPU {gpu.get('index')}: {', '.join(f'{k} {v}' for k, v in gpu.items() if k != 'index')}")
        if gpus:
            lines.append("")
        lines += ["| check | status | figures from | summary |", "|---|---|---|---|"]
        for c in self.checks:
            lines.append(f"| {c.name} | {c.status} | {c.source} | {c.summary.replace('|', '/')} |")
        lines.append("")
        return "\n".join(lines)

    def write(self, out: Path) -> tuple[Path, Path]:
        out.mkdir(parents=True, exist_ok=True)
        js, md = out / "gpu-acceptance.json", out / "gpu-acceptance.md"
        js.write_text(json.dumps(self.as_json(), indent=2, default=str) + "\n", encoding="utf-8")
        md.write_text(self.markdown(), encoding="utf-8")
        return js, md
