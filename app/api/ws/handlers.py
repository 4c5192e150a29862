"""What each WebSocket frame does: a connection's frame type → handler tables.

The reader of app.api.ws.connection parses a frame (``frames.parse``) and awaits
``HANDLERS[type(frame)](connection, frame, frame_id)`` once the connection is OPEN, or the
handler of ``BEFORE_AUTH`` while it authenticates (any other frame: "authenticate first").
tests/unit/test_ws_lifecycle.py checks that every frame type has its handler.

ACK frames are batched (app.api.ws.acks); every other handler flushes the batch first, so
frames still take effect in order. SUBSCRIBE and UNSUBSCRIBE are awaited; NACK and PUBLISH run
concurrently, at most ``connection.ops.limit`` at once with the ACK batches.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from app.api.schemas.messages import result_fields
from app.api.ws import frames
from app.api.ws.acks import FrameId
from app.auth.tokens import digest as token_digest
from app.errors import BadFrame, BrokerError, LimitExceeded, RateLimited, Unauthorized

if TYPE_CHECKING:
    from app.api.ws.connection import WsConnection

log = logging.getLogger("messagex.ws")

F = TypeVar("F")
#: what a frame type is handled by: ``await handler(connection, frame, frame_id)``
Handler = Callable[["WsConnection", Any, FrameId], Awaitable[None]]


# -- while AUTHENTICATING ---------------------------------------------------------------------


async def not_authenticated(conn: WsConnection, frame: Any, frame_id: FrameId) -> None:
    conn.error(Unauthorized("authenticate first with an AUTH frame"), frame_id)


async def auth(conn: WsConnection, frame: frames.AuthFrame, frame_id: FrameId) -> None:
    service = conn.services.auth
    try:
        if not frame.well_formed():
            raise Unauthorized("AUTH carries either a token or a username and password")
        if frame.token is not None:
            user = await service.authenticate_token(frame.token, conn.client)
            conn.digest = token_digest(frame.token)
        else:
            assert frame.username is not None
            assert frame.password is not None
            user, conn.password_hash = await service.authenticate_password_with_hash(
                frame.username, frame.password, conn.client
            )
        # the user's connections on every process (contract §8)
        await conn.engine.admit(conn.id, user.username, conn.client_address)
    except LimitExceeded as exc:
        conn.error(exc, frame_id)
        conn.close(1008, "too many connections for this user")
        return
    except RateLimited as exc:
        conn.error(exc, frame_id)
        conn.close(4429, "too many failed authentications")
        return
    except Unauthorized as exc:
        conn.error(exc, frame_id)
        conn.close(4401, "authentication failed")
        return
    except BrokerError as exc:  # the database is unreachable: try again later
        conn.error(exc, frame_id)
        conn.close(1013, "try again later")
        return
    conn.user = user
    conn.opened()
    conn.reply(frame_id, conn.connected_frame())


async def ping(conn: WsConnection, frame: frames.PingFrame, frame_id: FrameId) -> None:
    conn.acks.flush()
    conn.reply(frame_id, {"type": "PONG"})


# -- once OPEN --------------------------------------------------------------------------------


async def ack(conn: WsConnection, frame: frames.Ack, frame_id: FrameId) -> None:
    if len(conn.ops) >= conn.ops.limit:
        await conn.ops.wait_for_room()
    conn.acks.add(frame, frame_id)


async def already_authenticated(
    conn: WsConnection, frame: frames.AuthFrame, frame_id: FrameId
) -> None:
    conn.acks.flush()
    conn.bad_frame(BadFrame("already authenticated", frame_id=frame_id))


async def subscribe(conn: WsConnection, frame: frames.SubscribeFrame, frame_id: FrameId) -> None:
    conn.acks.flush()
    await _guarded(conn, _subscribe(conn, frame, frame_id), frame_id)


async def unsubscribe(
    conn: WsConnection, frame: frames.UnsubscribeFrame, frame_id: FrameId
) -> None:
    conn.acks.flush()
    await _guarded(conn, _unsubscribe(conn, frame, frame_id), frame_id)


async def nack(conn: WsConnection, frame: frames.NackFrame, frame_id: FrameId) -> None:
    await _concurrently(conn, _nack, frame, frame_id)


async def publish(conn: WsConnection, frame: frames.PublishFrame, frame_id: FrameId) -> None:
    await _concurrently(conn, _publish, frame, frame_id)


#: while AUTHENTICATING
BEFORE_AUTH: dict[type, Handler] = {
    frames.PingFrame: ping,
    frames.AuthFrame: auth,
}
#: once OPEN: every frame type ``frames.parse`` gives
HANDLERS: dict[type, Handler] = {
    frames.PlainAck: ack,
    frames.PlainAcks: ack,
    frames.AckFrame: ack,
    frames.PingFrame: ping,
    frames.AuthFrame: already_authenticated,
    frames.SubscribeFrame: subscribe,
    frames.UnsubscribeFrame: unsubscribe,
    frames.NackFrame: nack,
    frames.PublishFrame: publish,
}


# -- the work -----------------------------------------------------------------------------------


async def _concurrently(
    conn: WsConnection,
    work: Callable[[WsConnection, F, FrameId], Awaitable[None]],
    frame: F,
    frame_id: FrameId,
) -> None:
    conn.acks.flush()
    if len(conn.ops) >= conn.ops.limit:
        await conn.ops.wait_for_room()
    conn.ops.track(asyncio.create_task(_guarded(conn, work(conn, frame, frame_id), frame_id)))


async def _guarded(conn: WsConnection, work: Awaitable[None], frame_id: FrameId) -> None:
    try:
        await work
    except BadFrame as exc:
        conn.bad_frame(exc)
    except BrokerError as exc:
        extra = {k: v for k, v in exc.extra.items() if k == "delivery_tag"}
        conn.error(exc, frame_id, **extra)
    except Exception:
        # A bug must neither kill the reader nor leave a frame with an id unanswered.
        log.exception("a WebSocket frame failed unexpectedly")
        conn.error(BrokerError("an internal error occurred"), frame_id)


async def _subscribe(conn: WsConnection, frame: frames.SubscribeFrame, frame_id: FrameId) -> None:
    sub = await conn.engine.subscribe(conn, frame.queue, frame.prefetch)
    conn.reply(
        frame_id,
        {
            "type": "SUBSCRIBED",
            "queue": frame.queue,
            "prefetch": frame.prefetch,
            "active": not sub.waiting,
        },
    )
    conn.engine.activate(sub)


async def _unsubscribe(
    conn: WsConnection, frame: frames.UnsubscribeFrame, frame_id: FrameId
) -> None:
    await conn.engine.unsubscribe(conn, frame.queue)
    conn.reply(frame_id, {"type": "UNSUBSCRIBED", "queue": frame.queue})


async def _nack(conn: WsConnection, frame: frames.NackFrame, frame_id: FrameId) -> None:
    try:
        outcome = await conn.engine.nack(conn, frame.delivery_tag, frame.requeue)
    except BrokerError as exc:
        exc.extra["delivery_tag"] = frame.delivery_tag
        raise
    if conn.services.tracing is not None:
        conn.services.tracing.settled("nack", [frame.delivery_tag], outcome.value)
    if frame_id is not None:
        conn.reply(
            frame_id,
            {"type": "NACKED", "delivery_tag": frame.delivery_tag, "outcome": outcome.value},
        )


async def _publish(conn: WsConnection, frame: frames.PublishFrame, frame_id: FrameId) -> None:
    publisher = conn.services.publisher
    message = frame.to_outgoing()
    if frame.exchange is not None:
        results = await publisher.publish(conn.user, frame.exchange, [message])
    else:
        assert frame.queue is not None
        results = await publisher.publish_to_queue(conn.user, frame.queue, [message])
    result = results[0]
    conn.reply(
        frame_id,
        {"type": "PUBLISHED", **result_fields(result)},
    )
