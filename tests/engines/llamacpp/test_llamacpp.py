"""llama.cpp: its reader and /slots on bodies captured from a real llama-server (its log lines:
tests/engines/test_log_patterns.py)."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from support import FIXTURES, engine_reading, fixture_body

from oomguard.common.engine_client import EngineClient
from oomguard.common.promtext import ExpositionError
from oomguard.exporter.engines.llamacpp.slots import SlotsError, fetch_kv_usage_ratio, kv_usage_ratio

SLOTS = json.loads((FIXTURES / "llamacpp" / "slots.json").read_text(encoding="utf-8"))


def test_a_busy_server() -> None:
    reading = engine_reading("llamacpp", fixture_body("llamacpp", "metrics.prom"))
    (model,) = reading.models
    assert model.model_name == ""  # its metrics name no model
    assert (model.requests_running, model.requests_waiting) == (2.0, 1.0)
    assert model.kv_cache_usage_ratio is None  # removed upstream: /slots tells it
    assert model.preemptions_total is None
    # Its context is allocated whole at start and published as no share of a GPU: no reservation.
    assert reading.memory_utilization_ratio is None and reading.reservation_ratio is None


@pytest.mark.parametrize(
    "body",
    ["", "llamacpp:prompt_tokens_total 5\n", fixture_body("tgi", "tgi-3.x.prom"), "requests_processing 1\n"],
)
def test_a_body_that_is_not_llamacpp_is_refused(body: str) -> None:
    with pytest.raises(ExpositionError, match=r"no llama\.cpp families"):
        engine_reading("llamacpp", body)


def test_the_slots_kv_use() -> None:
    # Both slots at work, holding their 64-token prompt and 25 and 26 generated tokens, of 2048 each.
    assert [(s["n_prompt_tokens"], s["n_ctx"]) for s in SLOTS] == [(89, 2048), (90, 2048)]
    assert kv_usage_ratio(SLOTS) == pytest.approx((89 + 90) / (2 * 2048))


def test_an_idle_slot_holds_no_kv_and_an_unserved_one_has_no_tokens() -> None:
    idle = [
        {**SLOTS[0], "is_processing": False},
        {"id": 1, "n_ctx": 2048, "speculative": False, "is_processing": False},
    ]
    assert kv_usage_ratio(idle) == 0.0
    assert kv_usage_ratio([{**SLOTS[0], "n_prompt_tokens": 5000}]) == 1.0  # never above the slot's size


@pytest.mark.parametrize("slots", [[], [{"id": 0}], [{"id": 0, "n_ctx": 0}], [{"id": 0, "n_ctx": True}]])
def test_slots_without_a_size_give_no_figure(slots: list) -> None:
    assert kv_usage_ratio(slots) is None


@pytest.mark.parametrize("body", [{"error": "x"}, [1, 2], "slots"])
def test_a_slots_answer_of_another_shape_is_an_error(body: object) -> None:
    with pytest.raises(SlotsError):
        kv_usage_ratio(body)


async def test_fetching_the_slots(aiohttp_client) -> None:
    answers = {"/a/slots": web.json_response(SLOTS)}

    async def slots(request: web.Request) -> web.Response:
        if request.path.startswith("/off"):  # llama-server --no-slots
            return web.json_response(
                {"error": {"code": 501, "message": "This server does not support slots"}}, status=501
            )
        if request.path.startswith("/broken"):
            return web.Response(text="not json")
        if request.path.startswith("/loading"):
            return web.json_response({"error": {"code": 503, "message": "Loading model"}}, status=503)
        return answers[request.path]

    app = web.Application()
    app.router.add_get("/{prefix}/slots", slots)
    client = await aiohttp_client(app)
    base = f"http://{client.host}:{client.port}/"
    async with EngineClient() as session:
        assert await fetch_kv_usage_ratio(session, base + "a", 5) == pytest.approx(179 / 4096)
        assert await fetch_kv_usage_ratio(session, base + "off", 5) is None
        with pytest.raises(SlotsError, match="no JSON"):
            await fetch_kv_usage_ratio(session, base + "broken", 5)
        with pytest.raises(SlotsError, match="HTTP 503"):
            await fetch_kv_usage_ratio(session, base + "loading", 5)
