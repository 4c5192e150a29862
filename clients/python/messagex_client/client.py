"""An asyncio client for the MessageX WebSocket protocol (``/api/v1/ws``, contract §8).

One WebSocket per :class:`Client`. Every request frame carries an ``id``; the broker answers
each with exactly one frame carrying that id (the success frame, or ``ERROR``), so every
call here awaits that one reply. When the connection drops, the client reconnects with
exponential backoff (full jitter), authenticates again (the upgrade's ``Authorization``
header) and resubscribes every subscription before anything else is sent.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any, Final, Self
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from messagex_client.errors import (
    AuthenticationError,
    BrokerError,
    ClientClosed,
    ConnectionLost,
    Forbidden,
    MessageXError,
    RateLimited,
    StaleDelivery,
    SubscriptionCancelled,
    UnknownDeliveryTag,
    error_from_frame,
)
from messagex_client.topology import Topology, rest_url

log = logging.getLogger("messagex_client")

WS_PATH: Final = "/api/v1/ws"
CLOSE_UNAUTHORIZED: Final = 4401
CLOSE_RATE_LIMITED: Final = 4429
#: Frames can hold a 1 MiB body as base64 plus headers: leave room.
MAX_FRAME_BYTES: Final = 32 * 1024 * 1024
#: the broker takes at most this many tags in one ACK frame
MAX_ACK_TAGS: Final = 1000


def websocket_url(url: str) -> str:
    """``http(s)://host[:port]`` (the broker's base URL) or a ``ws(s)://`` URL → the
    WebSocket endpoint. A URL with a path other than ``/`` is used as it is."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise ValueError(f"not an http(s) or ws(s) URL: {url!r}")
    path = parts.path if parts.path not in ("", "/") else WS_PATH
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


def _authorization(token: str | None, username: str | None, password: str | None) -> str:
    if token is not None:
        if username is not None or password is not None:
            raise ValueError("give either a token or a username and password, not both")
        return f"Bearer {token}"
    if username is None or password is None:
        raise ValueError("give a token, or a username and a password")
    raw = f"{username}:{password}".encode()
    return "Basic " + base64.b64encode(raw).decode("ascii")


@dataclass(frozen=True, slots=True)
class PublishResult:
    """The broker's confirm: the message is committed in every queue listed. ``rejected``:
    queues that matched but refused their copy (full, with ``x-overflow`` reject-publish or
    reject-publish-dlx); ``duplicates``: queues that matched but stored nothing because they
    had this ``message_id`` within their ``x-deduplication-window-seconds`` (contract §15) —
    publish with your own ``message_id`` and a retry after a lost reply is safe."""

    routed: bool
    queues: list[str]
    message_id: str
    rejected: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, reply: dict[str, Any]) -> PublishResult:
        """From the broker's publish result (a ``PUBLISHED`` frame, or ``messagex.publish``'s
        JSON)."""
        return cls(
            routed=bool(reply["routed"]),
            queues=list(reply["queues"]),
            message_id=str(reply["message_id"]),
            rejected=list(reply.get("rejected", [])),
            duplicates=list(reply.get("duplicates", [])),
        )


@dataclass(eq=False, slots=True)
class Message:
    """One delivery. ``body`` is the JSON value, or ``bytes`` for a binary message
    (published with ``body_base64``). Settle it with :meth:`ack` or :meth:`nack`, or ack it
    in your own database transaction with ``ack_in_transaction(conn, message.delivery_tag)``
    (contract §18) — then never also with :meth:`ack` / :meth:`nack` here."""

    queue: str
    exchange: str
    routing_key: str
    body: Any
    headers: dict[str, Any]
    properties: dict[str, Any]
    message_id: str
    delivery_tag: str
    delivery_count: int
    redelivered: bool
    created_at: datetime
    _client: Client = field(repr=False)
    _generation: int = field(repr=False)
    settled: bool = False

    @classmethod
    def _of(cls, client: Client, generation: int, frame: dict[str, Any]) -> Message:
        if "body_base64" in frame:
            body: Any = base64.b64decode(frame["body_base64"])
        else:
            body = frame.get("body")
        return cls(
            queue=frame["queue"],
            exchange=frame.get("exchange", ""),
            routing_key=frame.get("routing_key", ""),
            body=body,
            headers=frame.get("headers") or {},
            properties=frame.get("properties") or {},
            message_id=frame.get("message_id", ""),
            delivery_tag=frame["delivery_tag"],
            delivery_count=int(frame.get("delivery_count", 1)),
            redelivered=bool(frame.get("redelivered", False)),
            created_at=datetime.fromisoformat(frame["created_at"]),
            _client=client,
            _generation=generation,
        )

    async def ack(self) -> None:
        """Acknowledge: the broker deletes the message. Returns once it answered ``ACKED``."""
        await self._settle({"type": "ACK", "delivery_tag": self.delivery_tag})

    async def nack(self, *, requeue: bool = True) -> str:
        """Reject. Returns the outcome: ``requeued``, ``dead_lettered``, ``dead`` or
        ``discarded`` (``requeue=False`` dead-letters when the queue has a DLQ)."""
        reply = await self._settle(
            {"type": "NACK", "delivery_tag": self.delivery_tag, "requeue": requeue}
        )
        return str(reply["outcome"])

    def _stale(self) -> bool:
        """It came on a connection that has closed since (its tag is worthless now)."""
        return self._generation != self._client._generation or not self._client.connected

    async def _settle(self, frame: dict[str, Any]) -> dict[str, Any]:
        client = self._client
        if self._stale():
            raise StaleDelivery(
                "this delivery came on a connection that has closed; the broker redelivers it"
            )
        reply = await client._request(frame)
        self.settled = True
        return reply


class _End:
    """Marks the end of a subscription's stream (unsubscribed or client closed)."""


_END: Final = _End()


class Subscription:
    """Deliveries from one queue, as an async iterator of :class:`Message`.

    ``async with client.subscribe("q", prefetch=10) as messages: async for m in messages``
    subscribes on entry (errors such as ``not_found`` raise there) and unsubscribes on exit;
    iterating without ``async with`` subscribes on the first ``__anext__``. The iterator
    raises :class:`SubscriptionCancelled` when the broker ends the subscription and stops
    after :meth:`cancel` or :meth:`Client.close`.
    """

    def __init__(self, client: Client, queue: str, prefetch: int) -> None:
        if not 1 <= prefetch <= 1000:
            raise ValueError("prefetch must be between 1 and 1000")
        self._client = client
        self.queue = queue
        self.prefetch = prefetch
        self._buffer: asyncio.Queue[Message | BaseException | _End] = asyncio.Queue()
        self._started = False
        self._confirmed = False  # SUBSCRIBED seen: resubscribe after a reconnect
        self._done = False
        #: whether deliveries flow: False while it waits its turn on a queue declared with
        #: ``x-single-active-consumer`` (SUBSCRIBED said so), True once SUBSCRIPTION_ACTIVE
        #: came (always True on other queues)
        self.active = False
        self._active = asyncio.Event()

    async def start(self) -> Self:
        """Send ``SUBSCRIBE`` and wait for ``SUBSCRIBED`` (waiting for a connection first)."""
        if not self._started:
            self._started = True
            try:
                await self._client._subscribe(self)
            except BaseException:
                self._done = True
                raise
        return self

    async def cancel(self) -> None:
        """Unsubscribe. Unsettled deliveries stay yours to settle; buffered ones that were
        not handed out yet are returned to the broker at once (NACK with requeue)."""
        if self._done:
            return
        self._done = True
        await self._client._unsubscribe(self)
        while not self._buffer.empty():
            item = self._buffer.get_nowait()
            if isinstance(item, Message) and not item.settled:
                with contextlib.suppress(MessageXError):
                    await item.nack(requeue=True)
        self._buffer.put_nowait(_END)

    async def wait_active(self) -> None:
        """Return once this subscription is the active one (at once on a queue without a
        single active consumer)."""
        await self._active.wait()

    def _set_active(self, active: bool) -> None:
        self.active = active
        if active:
            self._active.set()
        else:
            self._active.clear()

    def _push(self, item: Message | BaseException | _End) -> None:
        self._buffer.put_nowait(item)

    def _drop_stale(self, generation: int) -> None:
        """The connection closed: buffered deliveries from it will be redelivered."""
        kept = []
        while not self._buffer.empty():
            item = self._buffer.get_nowait()
            if not (isinstance(item, Message) and item._generation == generation):
                kept.append(item)
        for item in kept:
            self._buffer.put_nowait(item)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with contextlib.suppress(MessageXError):
            await self.cancel()

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        if not self._started:
            await self.start()
        while True:
            if self._done and self._buffer.empty():
                raise StopAsyncIteration
            item = await self._buffer.get()
            if isinstance(item, _End):
                self._buffer.put_nowait(item)  # stays ended for every later call
                raise StopAsyncIteration
            if isinstance(item, BaseException):
                self._done = True
                self._buffer.put_nowait(_END)
                raise item
            if item._generation == self._client._generation:
                return item
            # from a connection that has closed: the broker redelivers it; skip


class Client:
    """A MessageX WebSocket client.

    :param url: the broker's base URL (``http://127.0.0.1:8000``) or the WebSocket URL.
    :param token: a session token (``POST /api/v1/auth/login``); or ``username`` and
        ``password`` (HTTP Basic on the upgrade).
    :param reconnect: reconnect after the connection drops (not after bad credentials).
    :param min_backoff: the first reconnect delay in seconds; doubles up to ``max_backoff``.
    :param request_timeout: how long a call waits for its reply (and for a connection).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        username: str | None = None,
        password: str | None = None,
        reconnect: bool = True,
        min_backoff: float = 0.1,
        max_backoff: float = 10.0,
        request_timeout: float = 30.0,
        open_timeout: float = 10.0,
        ping_interval: float | None = 20.0,
    ) -> None:
        self.url = websocket_url(url)
        self._authorization = _authorization(token, username, password)
        self.reconnect = reconnect
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self.request_timeout = request_timeout
        self.open_timeout = open_timeout
        self.ping_interval = ping_interval
        self.connection_id: str | None = None
        self.user: dict[str, Any] | None = None
        self._ws: ClientConnection | None = None
        self._generation = 0
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future[dict[str, Any]], int]] = {}
        self._subs: dict[str, Subscription] = {}
        self._open = asyncio.Event()  # connected and resubscribed (or finally failed)
        self._final: MessageXError | None = None
        self._runner: asyncio.Task[None] | None = None
        self._connected_waiter: asyncio.Future[dict[str, Any]] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        #: how many times the connection was (re)established; 1 after connect()
        self.connections = 0
        #: exchanges and bindings over REST (same broker, same credentials)
        self.topology = Topology(rest_url(self.url), self._authorization, request_timeout)

    # -- public API ------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._open.is_set() and self._final is None

    async def connect(self) -> None:
        """Connect and authenticate. Raises :class:`AuthenticationError`, or
        :class:`ConnectionLost` when the broker cannot be reached (the first connection is
        not retried; later drops are)."""
        if self._final is not None:
            raise self._final
        if self._runner is None:
            first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._runner = asyncio.create_task(self._run(first), name="messagex-client")
            await first
        else:
            await self._wait_open()

    async def close(self) -> None:
        """Close for good: pending calls raise :class:`ClientClosed`, subscriptions end."""
        if self._final is None:
            self._final = ClientClosed("the client was closed")
        self._open.set()  # wake waiters; they see _final
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close(1000, "client closed")
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._runner
        for task in list(self._tasks):
            task.cancel()
        self._fail_pending(self._final)
        for sub in list(self._subs.values()):
            sub._done = True
            sub._push(_END)
        self._subs.clear()

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def publish(
        self,
        exchange: str | None = None,
        body: Any = None,
        *,
        queue: str | None = None,
        routing_key: str = "",
        headers: dict[str, Any] | None = None,
        message_id: str | None = None,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        content_type: str | None = None,
        delay_ms: int = 0,
        mandatory: bool = False,
        priority: int | None = None,
        expiration_ms: int | None = None,
        group_id: str | None = None,
    ) -> PublishResult:
        """Publish with confirm: returns once the broker has committed the message.

        Give ``exchange`` (and a ``routing_key``), or ``queue`` to publish straight into a
        queue (the default exchange). ``body`` is any JSON value, or ``bytes`` for a binary
        payload. Raises :class:`Unroutable` for a ``mandatory`` publish that matched no
        queue, :class:`ConnectionLost` when the connection dropped before the confirm (the
        outcome is then unknown: give a ``message_id`` to de-duplicate a retry).
        ``expiration_ms`` is the message's time to live in each queue it reaches (AMQP's
        ``expiration`` property, sent as its decimal string; the queue's ``x-message-ttl``
        wins when smaller; 0 to 4294967295). ``group_id`` (1-128 characters): in a queue with
        ``x-message-groups``, copies of one group are delivered one at a time, in order.
        """
        if (exchange is None) == (queue is None):
            raise ValueError("give exactly one of exchange and queue")
        frame: dict[str, Any] = {"type": "PUBLISH", "headers": headers or {}, "delay_ms": delay_ms}
        if exchange is not None:
            frame.update(exchange=exchange, routing_key=routing_key, mandatory=mandatory)
        else:
            frame["queue"] = queue
        if isinstance(body, bytes | bytearray | memoryview):
            frame["body_base64"] = base64.b64encode(bytes(body)).decode("ascii")
        else:
            frame["body"] = body
        properties = {
            "message_id": message_id,
            "correlation_id": correlation_id,
            "reply_to": reply_to,
            "content_type": content_type,
            "priority": priority,  # 0-255: claim order in a queue with x-max-priority
            "expiration": None if expiration_ms is None else str(expiration_ms),
            "group_id": group_id,  # one at a time, in order, in a queue with x-message-groups
        }
        frame["properties"] = {k: v for k, v in properties.items() if v is not None}
        return PublishResult.of(await self._call(frame))

    def subscribe(self, queue: str, *, prefetch: int = 1) -> Subscription:
        """A subscription to ``queue`` (started by ``async with``, ``start()`` or iterating)."""
        return Subscription(self, queue, prefetch)

    async def ack_many(self, messages: Sequence[Message]) -> None:
        """Acknowledge several deliveries with one frame each 1,000 (``ACK`` with
        ``delivery_tags``) instead of one round trip per message. Each is settled as if acked
        alone: when some could not be, :class:`UnknownDeliveryTag` is raised with their tags
        in ``error.frame["delivery_tags"]``, and the others are acked (``settled`` tells)."""
        if not self.connected or any(m._stale() for m in messages):
            raise StaleDelivery(
                "a delivery came on a connection that has closed; the broker redelivers it"
            )
        unknown: list[str] = []
        failure: UnknownDeliveryTag | None = None
        for start in range(0, len(messages), MAX_ACK_TAGS):
            chunk = messages[start : start + MAX_ACK_TAGS]
            try:
                await self._request(
                    {"type": "ACK", "delivery_tags": [m.delivery_tag for m in chunk]}
                )
            except UnknownDeliveryTag as exc:
                unknown.extend((exc.frame or {}).get("delivery_tags", ()))
                failure = exc
            missed = set(unknown)
            for m in chunk:
                if m.delivery_tag not in missed:
                    m.settled = True
        if failure is not None:
            raise UnknownDeliveryTag(
                f"{len(unknown)} of {len(messages)} deliveries could not be acked",
                code=failure.code,
                frame={**(failure.frame or {}), "delivery_tags": unknown},
            )

    async def ping(self) -> None:
        """A round trip to the broker (``PING`` → ``PONG``)."""
        await self._call({"type": "PING"})

    # -- requests --------------------------------------------------------------------------

    async def _call(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Wait for a connection (within request_timeout), then send and await the reply."""
        try:
            async with asyncio.timeout(self.request_timeout):
                await self._wait_open()
        except TimeoutError:
            raise ConnectionLost("not connected to the broker", code="timeout") from None
        return await self._request(frame)

    async def _wait_open(self) -> None:
        if self._runner is None and self._final is None:
            await self.connect()  # first use connects
        await self._open.wait()
        if self._final is not None:
            raise self._final

    async def _request(
        self, frame: dict[str, Any], ws: ClientConnection | None = None
    ) -> dict[str, Any]:
        ws = ws or self._ws
        if ws is None:
            raise ConnectionLost("not connected to the broker")
        frame_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[frame_id] = (future, self._generation)
        try:
            try:
                await ws.send(json.dumps({**frame, "id": frame_id}))
            except ConnectionClosed:
                raise ConnectionLost("the connection closed") from None
            async with asyncio.timeout(self.request_timeout):
                return await future
        except TimeoutError:
            raise MessageXError(f"no reply to {frame['type']} in time", code="timeout") from None
        finally:
            self._pending.pop(frame_id, None)

    def _fail_pending(self, error: MessageXError, generation: int | None = None) -> None:
        for frame_id, (future, gen) in list(self._pending.items()):
            if generation is not None and gen != generation:
                continue
            self._pending.pop(frame_id, None)
            if not future.done():
                future.set_exception(error)

    # -- subscriptions ---------------------------------------------------------------------

    async def _subscribe(self, sub: Subscription) -> None:
        if sub.queue in self._subs:
            raise MessageXError(f"already subscribed to {sub.queue!r}", code="already_subscribed")
        self._subs[sub.queue] = sub
        try:
            while True:
                await self._wait_open()
                try:
                    await self._send_subscribe(sub)
                    return
                except ConnectionLost:
                    continue  # try again once reconnected
        except BaseException:
            if self._subs.get(sub.queue) is sub:
                del self._subs[sub.queue]
            raise

    async def _send_subscribe(self, sub: Subscription, ws: ClientConnection | None = None) -> None:
        frame = {"type": "SUBSCRIBE", "queue": sub.queue, "prefetch": sub.prefetch}
        await self._request(frame, ws)
        sub._confirmed = True

    async def _unsubscribe(self, sub: Subscription) -> None:
        try:
            if self.connected and sub._confirmed:
                await self._request({"type": "UNSUBSCRIBE", "queue": sub.queue})
        except (ConnectionLost, ClientClosed):
            pass
        except BrokerError as exc:
            if exc.code != "not_subscribed":
                raise
        finally:
            if self._subs.get(sub.queue) is sub:
                del self._subs[sub.queue]

    # -- the connection's life -------------------------------------------------------------

    async def _run(self, first: asyncio.Future[None]) -> None:
        attempt = 0
        while self._final is None:
            try:
                await self._session(first)
                attempt = 0
            except MessageXError as exc:
                if not first.done():
                    first.set_exception(exc)
                    self._final = exc
                    self._open.set()
                    return
                if isinstance(exc, AuthenticationError | Forbidden) or not self.reconnect:
                    log.error("messagex: giving up: %s", exc)
                    await self._give_up(exc)
                    return
                log.warning("messagex: connection failed: %s", exc)
            if self._final is not None:
                return
            if not self.reconnect:
                await self._give_up(ConnectionLost("the connection closed"))
                return
            ceiling = min(self.max_backoff, self.min_backoff * 2**attempt)
            attempt += 1
            delay = ceiling / 2 + random.uniform(0, ceiling / 2)  # noqa: S311 - jitter, not crypto
            log.info("messagex: reconnecting in %.2f s (attempt %d)", delay, attempt)
            await asyncio.sleep(delay)

    async def _give_up(self, error: MessageXError) -> None:
        self._final = error
        self._open.set()
        self._fail_pending(error)
        for sub in list(self._subs.values()):
            sub._push(error)
        self._subs.clear()

    async def _open_socket(self) -> ClientConnection:
        try:
            return await ws_connect(
                self.url,
                additional_headers={"Authorization": self._authorization},
                open_timeout=self.open_timeout,
                ping_interval=self.ping_interval,
                max_size=MAX_FRAME_BYTES,
                proxy=None,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status == 401:
                raise AuthenticationError("the broker refused the credentials") from None
            if status == 403:
                raise Forbidden("the broker refused this client's Origin") from None
            if status == 429:
                raise RateLimited("too many failed authentications; try again later") from None
            raise ConnectionLost(f"the upgrade was answered with HTTP {status}") from None
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            raise ConnectionLost(f"cannot reach the broker at {self.url}: {exc}") from None

    async def _session(self, first: asyncio.Future[None]) -> None:
        """One connection: open, CONNECTED, resubscribe, then read until it closes."""
        ws = await self._open_socket()
        self._generation += 1
        generation = self._generation
        self._ws = ws
        self._connected_waiter = asyncio.get_running_loop().create_future()
        reader = asyncio.create_task(self._read(ws, generation), name="messagex-reader")
        try:
            async with asyncio.timeout(self.open_timeout):
                connected = await self._connected_waiter
            self.connection_id = connected.get("connection_id")
            self.user = connected.get("user")
            await self._resubscribe(ws)
            self.connections += 1
            self._open.set()
            if not first.done():
                first.set_result(None)
            await asyncio.shield(reader)
        except TimeoutError:
            raise ConnectionLost("no CONNECTED frame from the broker in time") from None
        finally:
            if self._final is None:
                self._open.clear()
            if not reader.done():
                await ws.close()
                with contextlib.suppress(Exception):
                    await reader
            self._ws = None
        if self._final is None:
            self._raise_for_close(ws)

    @staticmethod
    def _raise_for_close(ws: ClientConnection) -> None:
        code = ws.close_code
        if code == CLOSE_UNAUTHORIZED:
            raise AuthenticationError(ws.close_reason or "authentication failed")
        if code == CLOSE_RATE_LIMITED:
            raise RateLimited(ws.close_reason or "too many failed authentications")
        log.warning("messagex: connection closed (code %s); reconnecting", code)

    async def _resubscribe(self, ws: ClientConnection) -> None:
        for sub in list(self._subs.values()):
            if not sub._confirmed or sub._done:
                continue
            try:
                await self._send_subscribe(sub, ws)
            except BrokerError as exc:
                log.warning("messagex: could not resubscribe to %s: %s", sub.queue, exc)
                if self._subs.get(sub.queue) is sub:
                    del self._subs[sub.queue]
                sub._push(SubscriptionCancelled(sub.queue, exc.code))

    async def _read(self, ws: ClientConnection, generation: int) -> None:
        try:
            async for raw in ws:
                try:
                    frame = json.loads(raw)
                except ValueError:
                    log.warning("messagex: a frame that is not JSON was ignored")
                    continue
                if isinstance(frame, dict):
                    self._dispatch(ws, generation, frame)
        except ConnectionClosed:
            pass
        finally:
            lost = ConnectionLost("the connection closed")
            self._fail_pending(lost, generation)
            if self._connected_waiter is not None and not self._connected_waiter.done():
                self._connected_waiter.set_exception(lost)
            for sub in self._subs.values():
                sub._drop_stale(generation)

    def _dispatch(self, ws: ClientConnection, generation: int, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind in ("SUBSCRIBED", "SUBSCRIPTION_ACTIVE"):
            # here, in frame order: a SUBSCRIPTION_ACTIVE may follow SUBSCRIBED at once
            sub = self._subs.get(str(frame.get("queue")))
            if sub is not None:
                sub._set_active(frame.get("active", True) is not False)
        frame_id = frame.get("id")
        pending = self._pending.get(frame_id) if isinstance(frame_id, int) else None
        if pending is not None:
            future = pending[0]
            if not future.done():
                if kind == "ERROR":
                    future.set_exception(error_from_frame(frame))
                else:
                    future.set_result(frame)
            return
        if kind == "CONNECTED":
            if self._connected_waiter is not None and not self._connected_waiter.done():
                self._connected_waiter.set_result(frame)
        elif kind == "MESSAGE_DELIVERED":
            self._deliver(ws, generation, frame)
        elif kind == "SUBSCRIPTION_CANCELLED":
            sub = self._subs.pop(str(frame.get("queue")), None)
            if sub is not None:
                sub._push(SubscriptionCancelled(sub.queue, str(frame.get("reason"))))
        elif kind == "ERROR":
            log.warning("messagex: broker error: %s: %s", frame.get("code"), frame.get("message"))

    def _deliver(self, ws: ClientConnection, generation: int, frame: dict[str, Any]) -> None:
        sub = self._subs.get(str(frame.get("queue")))
        if sub is None or sub._done:
            # Nobody reads this queue any more: hand the delivery back at once.
            self._spawn(
                ws.send(json.dumps({"type": "NACK", "delivery_tag": frame.get("delivery_tag")}))
            )
            return
        sub._push(Message._of(self, generation, frame))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("messagex: background send failed: %s", task.exception())
