"""The status page at `/`: the view (view.py) rendered by jinja2, server-side, refreshing itself, with no script.

Everything an engine, a pod or a log controls (model, target and pod names, label values, an OOM's kind) is escaped
by the template engine's autoescape, and the page's Content-Security-Policy allows no script at all: a model named
`<img src=x onerror=...>` is text. Readable at 375 px wide: cards, and the targets' table reflowed below 640 px into
a block per target, each value led by its column's name (a table that scrolled sideways hid its last columns).
"""

from __future__ import annotations

import functools
import time

import jinja2

from oomguard import __version__
from oomguard.exporter.status.view import StatusView, duration, gpu_level

REFRESH_SECONDS = 5
SPARK_MINUTES = 30
# No script from anywhere (none is needed), styles only inline, no frame, no form, no base.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


@functools.cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("oomguard.exporter.status", "templates"),
        autoescape=True,  # every value escaped, whatever its origin
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env.get_template("status.html.j2")


def render(view: StatusView) -> str:
    now = view.taken_at
    return _template().render(
        view=view,
        version=__version__,
        taken=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now)),
        refresh_seconds=REFRESH_SECONDS,
        spark_minutes=SPARK_MINUTES,
        pct=pct,
        num=num,
        bytes=human_bytes,
        duration=duration,
        ago=lambda at: duration(now - at),
        gpu_level=lambda gpu: gpu_level(gpu, view.holding),
        spark=spark_points,
    )


def pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * ratio:.1f} %"


def num(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def human_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


def spark_points(values: list[float], width: float = 160.0, height: float = 28.0) -> str:
    """An SVG polyline's points: used / total across the width, the whole GPU at the top, the window's lowest
    (less 2 % of the GPU) at the bottom: a climb of a few percent near the top still shows."""
    if len(values) < 2:
        return ""
    step = width / (len(values) - 1)
    low = max(0.0, min(values) - 0.02)
    scale = (height - 2) / (1.0 - low) if low < 1.0 else 0.0
    return " ".join(f"{i * step:.1f},{height - 1 - scale * (min(v, 1.0) - low):.1f}" for i, v in enumerate(values))
