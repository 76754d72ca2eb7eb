"""A webhook receiver for Alertmanager: records every notification with the receiver it was sent to."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Notification:
    at: float
    receiver: str  # the path the receiver's webhook_config posts to: /<receiver name>
    status: str  # firing | resolved
    alertname: str
    labels: dict[str, str]


@dataclass
class WebhookReceiver:
    notifications: list[Notification] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/{receiver}", self._receive)
        return app

    async def _receive(self, request: web.Request) -> web.Response:
        payload: dict[str, Any] = await request.json()
        now = time.time()
        for alert in payload.get("alerts", []):
            labels = alert.get("labels", {})
            self.notifications.append(
                Notification(
                    now, request.match_info["receiver"], alert.get("status", ""), labels.get("alertname", ""), labels
                )
            )
        return web.Response(text="ok")

    def first(self, alertname: str, status: str = "firing") -> Notification | None:
        return next((n for n in self.notifications if n.alertname == alertname and n.status == status), None)
