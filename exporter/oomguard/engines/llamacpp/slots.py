"""llama-server's `GET /slots` (on by default, `--no-slots` turns it off): the tokens its slots hold.

Each slot is an object with its context size `n_ctx` and, once it has served a request, the tokens
in its cache, `n_prompt_tokens` (the prompt processed so far and the tokens generated after it),
and `is_processing`. The KV use is the tokens held by the slots at work over the context of all
slots: a finished slot keeps its tokens only for reuse, and gives them up to the next request.
"""

from __future__ import annotations

import json
import math
from typing import Any

import aiohttp

SLOTS_PATH = "/slots"


class SlotsError(Exception):
    """/slots did not give the slots' state."""


def kv_usage_ratio(slots: Any) -> float | None:
    """The share of the slots' context held by the slots at work; None when no slot tells its size."""
    if not isinstance(slots, list):
        raise SlotsError(f"/slots sent {type(slots).__name__}, not a list of slots")
    capacity = used = 0.0
    for slot in slots:
        if not isinstance(slot, dict):
            raise SlotsError(f"/slots sent a slot that is {type(slot).__name__}, not an object")
        n_ctx = slot.get("n_ctx")
        if not _number(n_ctx) or n_ctx <= 0:
            continue
        capacity += n_ctx
        held = slot.get("n_prompt_tokens")
        if slot.get("is_processing") is True and _number(held) and held > 0:
            used += min(held, n_ctx)
    return used / capacity if capacity else None


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


async def fetch_kv_usage_ratio(session: aiohttp.ClientSession, url: str, timeout: float) -> float | None:
    """GET <url>/slots and its KV use; None when the server has the endpoint off (501) or sizes no slot."""
    async with session.get(
        url + SLOTS_PATH, timeout=aiohttp.ClientTimeout(total=timeout), allow_redirects=False
    ) as response:
        body = await response.read()
        if response.status == 501:  # started with --no-slots
            return None
        if response.status != 200:
            raise SlotsError(f"GET {url}{SLOTS_PATH} answered HTTP {response.status}")
    try:
        return kv_usage_ratio(json.loads(body))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SlotsError(f"GET {url}{SLOTS_PATH} sent no JSON: {exc}") from None
