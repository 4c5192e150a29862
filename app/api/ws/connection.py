"""One WebSocket connection: authentication, the frame loop, a bounded outbox and its sender.

States: AUTHENTICATING → OPEN → CLOSING, moved only as app.api.ws.lifecycle allows. The
reader parses every frame (``frames.parse``) and hands it to the handler of its type (a
frame type → handler table per state). It never blocks on the database for an ACK/NACK:
ACK frames are batched (app.api.ws.acks, so acks that arrive together settle together),
NACK and PUBLISH run as tasks (app.api.ws.inflight bounds them); the sender drains the
outbox, so a slow socket never blocks dispatch to anyone else and holds no database
connection while it waits.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import orjson
from starlette.websockets import WebSocket, WebSocketDisconnect

from app import serverext
from app.api.codec import render
from app.api.deliveries import delivery_fields
from app.api.problems import error_frame
from app.api.ws import frames, handlers
from app.api.ws.acks import AckBatcher, Done, FrameId
from app.api.ws.inflight import InFlight
from app.api.ws.lifecycle import Lifecycle, State
from app.broker.consumers import Subscription
from app.broker.services import Services
from app.domain.model import Delivery, User
from app.errors import BadFrame, BrokerError
from app.telemetry import Tracing

log = logging.getLogger("messagex.ws")

AUTH_DEADLINE_SECONDS = 10.0
#: before authentication the server answers at most this many frames; the next one closes
#: the connection with 1008 (contract §8: a stranger cannot make the broker hold more)
BEFORE_AUTH_FRAME_LIMIT = 10
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
#: a frame shorter than this that has to wait in the outbox is copied to an exact-size bytes
#: object first: orjson's output of a few dozen bytes pins about 4 KiB (and up to twice its
#: length below this size), which a queue of waiting frames would multiply
EXACT_COPY_BELOW = 128 * 1024
#: the sender writes at most this much at once (at least one frame): a send that waits 30 s
#: is then a peer that read less than this in that time, and the transport's buffer stays
#: small while the outbox holds the rest
SEND_CHUNK_BYTES = 1024 * 1024
#: deliveries of at most this many bytes together may skip the outbox (``_sent_now``)
SEND_NOW_MAX_BYTES = 16 * 1024


class _Close:
    def __init__(self, code: int, reason: str) -> None:
        self.code = code
        self.reason = reason


class Outbox:
    """FIFO of encoded frames. Deliveries are bounded by prefetch credit; replies by the
    reader waiting for room before it reads another frame.

    A frame pushed while the sender waits on the socket (not for the outbox) will wait too:
    a small one is copied to exact size first (``EXACT_COPY_BELOW``). The common case — the
    sender idle in ``take``, which hands frames over in this turn of the event loop — copies
    nothing.
    """

    def __init__(self) -> None:
        self._items: deque[bytes | _Close] = deque()
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        #: the sender is sending (waiting on the socket): what is pushed now waits
        self._sending = False
        #: the bytes of the frames queued
        self.bytes = 0

    def push(self, item: bytes | _Close) -> None:
        if type(item) is bytes:
            if self._sending and len(item) < EXACT_COPY_BELOW:
                item = b"".join((item, b""))  # a new object of exactly len(item) bytes
            self.bytes += len(item)
        self._items.append(item)
        self._ready.set()
        if len(self._items) > OUTBOX_SOFT_LIMIT:
            self._room.clear()

    def idle(self) -> bool:
        """Nothing queued, and the sender is not sending: a frame written past the outbox
        now keeps its order."""
        return not self._items and not self._sending

    async def wait_for_room(self) -> None:
        await self._room.wait()

    async def take(self, max_bytes: int = SEND_CHUNK_BYTES) -> list[bytes | _Close]:
        """The frames queued, in order: all of them, or as many as fit in ``max_bytes``
        (at least one)."""
        self._sending = False
        await self._ready.wait()
        self._sending = True
        queued = self._items
        if self.bytes <= max_bytes:
            items = list(queued)
            queued.clear()
            self.bytes = 0
        else:
            items = []
            taken = 0
            while queued:
                head = queued[0]
                size = len(head) if type(head) is bytes else 0
                if items and taken + size > max_bytes:
                    break
                items.append(queued.popleft())
                taken += size
            self.bytes -= taken
        if not queued:
            self._ready.clear()
        if len(queued) <= OUTBOX_SOFT_LIMIT:
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


def _nothing() -> int:
    return 0


def _delivered_frame(queue: str, item: Delivery, raw_json: bool) -> dict[str, Any]:
    return {"type": "MESSAGE_DELIVERED", **delivery_fields(queue, item, raw_json=raw_json)}


def _traced_ack_soon(
    tracing: Tracing,
    ack_soon: Callable[[Sequence[str], Done], asyncio.Future[Any]],
    tags: Sequence[str],
    done: Done,
) -> asyncio.Future[Any]:
    """``engine.ack_soon`` with an ``ack`` span per settled tag (app.telemetry)."""

    def traced(queue_ids: list[int | None], exc: BaseException | None) -> None:
        if exc is None:
            tracing.settled("ack", [t for t, q in zip(tags, queue_ids, strict=False) if q])
        done(queue_ids, exc)

    return ack_soon(tags, traced)


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
        #: the password hash this connection authenticated with (None: a session token)
        self.password_hash: str | None = None
        #: bytes waiting to be sent (outbox and socket) past which it is handed nothing more
        self.max_buffer = services.settings.max_connection_buffer_bytes
        self._transport_buffered = serverext.write_buffer_size(ws.scope) or _nothing
        self._send_now = serverext.send_now(ws.scope)
        #: the size of its frames, a running average; the largest possible until some are
        #: seen, so that a first claim cannot hand it more than ``max_buffer`` bytes either
        self._frame_size = max(services.settings.max_message_bytes, 1)
        #: deliveries it may be handed now (``Outlet.room``), kept by ``_measure_room``
        self.room = max(1, self.max_buffer // self._frame_size)
        self.life = Lifecycle()  # AUTHENTICATING until opened()
        self.outbox = Outbox()
        self.inbound = Inbound(ws)
        self._bad_frames: deque[float] = deque()
        self.ops = InFlight(MAX_INFLIGHT_OPS)
        settle = partial(self.engine.ack_soon, self)
        if services.tracing is not None:
            settle = partial(_traced_ack_soon, services.tracing, settle)
        self.acks = AckBatcher(settle, self.ops.track, self.send)
        self.client = ws.client.host if ws.client else None
        #: "host:port" of the peer, shown by GET /connections (contract §20)
        self.client_address = f"{ws.client.host}:{ws.client.port}" if ws.client else None

    @property
    def state(self) -> State:
        return self.life.state

    # -- Outlet (what the broker calls) -----------------------------------------------------

    def deliver(self, subscription: Subscription, items: Sequence[Delivery]) -> None:
        if not items:
            self._measure_room()
            return
        queue = subscription.queue_name
        # codec.render: orjson with stored bodies spliced in, or the stdlib when headers hold
        # what orjson cannot write (an integer beyond 64 bits) — never an exception here,
        # which would strand claimed deliveries.
        rendered = [render(partial(_delivered_frame, queue, item)) for item in items]
        size = sum(map(len, rendered))
        self._frame_size = (self._frame_size + size // len(items)) // 2 + 1
        if not self._sent_now(rendered, size):
            outbox = self.outbox
            for frame in rendered:
                outbox.push(frame)
        if self.services.tracing is not None:
            self.services.tracing.delivered(queue, items)
        self._measure_room()

    def _sent_now(self, frames: list[bytes], size: int) -> bool:
        """Write a few small frames straight to the socket when nothing is queued before
        them and the sender is idle (a consumer that gets one delivery at a time then costs
        no wake-up of the sender per frame); only while room stays for one more frame after
        them, so that no resume (which the sender gives) is needed. False: queue them."""
        send_now = self._send_now
        return (
            send_now is not None
            and size <= SEND_NOW_MAX_BYTES
            and self.outbox.idle()
            and self.life.state is State.OPEN
            and self.waiting() + size + self._frame_size <= self.max_buffer
            and send_now(frames)
        )

    def waiting(self) -> int:
        """Bytes waiting to be sent: the outbox's and the socket's write buffer's."""
        return self.outbox.bytes + self._transport_buffered()

    def _measure_room(self) -> int:
        """Set ``room``: how many frames of the usual size fit under ``max_buffer``, beside
        what waits. Returns the room it had before."""
        had = self.room
        waiting = self.waiting()
        if not waiting:
            # nothing waits: at least one, however large its frames (a message may be
            # larger than the buffer limit)
            self.room = max(1, self.max_buffer // self._frame_size)
        elif waiting < self.max_buffer:
            self.room = (self.max_buffer - waiting) // self._frame_size
        else:
            self.room = 0
        return had

    def cancel(self, queue: str, reason: str) -> None:
        self.send({"type": "SUBSCRIPTION_CANCELLED", "queue": queue, "reason": reason})

    def activated(self, queue: str) -> None:
        self.send({"type": "SUBSCRIPTION_ACTIVE", "queue": queue})

    def close(self, code: int, reason: str) -> None:
        """Send a close frame after what is queued; once (a second close is a no-op)."""
        if self.state is not State.CLOSING and self.life.move(State.CLOSING):
            self.outbox.push(_Close(code, reason))

    # -- sending ----------------------------------------------------------------------------

    def send(self, frame: dict[str, Any]) -> None:
        self.outbox.push(orjson.dumps(frame))

    def reply(self, frame_id: FrameId, frame: dict[str, Any]) -> None:
        if frame_id is not None:
            frame["id"] = frame_id
        self.send(frame)

    def error(self, exc: BrokerError, frame_id: FrameId = None, **fields: Any) -> None:
        self.send(error_frame(exc, frame_id, **fields))

    async def _sender(self) -> None:
        try:
            await self._send_loop()
        except asyncio.CancelledError:
            return  # run() ends the sender by cancelling it: see _reader

    async def _send_loop(self) -> None:
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
                if not self._measure_room() and self.room:
                    self.engine.resume(self)  # it read what waited: hand it more
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
            try:
                # ACK/NACK/PUBLISH frames read before the close still take effect (an ACK sent
                # just before closing must not become a redelivery); bounded, then cancelled.
                self.acks.flush()
                await self.ops.drain(OPS_GRACE_SECONDS)
                if self.state is not State.AUTHENTICATING or self.user is not None:
                    try:
                        await self.engine.disconnect(self)
                    except BrokerError:
                        log.warning("release on disconnect failed; ack timeouts will release")
            finally:
                # The ACK batcher holds this connection's bound methods: let it go, so that
                # the connection is freed by reference counting once its handler returns.
                self.acks.detach()

    async def _reader(self) -> None:
        try:
            if self.state is State.AUTHENTICATING:
                async with asyncio.timeout(AUTH_DEADLINE_SECONDS):
                    await self._authenticate()
                if not self.is_open():
                    return
            table = handlers.HANDLERS
            while True:
                await self.outbox.wait_for_room()
                data = await self.inbound.next()
                if data is None:
                    return
                try:
                    frame, frame_id = frames.parse(data)
                except BadFrame as exc:
                    self.bad_frame(exc)
                    continue
                await table[type(frame)](self, frame, frame_id)
        except TimeoutError:
            self.close(4401, "authentication timed out")
        except WebSocketDisconnect:
            return
        except asyncio.CancelledError:
            # run() ends the reader and the sender by cancelling them, and waits for them.
            # Returning instead of raising leaves no CancelledError on the task: its
            # traceback holds this frame (so this connection) and the timeout's reference to
            # the task, a cycle only the cyclic collector would free.
            return

    def is_open(self) -> bool:
        return self.state is State.OPEN

    def opened(self) -> None:
        """Authenticated (by the AUTH frame, or by the upgrade request's header): OPEN."""
        if self.life.move(State.OPEN):
            self.engine.connect(self, self.digest)

    async def _authenticate(self) -> None:
        answered = 0
        while self.state is State.AUTHENTICATING:
            data = await self.inbound.next()
            if data is None:
                return
            if answered >= BEFORE_AUTH_FRAME_LIMIT:
                self.close(1008, "too many frames before authentication")
                return
            answered += 1
            try:
                frame, frame_id = frames.parse(data)
            except BadFrame as exc:
                self.bad_frame(exc)
                continue
            await handlers.BEFORE_AUTH.get(type(frame), handlers.not_authenticated)(
                self, frame, frame_id
            )

    def connected_frame(self) -> dict[str, Any]:
        return {
            "type": "CONNECTED",
            "connection_id": self.id,
            "user": {"username": self.user.username, "role": self.user.role.value},
        }

    def bad_frame(self, exc: BadFrame) -> None:
        frame_id = exc.extra.get("frame_id")
        self.error(exc, frame_id)
        now = time.monotonic()
        self._bad_frames.append(now)
        while self._bad_frames and now - self._bad_frames[0] > BAD_FRAME_WINDOW_SECONDS:
            self._bad_frames.popleft()
        if len(self._bad_frames) > BAD_FRAME_LIMIT:
            self.close(1008, "too many bad frames")
