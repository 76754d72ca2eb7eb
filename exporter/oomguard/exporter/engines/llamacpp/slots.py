"""llama-server's `GET /slots` (on by default, `--no-slots` turns it off): the tokens its slots hold.

Each slot is an object with its context size `n_ctx` and, once it has served a request, the tokens
in its cache, `n_prompt_tokens` (the prompt processed so far and the tokens generated after it),
and `is_processing`. The KV use is the tokens held by the slots at work over the context of all
slots: a finished slot keeps its tokens only for reuse, and gives them up to the next request.
A version whose slots do not say whether they work, or how many tokens a working one holds, gives no
figure rather than a wrong one.

The scraper calls `fetch_kv_usage_ratio` on each scrape, beside /metrics (the plugin's `kv_usage`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from oomguard.common import engine_client
from oomguard.common.engine_client import BodyTooLarge, EngineClient
from oomguard.exporter.engines.base import KvUsageError

SLOTS_PATH = "/slots"


class SlotsError(KvUsageError):
    """/slots did not give the slots' state."""


def kv_usage_ratio(slots: Any) -> float | None:
    """The share of the slots' context held by the slots at work; None when no slot tells its size, or a slot
    does not tell whether it works or, working, how many tokens it holds (another version's fields)."""
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
        working, held = slot.get("is_processing"), slot.get("n_prompt_tokens")
        if not isinstance(working, bool) or (working and not _number(held)):
            return None
        if working and held > 0:
            used += min(held, n_ctx)
    return used / capacity if capacity else None


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


async def fetch_kv_usage_ratio(
    client: EngineClient, url: str, timeout: float, max_body_bytes: int = 4 * 1024 * 1024
) -> float | None:
    """GET <url>/slots and its KV use; None when the server has the endpoint off (501) or its slots do not tell.
    SlotsError when the answer is another status, too large, or not the slots' JSON."""
    # Each slot carries its sampling parameters: a few KB a slot. The cap is the scrape's body cap.
    try:
        answer = await engine_client.get(client, url + SLOTS_PATH, timeout=timeout, cap=max_body_bytes)
    except BodyTooLarge:
        raise SlotsError(
            f"GET {url}{SLOTS_PATH} sent more than {max_body_bytes} bytes (scrape.max_body_bytes)"
        ) from None
    if answer.status == 501:  # started with --no-slots
        return None
    if answer.status != 200:
        raise SlotsError(f"GET {url}{SLOTS_PATH} answered HTTP {answer.status}")
    try:
        return kv_usage_ratio(json.loads(answer.body))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SlotsError(f"GET {url}{SLOTS_PATH} sent no JSON: {exc}") from None
