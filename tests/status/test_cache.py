"""`/` and `/status.json` rendered once a snapshot: the looks that share a collection share its page and its JSON,
as the scrapes share the answer's text (issue 50, item 4). Counted, not timed: the renders are observed."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from targets_zoo import Zoo

from oomguard.exporter.config_loader import load_config
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.status import page as page_module
from oomguard.exporter.status import view as view_module
from oomguard.exporter.web import make_app
from oomguard.simulate.fake_nvml import GIB, FakeGpu, FakeNvml, FakeProcess

LOOKS = 8


def _app(zoo: Zoo, kind: str):  # type: ignore[no-untyped-def]
    """One target of the zoo's `kind` (its path: config URLs take none) on one fake GPU; no event source."""
    config = load_config(
        None,
        {
            "targets": [{"name": kind, "url": zoo.base, "gpus": [0]}],
            "scrape": {"timeout_seconds": 1},
            "nvml": {"timeout_seconds": 0.5},
            "events": {"kernel_log": False, "xid": False},
        },
    )
    config = config.model_copy(
        update={"targets": tuple(t.model_copy(update={"url": f"{zoo.base}/{kind}"}) for t in config.targets)}
    )
    lib = FakeNvml([FakeGpu(0, used_bytes=74 * GIB, processes=[FakeProcess(4242, 73 * GIB)])])
    return make_app(Runtime(config, nvml_lib=lib))


class _Counted:
    """The page's renders and the view's conversions to JSON, with the thread each ran in."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pages: list[threading.Thread] = []
        self.documents: list[threading.Thread] = []
        self.views: list[view_module.StatusView] = []
        real_render, real_to_json = page_module.render, view_module.StatusView.to_json

        def render(view: view_module.StatusView) -> str:
            self.pages.append(threading.current_thread())
            self.views.append(view)
            return real_render(view)

        def to_json(view: view_module.StatusView) -> dict[str, object]:
            self.documents.append(threading.current_thread())
            self.views.append(view)
            return real_to_json(view)

        monkeypatch.setattr(page_module, "render", render)
        monkeypatch.setattr(view_module.StatusView, "to_json", to_json)

    def clear(self) -> None:
        self.pages.clear()
        self.documents.clear()
        self.views.clear()


async def test_concurrent_looks_render_the_page_and_the_json_once_a_snapshot_in_a_thread(
    aiohttp_client, zoo: Zoo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight looks at `/` and eight at `/status.json` at once share one collection (the slow target holds it open
    while they all arrive), so one snapshot: one page render and one JSON, each off the event loop, the same bytes
    for every look (each look rendered its own before: eight of each, the JSON on the loop)."""
    counted = _Counted(monkeypatch)
    client = await aiohttp_client(_app(zoo, "slow"))
    await client.get("/metrics")  # let the warm-up finish
    before = zoo.requests["slow"]
    counted.clear()
    responses = await asyncio.gather(*(client.get(path) for path in ("/", "/status.json") * LOOKS))
    assert [r.status for r in responses] == [200] * 2 * LOOKS
    assert zoo.requests["slow"] - before == 1  # one collection: one snapshot for the sixteen
    assert len(counted.pages) == 1 and len(counted.documents) == 1
    assert threading.main_thread() not in counted.pages + counted.documents
    assert len({id(v) for v in counted.views}) == 1  # one view for both renderings
    pages = {await r.read() for r in responses[::2]}
    documents = {await r.read() for r in responses[1::2]}
    assert len(pages) == 1 and len(documents) == 1 and b">slow<" in next(iter(pages))


async def test_a_new_snapshot_gets_a_new_rendering_and_a_rendering_is_made_only_when_asked(
    aiohttp_client, zoo: Zoo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What is kept is the last snapshot's: the next collection renders again (never an older page served), and
    looks at `/` alone never make the JSON."""
    counted = _Counted(monkeypatch)
    client = await aiohttp_client(_app(zoo, "good"))
    await client.get("/metrics")
    counted.clear()
    for _ in range(2):  # each its own collection, one after the other: its own snapshot, its own page
        assert (await client.get("/")).status == 200
    assert len(counted.pages) == 2 and counted.documents == []
    assert counted.views[0] is not counted.views[1] and counted.views[0].taken_at < counted.views[1].taken_at


async def test_the_bodies_are_the_views_renderings_byte_for_byte(
    aiohttp_client, zoo: Zoo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept, not changed: the page is jinja2's text as UTF-8, the JSON `json.dumps` of the view (every non-ASCII
    character escaped), with the headers each had when it was rendered at each look."""
    counted = _Counted(monkeypatch)
    client = await aiohttp_client(_app(zoo, "slow"))
    await client.get("/metrics")
    counted.clear()
    page, document = await asyncio.gather(client.get("/"), client.get("/status.json"))
    (view,) = {id(v): v for v in counted.views}.values()  # one view for both
    assert await page.read() == page_module.render(view).encode("utf-8")
    assert await document.read() == json.dumps(view_module.StatusView.to_json(view)).encode("utf-8")
    assert page.headers["Content-Type"] == "text/html; charset=utf-8"
    assert document.headers["Content-Type"] == "application/json; charset=utf-8"
    for response in (page, document):
        assert response.headers["Cache-Control"] == "no-store"
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert page.headers["Content-Security-Policy"] == page_module.CONTENT_SECURITY_POLICY
