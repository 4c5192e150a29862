"""One WebSocket connection: authentication, the frame loop, a bounded outbox and its sender.

States: AUTHENTICATING → OPEN → CLOSING. The reader parses every frame with one TypeAdapter
and never blocks on the database for an ACK/NACK (those run as tasks, so acks that arrive
together settle together); the sender drains the outbox, so a slow socket never blocks
dispatch to anyone else and holds no database connection while it waits.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from enum import Enum
from functools import partial
from typing import Any

import orjson
from starlette.websockets import WebSocket, WebSocketDisconnect

from app import serverext
from app.api.codec import render
from app.api.deliveries import delivery_fields
from app.api.problems import error_frame
from app.api.ws import frames
from app.auth.tokens import digest as token_digest
from app.broker.consumers import Subscription
from app.broker.services import Services
from app.domain.model import Delivery, User
from app.errors import BadFrame, BrokerError, RateLimited, Unauthorized, UnknownDeliveryTag

log = logging.getLogger("messagex.ws")

AUTH_DEADLINE_SECONDS = 10.0
#: a send that takes longer than this means the client stopped reading: close it
SEND_TIMEOUT_SECONDS = 30.0
#: more bad frames than this within the window close the connection with 1008
BAD_FRAME_LIMIT = 50
BAD_FRAME_WINDOW_SECONDS = 10.0
#: stop reading new frames while this many replies wait to be sent (backpressure)
OUTBOX_SOFT_LIMIT = 256
#: at most this many ACK/NACK/PUBLISH tasks at once per connection
MAX_INFLIGHT_OPS = 1024
#: on close, how long ACK/NACK/PUBLISH frames already read may take to finish
OPS_GRACE_SECONDS = 5.0


class State(Enum):
    AUTHENTICATING = 1
    OPEN = 2
    CLOSING = 3


class _Close:
    def __init__(self, code: int, reason: str) -> None:
        self.code = code
        self.reason = reason


class Outbox:
    """FIFO of encoded frames. Deliveries are bounded by prefetch credit; replies by the
    reader waiting for room before it reads another frame."""

    def __init__(self) -> None:
        self._items: deque[bytes | _Close] = deque()
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    def push(self, item: bytes | _Close) -> None:
        self._items.append(item)
        self._ready.set()
        if len(self._items) > OUTBOX_SOFT_LIMIT:
            self._room.clear()

    async def wait_for_room(self) -> None:
        await self._room.wait()

    async def take(self) -> list[bytes | _Close]:
        await self._ready.wait()
        items = list(self._items)
        self._items.clear()
        self._ready.clear()
        self._room.set()
        return items


class Inbound:
    """The peer's frames in order: ``next()`` gives a text frame's text, a binary frame's
    bytes, or None once the peer is gone.

    Under our server (``RECEIVE_MANY`` in the scope) the text frames of one socket read come
    as one ASGI message: a consumer acking every delivery sends them in bursts, and one ASGI
    event, queue hand-over and state check per frame showed in the broker's profile. Under
    any other server, plain ``websocket.receive`` messages.
    """

    def __init__(self, ws: WebSocket) -> None:
        self._receive = serverext.receive_many(ws.scope) or ws.receive
        self._pending: deque[str] = deque()

    async def next(self) -> str | bytes | None:
        if self._pending:
            return self._pending.popleft()
        message = await self._receive()
        kind = message["type"]
        if kind == serverext.RECEIVE_MANY:
            self._pending.extend(message["texts"])
            return self._pending.popleft()
        if kind == "websocket.receive":
            text = message.get("text")
            return text if text is not None else message.get("bytes") or b""
        if kind == "websocket.disconnect":
            return None
        raise RuntimeError(f"unexpected ASGI message {kind!r}")


def _delivered_frame(queue: str, item: Delivery, raw_json: bool) -> dict[str, Any]:
    return {"type": "MESSAGE_DELIVERED", **delivery_fields(queue, item, raw_json=raw_json)}


class WsConnection:
    def __init__(
        self, ws: WebSocket, services: Services, user: User | None, digest: bytes | None
    ) -> None:
        self.ws = ws
        self.services = services
        self.engine = services.subscriptions
        self.id = str(uuid.uuid4())
        self.user: User = user  # type: ignore[assignment]  # set before OPEN
        self.digest = digest
        self.state = State.AUTHENTICATING if user is None else State.OPEN
        self.outbox = Outbox()
        self.inbound = Inbound(ws)
        self._bad_frames: deque[float] = deque()
        self._ops: set[asyncio.Future[Any]] = set()
        self._ops_room = asyncio.Event()  # set when an op finished (room for another)
        self._acks: list[tuple[frames.Ack, str | int | None]] = []  # read, not yet settling
        self.client = ws.client.host if ws.client else None

    # -- Outlet (what the broker calls) -----------------------------------------------------

    def deliver(self, subscription: Subscription, items: Sequence[Delivery]) -> None:
        queue = subscription.queue_name
        for item in items:
            # codec.render: orjson with stored bodies spliced in, or the stdlib when headers
            # hold what orjson cannot write (an integer beyond 64 bits) — never an exception
            # here, which would strand claimed deliveries.
            self.outbox.push(render(partial(_delivered_frame, queue, item)))

    def cancel(self, queue: str, reason: str) -> None:
        self.send({"type": "SUBSCRIPTION_CANCELLED", "queue": queue, "reason": reason})

    def close(self, code: int, reason: str) -> None:
        if self.state is not State.CLOSING:
            self.state = State.CLOSING
            self.outbox.push(_Close(code, reason))

    # -- sending ----------------------------------------------------------------------------

    def send(self, frame: dict[str, Any]) -> None:
        self.outbox.push(orjson.dumps(frame))

    def reply(self, frame_id: str | int | None, frame: dict[str, Any]) -> None:
        if frame_id is not None:
            frame["id"] = frame_id
        self.send(frame)

    def error(self, exc: BrokerError, frame_id: str | int | None = None, **fields: Any) -> None:
        self.send(error_frame(exc, frame_id, **fields))

    async def _sender(self) -> None:
        loop = asyncio.get_running_loop()
        send_many = self._send_many()
        while True:
            items = await self.outbox.take()
            try:
                # One timeout for the whole batch, moved forward before each send: every send
                # still gets SEND_TIMEOUT_SECONDS, without a task and a timer per frame (which
                # asyncio.wait_for costs).
                async with asyncio.timeout(None) as deadline:
                    frames: list[bytes] = []
                    for item in items:
                        if isinstance(item, bytes):
                            frames.append(item)
                            continue
                        deadline.reschedule(loop.time() + SEND_TIMEOUT_SECONDS)
                        await send_many(frames)
                        await self.ws.close(item.code, item.reason)
                        return
                    deadline.reschedule(loop.time() + SEND_TIMEOUT_SECONDS)
                    await send_many(frames)
            except TimeoutError:
                log.warning("closing a WebSocket that stopped reading (send timeout)")
                self._abort()
                return

    def _send_many(self) -> Callable[[list[bytes]], Awaitable[None]]:
        """Send encoded frames in order: in one write through our server's ``SEND_MANY``
        extension, else one ASGI ``websocket.send`` each (any other ASGI server)."""
        send_batch = serverext.send_many(self.ws.scope)
        if send_batch is not None:

            async def send_many(frames: list[bytes]) -> None:
                if frames:
                    await send_batch(frames)

            return send_many
        send = self.ws.send

        async def send_each(frames: list[bytes]) -> None:
            for frame in frames:
                await send({"type": "websocket.send", "text": frame.decode()})

        return send_each

    def _abort(self) -> None:
        """Drop the TCP connection: a graceful close would wait for the peer to read."""
        abort = serverext.abort(self.ws.scope)
        if abort is not None:
            abort()

    # -- the connection's life --------------------------------------------------------------

    async def run(self) -> None:
        sender = asyncio.create_task(self._sender(), name=f"ws-send-{self.id}")
        reader = asyncio.create_task(self._reader(), name=f"ws-read-{self.id}")
        try:
            await asyncio.wait({sender, reader}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, sender):
                task.cancel()
            await asyncio.gather(reader, sender, return_exceptions=True)
            # ACK/NACK/PUBLISH frames read before the close still take effect (an ACK sent
            # just before closing must not become a redelivery); bounded, then cancelled.
            self._flush_acks()
            if self._ops:
                await asyncio.wait(set(self._ops), timeout=OPS_GRACE_SECONDS)
            for op in list(self._ops):
                op.cancel()
            if self._ops:
                await asyncio.gather(*self._ops, return_exceptions=True)
            if self.state is not State.AUTHENTICATING or self.user is not None:
                try:
                    await self.engine.disconnect(self)
                except BrokerError:
                    log.warning("release on disconnect failed; ack timeouts will release")

    async def _reader(self) -> None:
        try:
            if self.state is State.AUTHENTICATING:
                async with asyncio.timeout(AUTH_DEADLINE_SECONDS):
                    await self._authenticate()
                if not self.is_open():
                    return
            while True:
                await self.outbox.wait_for_room()
                data = await self.inbound.next()
                if data is None:
                    return
                await self._on_message(data)
        except TimeoutError:
            self.close(4401, "authentication timed out")
        except WebSocketDisconnect:
            return

    def is_open(self) -> bool:
        return self.state is State.OPEN

    def opened(self) -> None:
        self.state = State.OPEN
        self.engine.connect(self, self.digest)

    async def _authenticate(self) -> None:
        while self.state is State.AUTHENTICATING:
            data = await self.inbound.next()
            if data is None:
                return
            try:
                frame, frame_id = self._frame_of(data)
            except BadFrame as exc:
                self._bad_frame(exc)
                continue
            if isinstance(frame, frames.PingFrame):
                self.reply(frame_id, {"type": "PONG"})
            elif isinstance(frame, frames.AuthFrame):
                await self._auth_frame(frame, frame_id)
            else:
                self.error(Unauthorized("authenticate first with an AUTH frame"), frame_id)

    async def _auth_frame(self, frame: frames.AuthFrame, frame_id: str | int | None) -> None:
        auth = self.services.auth
        try:
            if not frame.well_formed():
                raise Unauthorized("AUTH carries either a token or a username and password")
            if frame.token is not None:
                user = await auth.authenticate_token(frame.token, self.client)
                self.digest = token_digest(frame.token)
            else:
                assert frame.username is not None
                assert frame.password is not None
                user = await auth.authenticate_password(frame.username, frame.password, self.client)
        except RateLimited as exc:
            self.error(exc, frame_id)
            self.close(4429, "too many failed authentications")
            return
        except Unauthorized as exc:
            self.error(exc, frame_id)
            self.close(4401, "authentication failed")
            return
        except BrokerError as exc:  # the database is unreachable: try again later
            self.error(exc, frame_id)
            self.close(1013, "try again later")
            return
        self.user = user
        self.opened()
        self.reply(frame_id, self.connected_frame())

    def connected_frame(self) -> dict[str, Any]:
        return {
            "type": "CONNECTED",
            "connection_id": self.id,
            "user": {"username": self.user.username, "role": self.user.role.value},
        }

    # -- frames -----------------------------------------------------------------------------

    def _frame_of(
        self, data: str | bytes
    ) -> tuple[frames.Frame | frames.PlainAck, str | int | None]:
        if isinstance(data, bytes):
            raise BadFrame("frames are JSON text frames, not binary")
        return frames.parse(data)

    def _bad_frame(self, exc: BadFrame) -> None:
        frame_id = exc.extra.get("frame_id")
        self.error(exc, frame_id)
        now = time.monotonic()
        self._bad_frames.append(now)
        while self._bad_frames and now - self._bad_frames[0] > BAD_FRAME_WINDOW_SECONDS:
            self._bad_frames.popleft()
        if len(self._bad_frames) > BAD_FRAME_LIMIT:
            self.close(1008, "too many bad frames")

    async def _on_message(self, data: str | bytes) -> None:
        try:
            frame, frame_id = self._frame_of(data)
        except BadFrame as exc:
            self._bad_frame(exc)
            return
        await self._handle(frame, frame_id)

    async def _handle(
        self, frame: frames.Frame | frames.PlainAck, frame_id: str | int | None
    ) -> None:
        if isinstance(frame, frames.Ack):
            if len(self._ops) >= MAX_INFLIGHT_OPS:
                await self._wait_for_room()
            self._queue_ack(frame, frame_id)
            return
        self._flush_acks()
        if isinstance(frame, frames.PingFrame):
            self.reply(frame_id, {"type": "PONG"})
        elif isinstance(frame, frames.AuthFrame):
            self._bad_frame(BadFrame("already authenticated", frame_id=frame_id))
        elif isinstance(frame, frames.SubscribeFrame):
            await self._guarded(self._subscribe(frame, frame_id), frame_id)
        elif isinstance(frame, frames.UnsubscribeFrame):
            await self._guarded(self._unsubscribe(frame, frame_id), frame_id)
        else:  # NACK, PUBLISH: run concurrently, at most MAX_INFLIGHT_OPS at once
            if len(self._ops) >= MAX_INFLIGHT_OPS:
                await self._wait_for_room()
            self._track(asyncio.create_task(self._guarded(self._op(frame, frame_id), frame_id)))

    def _track(self, op: asyncio.Future[Any]) -> None:
        self._ops.add(op)
        op.add_done_callback(self._op_done)

    def _queue_ack(self, frame: frames.Ack, frame_id: str | int | None) -> None:
        """The frame a busy consumer sends per message. The ACK frames read in one turn of the
        event loop (a burst from one socket read) are settled together, by one call of the
        engine and a callback on the batched ack's future: no task, future and callbacks per
        frame. Any other frame flushes them first, so frames still take effect in order."""
        if not self._acks:
            asyncio.get_running_loop().call_soon(self._flush_acks)
        self._acks.append((frame, frame_id))

    def _flush_acks(self) -> None:
        batch, self._acks = self._acks, []
        if not batch:
            return
        tags = [tag for frame, _ in batch for tag in frame.tags]
        self._track(self.engine.ack_soon(self, tags, partial(self._acked_batch, batch)))

    def _acked_batch(
        self,
        batch: list[tuple[frames.Ack, str | int | None]],
        queue_ids: list[int | None],
        exc: BaseException | None,
    ) -> None:
        if exc is None and None not in queue_ids:  # the busy consumer's case: all settled
            for frame, frame_id in batch:
                if frame_id is not None:
                    self._acked(frame, frame_id, [], None)
            return
        start = 0
        for frame, frame_id in batch:
            end = start + len(frame.tags)
            if exc is not None:
                self._acked(frame, frame_id, list(frame.tags), exc)
            else:
                found = queue_ids[start:end]
                unknown = [t for t, q in zip(frame.tags, found, strict=True) if q is None]
                self._acked(frame, frame_id, unknown, None)
            start = end

    async def _wait_for_room(self) -> None:
        """Backpressure: stop reading frames while MAX_INFLIGHT_OPS are unsettled (a plain
        count, not a Semaphore: its bookkeeping showed at 2 % of a busy consumer's CPU)."""
        while len(self._ops) >= MAX_INFLIGHT_OPS:
            self._ops_room.clear()
            await self._ops_room.wait()

    def _op_done(self, op: asyncio.Future[Any]) -> None:
        self._ops.discard(op)
        self._ops_room.set()

    def _acked(
        self,
        frame: frames.Ack,
        frame_id: str | int | None,
        unknown: list[str],
        exc: BaseException | None,
    ) -> None:
        """The reply to an ACK: ``ACKED`` (with an id), or one ``ERROR`` naming the tags that
        were unknown (the frame's other tags are acknowledged) or that failed."""
        many = frame.delivery_tags is not None
        if exc is None and not unknown:
            if frame_id is not None:
                if many:
                    self.reply(frame_id, {"type": "ACKED", "delivery_tags": frame.delivery_tags})
                else:
                    self.reply(frame_id, {"type": "ACKED", "delivery_tag": frame.delivery_tag})
            return
        if exc is None:
            error: BrokerError = UnknownDeliveryTag()
            if many:
                error = UnknownDeliveryTag(
                    f"{len(unknown)} of the {len(frame.tags)} delivery tags are not deliveries"
                    " in flight to this connection; the others are acknowledged"
                )
        elif isinstance(exc, BrokerError):
            error = exc
        else:
            log.error("an ACK failed unexpectedly: %s", type(exc).__name__)
            error = BrokerError("an internal error occurred")
        if many:
            self.error(error, frame_id, delivery_tags=unknown)
        else:
            self.error(error, frame_id, delivery_tag=frame.delivery_tag)

    async def _guarded(self, work: Any, frame_id: str | int | None) -> None:
        try:
            await work
        except BadFrame as exc:
            self._bad_frame(exc)
        except BrokerError as exc:
            extra = {k: v for k, v in exc.extra.items() if k == "delivery_tag"}
            self.error(exc, frame_id, **extra)
        except Exception:
            # A bug must neither kill the reader nor leave a frame with an id unanswered.
            log.exception("a WebSocket frame failed unexpectedly")
            self.error(BrokerError("an internal error occurred"), frame_id)

    async def _subscribe(self, frame: frames.SubscribeFrame, frame_id: str | int | None) -> None:
        sub = await self.engine.subscribe(self, frame.queue, frame.prefetch)
        self.reply(
            frame_id, {"type": "SUBSCRIBED", "queue": frame.queue, "prefetch": frame.prefetch}
        )
        self.engine.activate(sub)

    async def _unsubscribe(
        self, frame: frames.UnsubscribeFrame, frame_id: str | int | None
    ) -> None:
        await self.engine.unsubscribe(self, frame.queue)
        self.reply(frame_id, {"type": "UNSUBSCRIBED", "queue": frame.queue})

    async def _op(self, frame: frames.Frame, frame_id: str | int | None) -> None:
        if isinstance(frame, frames.NackFrame):
            await self._nack(frame, frame_id)
        elif isinstance(frame, frames.PublishFrame):
            await self._publish(frame, frame_id)

    async def _nack(self, frame: frames.NackFrame, frame_id: str | int | None) -> None:
        try:
            outcome = await self.engine.nack(self, frame.delivery_tag, frame.requeue)
        except BrokerError as exc:
            exc.extra["delivery_tag"] = frame.delivery_tag
            raise
        if frame_id is not None:
            self.reply(
                frame_id,
                {"type": "NACKED", "delivery_tag": frame.delivery_tag, "outcome": outcome.value},
            )

    async def _publish(self, frame: frames.PublishFrame, frame_id: str | int | None) -> None:
        publisher = self.services.publisher
        message = frame.to_outgoing()
        if frame.exchange is not None:
            results = await publisher.publish(self.user, frame.exchange, [message])
        else:
            assert frame.queue is not None
            results = await publisher.publish_to_queue(self.user, frame.queue, [message])
        result = results[0]
        self.reply(
            frame_id,
            {
                "type": "PUBLISHED",
                "routed": result.routed,
                "queues": result.queues,
                "message_id": result.message_id,
            },
        )
