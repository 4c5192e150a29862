"""The uvicorn server a broker runs in (``messagex serve`` and the tests alike).

Its graceful shutdown first closes the broker's WebSockets with 1001 ("going away") and
releases what they hold, then lets uvicorn stop the rest: uvicorn on its own would close them
with 1012 only after it stopped accepting, and the release would wait for the lifespan.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import uvicorn
from fastapi import FastAPI

from app.config import Settings

log = logging.getLogger("messagex")

#: how long shutdown waits for WebSocket handlers to release their deliveries
DRAIN_SECONDS = 5.0


class BrokerServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.broker_app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        services = getattr(self.broker_app.state, "services", None)
        if services is not None:
            try:
                await asyncio.wait_for(services.delivery.drain(), DRAIN_SECONDS)
            except TimeoutError:
                log.warning("WebSockets did not close within %.0f s", DRAIN_SECONDS)
        await super().shutdown(sockets)


def server_config(
    app: FastAPI, settings: Settings, host: str, port: int, log_level: str | None = None
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        log_level=log_level,
        access_log=False,
        loop="auto",
        http="auto",
        ws="websockets-sansio",
        ws_max_size=settings.ws_max_frame_bytes,
        lifespan="on",
        timeout_graceful_shutdown=10,
    )


def build_server(
    app: FastAPI, settings: Settings, host: str, port: int, log_level: str | None = None
) -> BrokerServer:
    return BrokerServer(server_config(app, settings, host, port, log_level), app)
