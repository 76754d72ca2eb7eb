"""`--sweep`: the memory alerts' thresholds and windows over a small grid, on the same replayed history.

Each row changes one alert's settings (the bundle configuration's keys: thresholds, `for`, the time to full), the
others as configured, and re-evaluates only the rules that change on the backtest's Prometheus: the replay and the
blocks are the same for every row, the rules are the only variable. Each row says how many incidents were paged
before their first OOM, how early (the median first page), and the pages and tickets outside incidents per
GPU-day: the trade-off to tune the bundle on a team's own past before deploying it.
"""

from __future__ import annotations

from typing import Any

from oomguard.backtest.ooms import Oom
from oomguard.backtest.replay import ReplaySummary
from oomguard.backtest.report import judge
from oomguard.backtest.rules import Episode, RuleSet, evaluate, rule_set
from oomguard.backtest.tsdb import Prometheus
from oomguard.bundle.bundle_config import BundleConfig

# alert key -> the settings tried, each a dict of its keys; the configuration's own is tried too (marked).
GRID: dict[str, list[dict[str, Any]]] = {
    "gpu_memory_critical": [
        {"headroom_threshold": h, "threshold": t, "for": f}
        for h, t in ((0.6, 0.93), (0.75, 0.95), (0.9, 0.98))
        for f in ("1m", "2m", "5m")
    ],
    "exhausted_soon": [{"seconds": s, "for": f} for s in (900, 1800, 3600) for f in ("1m", "3m")],
    "over_budget": [{"margin_ratio": m, "for": f} for m in (0.02, 0.05, 0.1) for f in ("1m", "2m", "5m")],
    "gpu_memory_high": [
        {"headroom_threshold": h, "threshold": t, "for": f}
        for h, t in ((0.4, 0.85), (0.5, 0.9), (0.6, 0.93))
        for f in ("5m", "10m")
    ],
}


def _setting(values: dict[str, Any]) -> str:
    names = {"headroom_threshold": "headroom", "threshold": "total", "margin_ratio": "margin", "seconds": "full in"}
    return ", ".join(f"{names.get(k, k)} {v:g}" if isinstance(v, float | int) else f"{names.get(k, k)} {v}"
                     for k, v in values.items())  # fmt: skip


def variant(config: BundleConfig, alert: str, values: dict[str, Any]) -> BundleConfig:
    raw = config.model_dump(by_alias=True)
    raw["alerts"][alert] = {**raw["alerts"][alert], **values}
    return BundleConfig.model_validate(raw)


def sweep(
    prometheus: Prometheus,
    options: Any,  # run.Options
    rules: RuleSet,
    episodes: dict[str, list[Episode]],
    ooms: list[Oom],
    summary: ReplaySummary,
) -> list[dict[str, Any]]:
    start, end = summary.start, summary.end
    base = {(r.name, r.expr, r.for_seconds) for r in rules.alerts}
    rows = []
    for alert, grid in GRID.items():
        configured = getattr(options.bundle.alerts, alert).model_dump(by_alias=True)
        own = {k: configured[k] for k in grid[0]}
        tried = [own, *(values for values in grid if values != own)]
        for values in tried:
            config = variant(options.bundle, alert, values)
            changed = [r for r in rule_set(config, options.evaluation_interval).alerts
                       if (r.name, r.expr, r.for_seconds) not in base]  # fmt: skip
            found = dict(episodes)
            if changed:
                for name in {r.name for r in changed}:
                    found[name] = []
                for name, eps in evaluate(prometheus, changed, start, end).items():
                    found[name] = eps
            _, _, outcome = judge(found, ooms, summary, options.window)
            rows.append({
                "alert": alert,
                "setting": _setting(values),
                "values": values,
                "configured": values == own,
                "ooms": outcome.incidents,
                "paged": outcome.paged,
                "median_first_page_lead_seconds": outcome.median_page_lead,
                "false_pages": outcome.false_pages,
                "false_tickets": outcome.false_tickets,
                "false_pages_per_gpu_day": outcome.false_pages_per_gpu_day,
                "false_tickets_per_gpu_day": outcome.false_tickets_per_gpu_day,
            })  # fmt: skip
    return rows
