"""The incident report renders, with its plot, in Markdown and HTML."""

from __future__ import annotations

import base64
import io
import re

import numpy as np
from matplotlib import image as mpimg

from oomguard.cli import main
from oomguard.diagnose.report import PLOT_DPI, PLOT_SIZE

WIDTH, HEIGHT = int(PLOT_SIZE[0] * PLOT_DPI), int(PLOT_SIZE[1] * PLOT_DPI)


def check_plot(png: bytes) -> None:
    pixels = mpimg.imread(io.BytesIO(png), format="png")
    assert pixels.shape[:2] == (HEIGHT, WIDTH)
    rgb = pixels[..., :3]
    # Not blank: many colours, and a good share of pixels that are not the white background.
    assert len(np.unique(rgb.reshape(-1, 3).round(2), axis=0)) > 50
    assert (rgb.sum(axis=2) < 2.9).mean() > 0.03
    # The curves are there: the memory line's blue and the OOM markers' red.
    blue = (rgb[..., 2] > 0.6) & (rgb[..., 0] < 0.3)
    red = (rgb[..., 0] > 0.8) & (rgb[..., 1] < 0.2) & (rgb[..., 2] < 0.2)
    assert blue.sum() > 500 and red.sum() > 200


def test_markdown_report_with_its_plot(backfilled, tmp_path, capsys) -> None:
    path = tmp_path / "incident.md"
    status = main(["diagnose", "--prometheus", backfilled.url, "--at", str(backfilled.at), "--instance", "incident",
                   "--report", str(path)])  # fmt: skip
    capsys.readouterr()
    assert status == 1
    text = path.read_text()
    for heading in ("### What happened", "### Timeline", "### Root cause", "### Evidence", "### What to change"):
        assert heading in text
    assert "| T+0 |" in text and "cuda_oom" in text and "T+0 is the first OOM" in text
    assert "![vllm on incident](incident-1.png)" in text
    check_plot((tmp_path / "incident-1.png").read_bytes())


def test_html_report_embeds_the_plot(backfilled, tmp_path, capsys) -> None:
    path = tmp_path / "leak.html"
    status = main(["diagnose", "--prometheus", backfilled.url, "--at", str(backfilled.at), "--instance", "slow-leak",
                   "--report", str(path)])  # fmt: skip
    capsys.readouterr()
    assert status == 1
    text = path.read_text()
    assert "memory_leak" in text and "<table>" in text
    (data,) = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", text)
    png = base64.b64decode(data)
    assert png.startswith(b"\x89PNG")
    pixels = mpimg.imread(io.BytesIO(png), format="png")
    assert pixels.shape[:2] == (HEIGHT, WIDTH)


def test_report_needs_a_known_format(backfilled, tmp_path, capsys) -> None:
    status = main(["diagnose", "--prometheus", backfilled.url, "--at", str(backfilled.at), "--instance", "healthy",
                   "--report", str(tmp_path / "report.pdf")])  # fmt: skip
    assert status == 2
    assert ".md or .html" in capsys.readouterr().err
