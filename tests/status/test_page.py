"""The status page's HTML (status/page.py) from a view: its colours follow what the view judges (the pages that hold),
and at a phone's width (375 px) the targets' table reflows into one labelled block per target, none of its columns
off the right edge."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from status.test_view import snapshot

from oomguard.bundle.thresholds import default_thresholds
from oomguard.exporter.status.page import render
from oomguard.exporter.status.view import build


def _classes_of(html: str, text: str) -> set[str]:
    """The classes of the span whose text begins with `text`."""
    found = re.search(r'<span class="([^"]*)">' + re.escape(text), html)
    assert found, f"no span {text!r} in the page"
    return set(found[1].split())


def test_headroom_is_red_while_exhausted_soon_pages_even_when_the_headroom_is_low() -> None:
    """The quick start's climb: 24 % of the headroom used and full in 22 s: ExhaustedSoon pages; the headroom must not
    read green beside it."""
    th = default_thresholds()
    view = build(snapshot(("0", 0.92, 0.242, 22.0)), thresholds=default_thresholds())
    assert [(h.alert, h.subject) for h in view.holding] == [("OomGuardGpuMemoryExhaustedSoon", "GPU 0")]
    assert th.page("exhausted_soon").severity == "critical"
    html = render(view)
    assert "bad" in _classes_of(html, "headroom used 24.2 %")
    assert "bad" in _classes_of(html, "full in 22s")


def test_headroom_is_never_red_without_a_page_nor_green_with_a_ticket_alone() -> None:
    th = default_thresholds()
    quiet = render(build(snapshot(("0", 0.93, th.headroom_critical, None)), thresholds=default_thresholds()))
    assert "bad" not in _classes_of(quiet, "headroom used")  # at the threshold nothing pages (the rule is ">")
    low = render(build(snapshot(("0", 0.91, 0.1, None)), thresholds=default_thresholds()))
    assert "ok" in _classes_of(low, "headroom used 10.0 %")
    # A time to full beyond ExhaustedSoon's horizon pages nothing: said, not in red.
    later = render(
        build(
            snapshot(("0", 0.91, 0.3, th.exhausted_soon_seconds + 600)),
            thresholds=default_thresholds(),
        )
    )
    assert "bad" not in _classes_of(later, "full in")


class _Table(HTMLParser):
    """The targets' table: its header cells' text and each body cell's data-label."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[str] = []
        self.labels: list[list[str | None]] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "th":
            self.headers.append("")
            self._in = "th"
        elif tag == "tr":
            self.labels.append([])
        elif tag == "td":
            self.labels[-1].append(dict(attrs).get("data-label"))

    def handle_endtag(self, tag: str) -> None:
        if tag == "th":
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "th":
            self.headers[-1] += data


def test_at_a_phones_width_each_target_is_a_block_of_labelled_cells() -> None:
    html = render(build(snapshot(("0", 0.92, 0.242, 22.0), oom_ago=60), thresholds=default_thresholds()))
    table = _Table()
    table.feed(html[html.index("<table") : html.index("</table>") + 8])
    rows = [labels for labels in table.labels if labels]
    assert table.headers[:2] == ["target", "state"] and rows, html
    # Every cell says its column: reflowed, the header row is gone and each value keeps its name.
    for labels in rows:
        assert labels == table.headers, (labels, table.headers)
    style = html[html.index("<style>") : html.index("</style>")]
    narrow = re.search(r"@media\s*\(max-width:\s*(\d+)px\)\s*\{(.*?)\}\s*\}", style, re.S)
    assert narrow and int(narrow[1]) >= 375, style
    rules = dict(rule.split("{", 1) for rule in narrow[2].replace(" ", "").replace("\n", "").split("}") if rule)
    # The table's parts laid out as blocks (no column can sit past the edge), the header row hidden, and each cell
    # led by its label.
    blocks = {part for selectors, body in rules.items() if "display:block" in body for part in selectors.split(",")}
    assert {".targetstable", ".targetstr", ".targetstd"} <= blocks, rules
    assert "display:none" in rules.get(".targetstr:first-child", ""), rules
    assert rules.get(".targetstd::before", "").startswith("content:attr(data-label)"), rules
