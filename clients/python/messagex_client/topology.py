"""Queues, exchanges and bindings over the broker's REST API (contract §4-§6, §13, §14):
declare a queue with its §13 arguments, declare an exchange (with its alternate exchange),
bind a queue or another exchange, list and delete
bindings. The standard library's HTTP client, run in a thread: no dependency beyond the
WebSocket client's. Errors are the client's :class:`~messagex_client.errors.BrokerError`
classes, by the problem's ``code``.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

from messagex_client.errors import BrokerError, error_from_frame
from messagex_client.message_ops import MessageOperations

ExchangeType = Literal["direct", "fanout", "topic", "headers"]
Overflow = Literal["drop-head", "reject-publish", "reject-publish-dlx"]

#: The exchange argument naming its alternate exchange (RabbitMQ's name).
ALTERNATE_EXCHANGE = "alternate-exchange"


@dataclass(frozen=True, slots=True)
class Binding:
    """A binding from ``exchange`` to a queue or to another exchange (exactly one of
    ``queue`` and ``destination_exchange`` is set)."""

    id: int
    exchange: str
    queue: str | None
    destination_exchange: str | None
    routing_key: str
    arguments: dict[str, Any]

    @classmethod
    def of(cls, item: dict[str, Any]) -> Binding:
        return cls(
            id=int(item["id"]),
            exchange=item["exchange"],
            queue=item.get("queue"),
            destination_exchange=item.get("destination_exchange"),
            routing_key=item["routing_key"],
            arguments=item["arguments"],
        )


def rest_url(websocket: str) -> str:
    """The REST root (``…/api/v1``) of the broker whose WebSocket URL is ``websocket``."""
    parts = urlsplit(websocket)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    path = parts.path.removesuffix("/ws") or "/api/v1"
    return urlunsplit((scheme, parts.netloc, path, "", ""))


class Topology(MessageOperations):
    """REST calls for exchanges and bindings (and, from ``MessageOperations``, for messages
    by filter); ``Client.topology`` is one."""

    def __init__(self, root: str, authorization: str, timeout: float = 30.0) -> None:
        if urlsplit(root).scheme not in ("http", "https"):
            raise ValueError(f"not an http(s) URL: {root!r}")
        self.root = root.rstrip("/")
        self._authorization = authorization
        self.timeout = timeout

    async def declare_exchange(
        self,
        name: str,
        type: ExchangeType,
        *,
        durable: bool = True,
        auto_delete: bool = False,
        alternate_exchange: str | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``PUT /exchanges/{name}``: the exchange (created, or identical already).
        ``alternate_exchange`` names an existing exchange that gets the messages this one
        routes to no queue (``arguments["alternate-exchange"]``; NotFound when missing)."""
        args = dict(arguments or {})
        if alternate_exchange is not None:
            args[ALTERNATE_EXCHANGE] = alternate_exchange
        body = {"type": type, "durable": durable, "auto_delete": auto_delete, "arguments": args}
        result: dict[str, Any] = await self._call("PUT", f"/exchanges/{quote(name, safe='')}", body)
        return result

    async def declare_queue(
        self,
        name: str,
        *,
        durable: bool = True,
        max_delivery_count: int | None = None,
        dead_letter_queue: str | None = None,
        ack_timeout_seconds: int | None = None,
        message_ttl_ms: int | None = None,
        expires_ms: int | None = None,
        max_length: int | None = None,
        max_length_bytes: int | None = None,
        overflow: Overflow | None = None,
        max_priority: int | None = None,
        single_active_consumer: bool | None = None,
        message_groups: bool | None = None,
        dead_letter_exchange: str | None = None,
        dead_letter_routing_key: str | None = None,
        dedup_window_seconds: int | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``PUT /queues/{name}``: the queue with its stats (created, or identical already).
        The keyword arguments after ``ack_timeout_seconds`` are contract §13's queue
        arguments under their RabbitMQ names (``message_ttl_ms`` → ``x-message-ttl``,
        ``max_priority`` → ``x-max-priority``, …) and §15's ``dedup_window_seconds`` →
        ``x-deduplication-window-seconds`` (1-86400); ``None`` leaves one out. A wrong one is a
        BrokerError with code ``validation_error`` naming it; a different re-declaration,
        ``precondition_failed``."""
        args = dict(arguments or {})
        for key, value in (
            ("x-message-ttl", message_ttl_ms),
            ("x-expires", expires_ms),
            ("x-max-length", max_length),
            ("x-max-length-bytes", max_length_bytes),
            ("x-overflow", overflow),
            ("x-max-priority", max_priority),
            ("x-single-active-consumer", single_active_consumer),
            ("x-message-groups", message_groups),
            ("x-dead-letter-exchange", dead_letter_exchange),
            ("x-dead-letter-routing-key", dead_letter_routing_key),
            ("x-deduplication-window-seconds", dedup_window_seconds),
        ):
            if value is not None:
                args[key] = value
        body = {
            "durable": durable,
            "max_delivery_count": max_delivery_count,
            "dead_letter_queue": dead_letter_queue,
            "ack_timeout_seconds": ack_timeout_seconds,
            "arguments": args,
        }
        result: dict[str, Any] = await self._call("PUT", f"/queues/{quote(name, safe='')}", body)
        return result

    async def delete_queue(
        self, name: str, *, if_empty: bool = False, if_unused: bool = False
    ) -> None:
        query = {k: "true" for k, on in (("if_empty", if_empty), ("if_unused", if_unused)) if on}
        await self._call("DELETE", f"/queues/{quote(name, safe='')}", query=query)

    async def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        """Delete an exchange and the bindings it is source or destination of."""
        query = {"if_unused": "true"} if if_unused else {}
        await self._call("DELETE", f"/exchanges/{quote(name, safe='')}", query=query)

    async def bind(
        self,
        exchange: str,
        *,
        queue: str | None = None,
        destination_exchange: str | None = None,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> Binding:
        """Bind ``queue``, or ``destination_exchange`` (an exchange-to-exchange binding), to
        ``exchange``: exactly one of the two."""
        if (queue is None) == (destination_exchange is None):
            raise ValueError("give exactly one of queue and destination_exchange")
        body: dict[str, Any] = {
            "exchange": exchange,
            "routing_key": routing_key,
            "arguments": arguments or {},
        }
        if queue is not None:
            body["queue"] = queue
        else:
            body["destination_exchange"] = destination_exchange
        return Binding.of(await self._call("POST", "/bindings", body))

    async def unbind(self, binding_id: int) -> None:
        await self._call("DELETE", f"/bindings/{int(binding_id)}")

    async def bindings(
        self,
        *,
        exchange: str | None = None,
        queue: str | None = None,
        destination_exchange: str | None = None,
    ) -> list[Binding]:
        """Every binding matching the filters (all pages), by id."""
        found: list[Binding] = []
        after: int | None = None
        while True:
            query: dict[str, Any] = {"limit": 1000}
            for key, value in (
                ("exchange", exchange),
                ("queue", queue),
                ("destination_exchange", destination_exchange),
                ("after", after),
            ):
                if value is not None:
                    query[key] = value
            page = await self._call("GET", "/bindings", query=query)
            found.extend(Binding.of(item) for item in page["items"])
            after = page["next_after"]
            if after is None:
                return found

    # -- diagnosis (contract §19) and connections (§20) ----------------------------------

    async def diagnose_queue(self, name: str) -> dict[str, Any]:
        """``GET /queues/{name}/diagnosis``: the head and what blocks it, the oldest delivery
        in flight and its holder, the subscriptions and the findings (most severe first)."""
        result: dict[str, Any] = await self._call(
            "GET", f"/queues/{quote(name, safe='')}/diagnosis"
        )
        return result

    async def diagnose_database(self) -> dict[str, Any]:
        """``GET /diagnosis`` (admin): bloat, xmin holders, broker processes, NOTIFY queue."""
        result: dict[str, Any] = await self._call("GET", "/diagnosis")
        return result

    async def connections(self, *, contains: str | None = None) -> list[dict[str, Any]]:
        """``GET /connections`` (admin): every WebSocket connection on every broker process,
        by connection id (all pages); ``contains``: only those whose username contains it."""
        return await self._all_by_name("/connections", contains)

    async def close_connection(self, connection_id: str) -> None:
        """``DELETE /connections/{id}`` (admin): closed with 1008 within 5 s, wherever it is."""
        await self._call("DELETE", f"/connections/{quote(connection_id, safe='')}")

    async def exchanges(self, *, contains: str | None = None) -> list[dict[str, Any]]:
        """``GET /exchanges``, all pages, by name: the exchanges you have some permission on;
        ``contains`` keeps those whose name contains the text (case-sensitive, §20)."""
        return await self._all_by_name("/exchanges", contains)

    async def queues(self, *, contains: str | None = None) -> list[dict[str, Any]]:
        """``GET /queues``, all pages, by name (each with its ``stats``); ``contains`` as in
        :meth:`exchanges`."""
        return await self._all_by_name("/queues", contains)

    async def users(self, *, contains: str | None = None) -> list[dict[str, Any]]:
        """``GET /users``, all pages, by name (admin only); ``contains`` as in
        :meth:`exchanges`."""
        return await self._all_by_name("/users", contains)

    async def _all_by_name(self, path: str, contains: str | None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        query: dict[str, Any] = {"limit": 1000}
        if contains is not None:
            query["contains"] = contains
        while True:
            page = await self._call("GET", path, query=query)
            found.extend(page["items"])
            if page["next_after"] is None:
                return found
            query["after"] = page["next_after"]

    async def overview_history(self) -> dict[str, Any]:
        """Broker-wide message rates and depths of the last 10 minutes (admin):
        ``{"interval_seconds", "samples": [{"at", "published", "delivered", "acked",
        "ready", "delayed", "in_flight", "dead"}]}``, oldest first; rates are counts per
        interval summed over every broker process, depths None where not sampled."""
        result: dict[str, Any] = await self._call("GET", "/overview/history")
        return result

    async def queue_history(self, name: str) -> dict[str, Any]:
        """One queue's message rates and depths of the last 10 minutes (as
        ``overview_history``)."""
        result: dict[str, Any] = await self._call("GET", f"/queues/{quote(name, safe='')}/history")
        return result

    async def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        query: dict[str, Any] | None = None,
    ) -> Any:
        url = self.root + path + (f"?{urlencode(query)}" if query else "")
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": self._authorization, "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        # http(s) only: the root's scheme is checked in __init__
        request = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310
        return await asyncio.to_thread(self._send, request)

    def _send(self, request: urllib.request.Request) -> Any:
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise _problem(exc) from None
        return json.loads(raw) if raw else None


def _problem(exc: urllib.error.HTTPError) -> BrokerError:
    try:
        problem = json.loads(exc.read())
    except ValueError:
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    code = str(problem.get("code", f"http_{exc.code}"))
    frame = {**problem, "code": code, "message": problem.get("detail", exc.reason)}
    return error_from_frame(frame)
