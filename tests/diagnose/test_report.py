"""The incident report renders, with its plot, in Markdown and HTML."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image as mpimg

from oomguard.cli import main
from oomguard.diagnose.report import PLOT_DPI, PLOT_SIZE

WIDTH, HEIGHT = int(PLOT_SIZE[0] * PLOT_DPI), int(PLOT_SIZE[1] * PLOT_DPI)


def report(backfilled, instance: str, path: Path) -> int:
    """`oomguard diagnose` of one backfilled instance, its report written to `path`; returns the exit status."""
    return main(["diagnose", "--prometheus", backfilled.url, "--at", str(backfilled.at), "--instance", instance,
                 "--report", str(path)])  # fmt: skip


def written_report(backfilled, capsys: pytest.CaptureFixture[str], instance: str, path: Path) -> str:
    """The report of an instance with a finding (exit status 1) written to `path`: its text."""
    status = report(backfilled, instance, path)
    capsys.readouterr()
    assert status == 1
    return path.read_text()


def plot_pixels(png: bytes) -> np.ndarray:
    """The plot's pixels, checked to be of the plot's size."""
    pixels = mpimg.imread(io.BytesIO(png), format="png")
    assert pixels.shape[:2] == (HEIGHT, WIDTH)
    return pixels


def check_plot(png: bytes) -> None:
    pixels = plot_pixels(png)
    rgb = pixels[..., :3]
    # Not blank: many colours, and a good share of pixels that are not the white background.
    assert len(np.unique(rgb.reshape(-1, 3).round(2), axis=0)) > 50
    assert (rgb.sum(axis=2) < 2.9).mean() > 0.03
    # The curves are there: the memory line's blue and the OOM markers' red.
    blue = (rgb[..., 2] > 0.6) & (rgb[..., 0] < 0.3)
    red = (rgb[..., 0] > 0.8) & (rgb[..., 1] < 0.2) & (rgb[..., 2] < 0.2)
    assert blue.sum() > 500 and red.sum() > 200


def test_markdown_report_with_its_plot(backfilled, tmp_path, capsys) -> None:
    text = written_report(backfilled, capsys, "incident", tmp_path / "incident.md")
    for heading in ("### What happened", "### Timeline", "### Root cause", "### Evidence", "### What to change"):
        assert heading in text
    assert "| T+0 |" in text and "cuda_oom" in text and "T+0 is the first OOM" in text
    assert "![vllm on incident](incident-1.png)" in text
    check_plot((tmp_path / "incident-1.png").read_bytes())


def test_html_report_embeds_the_plot(backfilled, tmp_path, capsys) -> None:
    text = written_report(backfilled, capsys, "slow-leak", tmp_path / "leak.html")
    assert "memory_leak" in text and "<table>" in text
    (data,) = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", text)
    png = base64.b64decode(data)
    assert png.startswith(b"\x89PNG")
    plot_pixels(png)


def test_report_needs_a_known_format(backfilled, tmp_path, capsys) -> None:
    status = report(backfilled, "healthy", tmp_path / "report.pdf")
    assert status == 2
    assert ".md or .html" in capsys.readouterr().err
