"""A Kombu transport for MessageX, so that Celery (and any Kombu program) can use it as its
broker: ``broker_url = "messagex://user:password@host:8000/"``.

Importing this module registers the ``messagex`` URL scheme in
``kombu.transport.TRANSPORT_ALIASES``; Kombu has no entry point for transports, so the
Celery app module does ``import messagex_client.kombu_transport`` once (see docs/clients.md).
Needs the extra ``messagex-client[celery]`` (Kombu, httpx).

How Kombu maps onto MessageX:

* exchanges, queues and bindings are MessageX's own (REST, §4 to §6); Kombu never routes in
  process: a publish goes to ``POST /exchanges/{x}/publish`` with the routing key (or to the
  queue for the nameless exchange), so fanout (Celery's pidbox), topic (events) and headers
  exchanges route in the broker, for every client alike;
* consuming is push over one WebSocket per Kombu connection (§8): ``SUBSCRIBE`` with the
  channel's prefetch, ``MESSAGE_DELIVERED`` → the Kombu callback;
* acknowledgement is late: a delivery stays in flight in MessageX until Kombu's
  ``basic_ack`` (→ ``ACK``) or ``basic_reject`` (→ ``NACK`` with ``requeue``); a worker that
  dies loses its WebSocket and MessageX hands its unsettled deliveries to another consumer
  at once (§10); a hung one loses them after the queue's ack timeout;
* Celery's ``eta``/``countdown`` header → ``delay_ms`` (the broker holds the message until
  it is due, capped at 7 days; later than that Celery's own timer does the rest);
* the body travels as ``body_base64`` (byte-exact); Kombu's headers are MessageX headers; its
  ``correlation_id``, ``reply_to``, ``content_type``, ``priority`` and ``expiration`` are
  MessageX properties; the rest of Kombu's properties ride in the ``x-kombu`` header;
* names MessageX refuses (Celery's ``celery@host.celery.pidbox``) are escaped: every
  character outside ``A-Z a-z 0-9 _ . : -`` becomes ``_xHH``;
* queues declared ``auto_delete`` or ``exclusive`` are deleted when their channel closes
  (MessageX has no such queues); a killed process leaves them, and Celery's reply queues
  carry ``x-expires``, which MessageX honours.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import time
import uuid
from collections import deque
from datetime import UTC, datetime
from queue import Empty
from typing import Any
from urllib.parse import quote

import httpx
from amqp.protocol import queue_declare_ok_t
from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, virtual
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.sync.client import ClientConnection, connect

logger = logging.getLogger(__name__)

#: MessageX's longest ``delay_ms`` (7 days).
MAX_DELAY_MS = 604_800_000
#: Ack timeout given to the queues this transport declares, unless the transport option
#: ``ack_timeout_seconds`` says otherwise: Kombu's Redis/SQS visibility timeout (1 hour), so a
#: long task with ``acks_late`` is not handed to a second worker while it runs.
DEFAULT_ACK_TIMEOUT_SECONDS = 3600
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,254}")
_BAD_CHAR = re.compile(r"[^A-Za-z0-9_.:-]")
#: Kombu properties that are MessageX properties of the same meaning.
_MX_PROPERTIES = ("correlation_id", "reply_to", "priority", "expiration")
#: Kombu's per-delivery properties, made again on each delivery.
_LOCAL_PROPERTIES = ("delivery_info", "delivery_tag", "body_encoding")


def mx_name(name: str) -> str:
    """A Kombu exchange or queue name as a valid MessageX name (unchanged when it is one)."""
    if _NAME.fullmatch(name):
        return name
    escaped = _BAD_CHAR.sub(lambda m: "".join(f"_x{b:02x}" for b in m.group().encode()), name)
    if not escaped[:1].isalnum():
        escaped = "q" + escaped
    return escaped[:255]


def delay_ms_for(headers: dict[str, Any] | None, now: float | None = None) -> int:
    """Milliseconds until Celery's ``eta`` header (ISO 8601), 0 when absent or past."""
    eta = (headers or {}).get("eta")
    if not eta or not isinstance(eta, str):
        return 0
    try:
        due = datetime.fromisoformat(eta)
    except ValueError:
        return 0
    if due.tzinfo is None:
        due = due.replace(tzinfo=UTC)  # Celery's naive eta is UTC (enable_utc, the default)
    current = time.time() if now is None else now
    return max(0, min(MAX_DELAY_MS, int((due.timestamp() - current) * 1000)))


class MessageXChannelError(ChannelError):  # type: ignore[misc]
    """The broker refused a request (problem+json ``code`` and ``detail``)."""


def _raise_for(response: httpx.Response, what: str) -> None:
    if response.is_success:
        return
    try:
        problem = response.json()
        code, detail = problem.get("code", ""), problem.get("detail", "")
    except ValueError:
        code, detail = "", response.reason_phrase
    raise MessageXChannelError(f"{what}: {response.status_code} {code}: {detail}")


class QoS(virtual.QoS):
    """Settlement goes to the broker: ack → ``ACK``, reject → ``NACK``; nothing is restored by
    republishing (MessageX keeps the unsettled delivery and redelivers it itself)."""

    def ack(self, delivery_tag: str) -> None:
        self.channel.connection.settle(delivery_tag, ack=True)
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        self.channel.connection.settle(delivery_tag, ack=False, requeue=requeue)
        self._quick_ack(delivery_tag)

    def restore_unacked(self) -> list[Any]:
        self._flush()
        transport = self.channel.connection
        while self._delivered:
            tag, _ = self._delivered.popitem()
            if transport is not None:
                try:
                    transport.settle(tag, ack=False, requeue=True)
                except Exception:
                    logger.debug("could not requeue %s", tag)
        return []


class Channel(virtual.Channel):
    """Kombu's channel calls, each one a MessageX REST call (or a WebSocket frame)."""

    QoS = QoS
    supports_fanout = True
    do_restore = True

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self._temporary: set[str] = set()
        self._no_ack: set[str] = set()

    @property
    def rest(self) -> httpx.Client:
        return self.connection.rest  # type: ignore[no-any-return]

    # -- topology ---------------------------------------------------------------------------

    def exchange_declare(
        self,
        exchange: str | None = None,
        type: str = "direct",
        durable: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        nowait: bool = False,
        passive: bool = False,
    ) -> None:
        if not exchange or exchange.startswith("amq."):
            return  # the nameless exchange and the built-ins always exist
        name = mx_name(exchange)
        if passive:
            _raise_for(self.rest.get(f"/exchanges/{name}"), f"exchange {exchange!r}")
            return
        body = {"type": type or "direct", "durable": durable, "auto_delete": auto_delete}
        if arguments:
            body["arguments"] = arguments
        _raise_for(self.rest.put(f"/exchanges/{name}", json=body), f"exchange {exchange!r}")

    def exchange_delete(self, exchange: str, if_unused: bool = False, nowait: bool = False) -> None:
        params = {"if_unused": "true"} if if_unused else {}
        response = self.rest.delete(f"/exchanges/{mx_name(exchange)}", params=params)
        if response.status_code != 404:
            _raise_for(response, f"exchange {exchange!r}")

    def queue_declare(
        self, queue: str | None = None, passive: bool = False, **kwargs: Any
    ) -> queue_declare_ok_t:
        queue = queue or f"gen-{uuid.uuid4()}"
        name = mx_name(queue)
        if passive:
            response = self.rest.get(f"/queues/{name}")
            _raise_for(response, f"queue {queue!r}")
        else:
            timeout = self.connection.client.transport_options.get(
                "ack_timeout_seconds", DEFAULT_ACK_TIMEOUT_SECONDS
            )
            body: dict[str, Any] = {
                "durable": bool(kwargs.get("durable", True)),
                "ack_timeout_seconds": timeout,
            }
            if kwargs.get("arguments"):
                body["arguments"] = kwargs["arguments"]
            response = self.rest.put(f"/queues/{name}", json=body)
            _raise_for(response, f"queue {queue!r}")
            if kwargs.get("auto_delete") or kwargs.get("exclusive"):
                self._temporary.add(queue)
        stats = response.json().get("stats") or {}
        return queue_declare_ok_t(queue, stats.get("ready", 0), stats.get("consumers", 0))

    def queue_bind(
        self,
        queue: str,
        exchange: str | None = None,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not exchange:
            return  # the nameless exchange routes by queue name
        body = {
            "exchange": mx_name(exchange),
            "queue": mx_name(queue),
            "routing_key": routing_key or "",
            "arguments": arguments or {},
        }
        _raise_for(self.rest.post("/bindings", json=body), f"binding {exchange!r} → {queue!r}")

    def queue_unbind(
        self,
        queue: str,
        exchange: str | None = None,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not exchange:
            return
        params: dict[str, str | int] = {
            "exchange": mx_name(exchange),
            "queue": mx_name(queue),
            "limit": 1000,
        }
        response = self.rest.get("/bindings", params=params)
        _raise_for(response, "bindings")
        for binding in response.json()["items"]:
            if binding["routing_key"] == (routing_key or "") and binding["arguments"] == (
                arguments or {}
            ):
                self.rest.delete(f"/bindings/{binding['id']}")

    def queue_delete(
        self, queue: str, if_unused: bool = False, if_empty: bool = False, **kwargs: Any
    ) -> int:
        params = {k: "true" for k, v in (("if_unused", if_unused), ("if_empty", if_empty)) if v}
        response = self.rest.delete(f"/queues/{mx_name(queue)}", params=params)
        if response.status_code not in (404, 409):  # gone already; in use or not empty: kept
            _raise_for(response, f"queue {queue!r}")
        self._temporary.discard(queue)
        return 0

    def _purge(self, queue: str) -> int:
        response = self.rest.post(f"/queues/{mx_name(queue)}/purge")
        _raise_for(response, f"queue {queue!r}")
        return int(response.json()["purged"])

    def _size(self, queue: str) -> int:
        response = self.rest.get(f"/queues/{mx_name(queue)}")
        _raise_for(response, f"queue {queue!r}")
        return int(response.json()["stats"]["ready"])

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return self.rest.get(f"/queues/{mx_name(queue)}").status_code == 200

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        self.queue_declare(queue, **kwargs)

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        self.queue_delete(queue)

    # -- publishing -------------------------------------------------------------------------

    def basic_publish(
        self, message: dict[str, Any], exchange: str, routing_key: str, **kwargs: Any
    ) -> None:
        self.connection.publish(message, exchange, routing_key, bool(kwargs.get("mandatory")))

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        self.connection.publish(message, "", queue, False)

    # -- consuming --------------------------------------------------------------------------

    def basic_consume(
        self, queue: str, no_ack: bool, callback: Any, consumer_tag: str, **kwargs: Any
    ) -> str:
        super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)
        if no_ack:
            self._no_ack.add(queue)
        self.connection.subscribe(queue, self._prefetch(), no_ack=no_ack)
        return consumer_tag

    def basic_cancel(self, consumer_tag: str) -> None:
        queue = self._tag_to_queue.get(consumer_tag)
        super().basic_cancel(consumer_tag)
        if queue is not None and self.connection is not None:
            self.connection.unsubscribe(queue)

    def basic_qos(
        self, prefetch_size: int = 0, prefetch_count: int = 0, apply_global: bool = False
    ) -> None:
        changed = prefetch_count != self.qos.prefetch_count
        super().basic_qos(prefetch_size, prefetch_count, apply_global)
        if changed:
            for queue in set(self._tag_to_queue.values()):
                self.connection.subscribe(queue, self._prefetch(), no_ack=queue in self._no_ack)

    def _prefetch(self) -> int:
        count = int(self.qos.prefetch_count or 0)
        return max(1, min(1000, count)) if count else 100

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        """``basic_get``: one pull (§9), settled over REST."""
        response = self.rest.post(
            f"/queues/{mx_name(queue)}/get", json={"max_messages": 1, "wait_ms": 0}
        )
        _raise_for(response, f"queue {queue!r}")
        messages = response.json()["messages"]
        if not messages:
            raise Empty()
        self.connection.pulled.add(messages[0]["delivery_tag"])
        return to_kombu(messages[0])

    def close(self) -> None:
        transport = self.connection
        super().close()
        if transport is not None:
            for queue in list(self._temporary):
                try:
                    transport.rest.delete(f"/queues/{mx_name(queue)}", params={"if_unused": "true"})
                except httpx.HTTPError:
                    logger.debug("could not delete %s", queue)
            self._temporary.clear()


def to_messagex(message: dict[str, Any], routing_key: str, mandatory: bool) -> dict[str, Any]:
    """A Kombu message (``prepare_message``'s dict) → a MessageX publish body (§7)."""
    body = message.get("body") or b""
    encoding = message.get("content-encoding") or "utf-8"
    if isinstance(body, str):
        body = body.encode(encoding if encoding != "binary" else "latin-1")
    props = dict(message.get("properties") or {})
    for key in _LOCAL_PROPERTIES:
        props.pop(key, None)
    properties: dict[str, Any] = {}
    if message.get("content-type"):
        properties["content_type"] = message["content-type"]
    for key in _MX_PROPERTIES:
        value = props.pop(key, None)
        if value is not None and value != "":
            properties[key] = str(value) if key == "expiration" else value
    headers = dict(message.get("headers") or {})
    extra = {"content-encoding": message.get("content-encoding"), "properties": props}
    headers["x-kombu"] = extra
    publish: dict[str, Any] = {
        "routing_key": routing_key or "",
        "body_base64": base64.b64encode(body).decode("ascii"),
        # Kombu's headers may hold values JSON cannot (a datetime): sent as their str().
        "headers": json.loads(json.dumps(headers, default=str)),
        "properties": properties,
        "delay_ms": delay_ms_for(headers),
    }
    if mandatory:
        publish["mandatory"] = True
    return publish


def to_kombu(delivery: dict[str, Any]) -> dict[str, Any]:
    """A MessageX delivery (``MESSAGE_DELIVERED`` / a pulled message) → Kombu's raw message."""
    headers = dict(delivery.get("headers") or {})
    extra = headers.pop("x-kombu", None) or {}
    properties = dict(extra.get("properties") or {})
    mx_props = delivery.get("properties") or {}
    for key in _MX_PROPERTIES:
        if key in mx_props:
            properties[key] = mx_props[key]
    if "body_base64" in delivery:
        body: bytes = base64.b64decode(delivery["body_base64"])
    else:  # published by another client as JSON
        body = json.dumps(delivery.get("body")).encode()
    properties["delivery_tag"] = delivery["delivery_tag"]
    properties["delivery_info"] = {
        "exchange": delivery.get("exchange") or "",
        "routing_key": delivery.get("routing_key") or "",
        "redelivered": bool(delivery.get("redelivered")),
    }
    properties.pop("body_encoding", None)
    return {
        "body": body,
        "content-type": mx_props.get("content_type") or "application/json",
        "content-encoding": extra.get("content-encoding") or "utf-8",
        "headers": headers,
        "properties": properties,
    }


class Transport(virtual.Transport):
    """``messagex://user:password@host:port/`` (with Celery's ``broker_use_ssl``: HTTPS/WSS).

    Transport options (Celery: ``broker_transport_options``): ``ack_timeout_seconds`` for the
    queues it declares (default 3600), ``timeout`` for REST calls (default 30 s).
    """

    Channel = Channel
    driver_type = "messagex"
    driver_name = "httpx"
    default_port = 8000  # type: ignore[assignment]
    polling_interval = None  # type: ignore[assignment]

    implements = virtual.Transport.implements.extend(
        asynchronous=False,
        exchange_type=frozenset(["direct", "topic", "fanout", "headers"]),
        heartbeats=False,
    )
    connection_errors = (  # type: ignore[assignment]
        *virtual.Transport.connection_errors,
        ConnectionError,
        OSError,
        httpx.TransportError,
        WebSocketException,
    )
    channel_errors = (  # type: ignore[assignment]
        *virtual.Transport.channel_errors,
        MessageXChannelError,
    )

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        host = client.hostname or "127.0.0.1"
        port = client.port or self.default_port
        scheme = "https" if client.ssl else "http"
        self.base = f"{scheme}://{host}:{port}"
        auth = (client.userid or "guest", client.password or "guest")
        self.authorization = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
        timeout = client.transport_options.get("timeout", 30.0)
        self.rest = httpx.Client(base_url=f"{self.base}/api/v1", auth=auth, timeout=timeout)
        self._ws: ClientConnection | None = None
        self._subscriptions: dict[str, str] = {}  # MessageX queue → Kombu queue
        self._pending: deque[dict[str, Any]] = deque()
        self._replies: dict[str, dict[str, Any]] = {}
        self._ids = 0
        #: tags of deliveries pulled over REST (``basic_get``), settled over REST
        self.pulled: set[str] = set()

    # -- REST -------------------------------------------------------------------------------

    def publish(
        self, message: dict[str, Any], exchange: str, routing_key: str, mandatory: bool
    ) -> None:
        body = to_messagex(message, routing_key, mandatory)
        if exchange:
            path = f"/exchanges/{quote(mx_name(exchange))}/publish"
        else:
            path = f"/queues/{quote(mx_name(routing_key))}/messages"
            body.pop("mandatory", None)
        _raise_for(self.rest.post(path, json=body), f"publish to {exchange or routing_key!r}")

    # -- WebSocket --------------------------------------------------------------------------

    def _socket(self) -> ClientConnection:
        if self._ws is None:
            url = self.base.replace("http", "ws", 1) + "/api/v1/ws"
            # Entered by hand: the connection lives as long as this transport (closed in
            # close_connection / on loss), not a ``with`` block.
            ws = connect(
                url,
                additional_headers={"Authorization": self.authorization},
                open_timeout=10,
                max_size=None,
            ).__enter__()
            frame = json.loads(ws.recv(timeout=10))
            if frame.get("type") != "CONNECTED":
                ws.close()
                raise ConnectionError(f"MessageX refused the WebSocket: {frame}")
            self._ws = ws
        return self._ws

    def _send(self, frame: dict[str, Any]) -> None:
        try:
            self._socket().send(json.dumps(frame))
        except ConnectionClosed as exc:
            self._lost()
            raise ConnectionError("MessageX WebSocket closed") from exc

    def _call(self, frame: dict[str, Any]) -> dict[str, Any]:
        self._ids += 1
        frame_id = f"k{self._ids}"
        self._send({**frame, "id": frame_id})
        deadline = time.monotonic() + 30
        while frame_id not in self._replies:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectionError(f"no reply from MessageX to {frame['type']}")
            self._read(remaining)
        reply = self._replies.pop(frame_id)
        if reply.get("type") == "ERROR":
            raise MessageXChannelError(
                f"{frame['type']}: {reply.get('code')}: {reply.get('message')}"
            )
        return reply

    def _read(self, timeout: float) -> None:
        """Read one frame (or time out): deliveries queue up, replies are filed by id."""
        ws = self._socket()
        try:
            raw = ws.recv(timeout=timeout)
        except TimeoutError:
            return
        except ConnectionClosed as exc:
            self._lost()
            raise ConnectionError("MessageX WebSocket closed") from exc
        frame = json.loads(raw)
        kind = frame.get("type")
        if kind == "MESSAGE_DELIVERED":
            self._pending.append(frame)
        elif frame.get("id") is not None:
            self._replies[str(frame["id"])] = frame
        elif kind == "SUBSCRIPTION_CANCELLED":
            logger.warning(
                "MessageX cancelled the subscription to %s: %s",
                frame.get("queue"),
                frame.get("reason"),
            )
            self._subscriptions.pop(frame.get("queue", ""), None)
        elif kind == "ERROR":
            logger.warning("MessageX: %s: %s", frame.get("code"), frame.get("message"))

    def _lost(self) -> None:
        ws, self._ws = self._ws, None
        self._subscriptions.clear()
        self._pending.clear()
        if ws is not None:
            ws.close()

    def subscribe(self, queue: str, prefetch: int, *, no_ack: bool = False) -> None:
        name = mx_name(queue)
        if name in self._subscriptions:
            self._call({"type": "UNSUBSCRIBE", "queue": name})
        self._call({"type": "SUBSCRIBE", "queue": name, "prefetch": prefetch})
        self._subscriptions[name] = queue

    def unsubscribe(self, queue: str) -> None:
        name = mx_name(queue)
        if self._subscriptions.pop(name, None) is not None and self._ws is not None:
            try:
                self._call({"type": "UNSUBSCRIBE", "queue": name})
            except (ConnectionError, MessageXChannelError):
                logger.debug("unsubscribe from %s failed", queue)

    def settle(self, delivery_tag: str, *, ack: bool, requeue: bool = True) -> None:
        if delivery_tag in self.pulled:
            self.pulled.discard(delivery_tag)
            if ack:
                response = self.rest.post(f"/deliveries/{delivery_tag}/ack")
            else:
                response = self.rest.post(
                    f"/deliveries/{delivery_tag}/nack", json={"requeue": requeue}
                )
            _raise_for(response, "settle")
        elif self._ws is not None:
            if ack:
                self._send({"type": "ACK", "delivery_tag": delivery_tag})
            else:
                self._send({"type": "NACK", "delivery_tag": delivery_tag, "requeue": requeue})

    def drain_events(self, connection: Any, timeout: float | None = None) -> None:  # type: ignore[override]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._pending:
                frame = self._pending.popleft()
                queue = self._subscriptions.get(frame["queue"])
                if queue is None:  # unsubscribed meanwhile: back to the queue
                    self.settle(frame["delivery_tag"], ack=False, requeue=True)
                    continue
                self._deliver(to_kombu(frame), queue)
                return
            remaining = 1.0 if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError()
            if self._ws is None or not self._subscriptions:
                time.sleep(min(remaining, 0.1))
                continue
            self._read(remaining)

    def _deliver(self, message: dict[str, Any], queue: str) -> None:
        channel = next((c for c in self.channels if queue in c._no_ack), None)
        if channel is not None:
            self.settle(message["properties"]["delivery_tag"], ack=True)
        super()._deliver(message, queue)

    def close_connection(self, connection: Any) -> None:
        try:
            super().close_connection(connection)
        finally:
            ws, self._ws = self._ws, None
            if ws is not None:
                ws.close()
            self.rest.close()

    def verify_connection(self, connection: Any) -> bool:
        # Kombu asks before each drain: no I/O here; a lost socket raises from drain_events.
        return not self.rest.is_closed

    @property
    def default_connection_params(self) -> dict[str, Any]:
        return {"port": self.default_port, "hostname": "127.0.0.1"}


TRANSPORT_ALIASES.setdefault("messagex", "messagex_client.kombu_transport:Transport")
