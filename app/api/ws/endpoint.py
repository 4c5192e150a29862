"""``GET /api/v1/ws``: Origin check and header authentication before the upgrade."""

from __future__ import annotations

import logging

from fastapi import APIRouter, WebSocket

from app.api.problems import broker_error_response
from app.api.ws.connection import WsConnection
from app.api.ws.origins import origin_allowed
from app.auth.tokens import BearerCredentials, digest, parse_authorization
from app.broker.services import Services
from app.domain.model import User
from app.errors import BrokerError, Forbidden, Unavailable

log = logging.getLogger("messagex.ws")

router = APIRouter()


@router.websocket("/ws", name="websocket")
async def websocket(ws: WebSocket) -> None:
    services: Services = ws.app.state.services
    if services.delivery.shutting_down:  # reconnecting clients go to another broker
        await ws.send_denial_response(
            broker_error_response(Unavailable("the broker is shutting down"))
        )
        return
    if not origin_allowed(
        ws.headers.get("origin"), ws.headers.get("host"), services.settings.allowed_origins
    ):
        await ws.send_denial_response(
            broker_error_response(Forbidden("this Origin may not open a WebSocket"))
        )
        return
    user: User | None = None
    token_digest: bytes | None = None
    password_hash: str | None = None
    header = ws.headers.get("authorization")
    if header:
        client = ws.client.host if ws.client else None
        try:
            user, password_hash = await services.auth.authenticate_with_hash(header, client)
        except BrokerError as exc:
            await ws.send_denial_response(broker_error_response(exc))
            return
        credentials = parse_authorization(header)
        if isinstance(credentials, BearerCredentials):
            token_digest = digest(credentials.token)
    connection = WsConnection(ws, services, user, token_digest)
    connection.password_hash = password_hash
    if user is not None:
        try:  # the user's connections on every process (429 limit_exceeded)
            await services.subscriptions.admit(
                connection.id, user.username, connection.client_address
            )
        except BrokerError as exc:
            await ws.send_denial_response(broker_error_response(exc))
            return
        try:
            await ws.accept()
        except BaseException:
            await services.subscriptions.disconnect(connection)
            raise
        connection.opened()
        connection.send(connection.connected_frame())
    else:
        await ws.accept()
    await connection.run()
