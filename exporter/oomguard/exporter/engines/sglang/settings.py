"""SGLang's reservation, `--mem-fraction-static`, from its server information (not in its /metrics).

`GET /server_info` (`/get_server_info` before it, now deprecated) answers the server's
arguments as one JSON object, `mem_fraction_static` among them: the share of each GPU's
total memory that weights and the KV cache pool take from the start.
"""

from __future__ import annotations

import json

from oomguard.common import engine_client
from oomguard.common.engine_client import BodyTooLarge, EngineClient
from oomguard.common.promtext import finite
from oomguard.exporter.engines.base import ReservationError

PATHS = ("/server_info", "/get_server_info")  # newest first
MAX_BODY_BYTES = 4 * 1024 * 1024  # the arguments and a little state per data-parallel rank: a few KB


async def mem_fraction_static(client: EngineClient, base_url: str, timeout: float) -> float | None:
    """The fraction, or None when the server publishes none; ReservationError when it could not be read now."""
    for path in PATHS:
        url = base_url + path
        try:
            answer = await engine_client.get(client, url, timeout=timeout, cap=MAX_BODY_BYTES)
        except BodyTooLarge:
            raise ReservationError(f"{url} sent more than {MAX_BODY_BYTES} bytes") from None
        if answer.status == 404:
            continue  # a version without this path: try the older one
        if answer.status != 200:
            raise ReservationError(f"GET {url} answered HTTP {answer.status}")
        try:
            info = json.loads(answer.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ReservationError(f"{url} sent a body that is not JSON: {exc}") from None
        value = info.get("mem_fraction_static") if isinstance(info, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        ratio = finite(float(value))
        return ratio if ratio is not None and 0 < ratio <= 1 else None
    return None  # neither path: this version publishes no server information
