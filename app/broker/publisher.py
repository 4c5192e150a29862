"""Route + persist in one transaction, then wake the dispatchers (contract §5, §7).

A publish call is batched from end to end, whether it carries one message or a thousand:
one query loads the exchange with all its bindings, every message is routed in Python
(``app.domain.routing``), and one INSERT stores every copy of every message. Nothing is
stored unless everything is: an oversize body, an unroutable mandatory message or any
database error fails the whole call.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from app.auth.permissions import Access, require
from app.domain.model import ExchangeType, OutgoingMessage, PublishResult, User
from app.domain.routing import BindingRule, route
from app.errors import MessageTooLarge, NotFound, Unroutable
from app.metrics import Metrics
from app.storage import messages as store
from app.storage.database import Database

log = logging.getLogger("messagex.publisher")

#: Called after each successful commit with the ids of the queues that received copies.
PublishedListener = Callable[[set[int]], None]

#: A queue deleted between routing and insert makes the insert fail; the publish is then
#: retried with fresh bindings (it is ordered after the delete). More than this many
#: collisions in a row would need a pathological declare/delete loop.
_ATTEMPTS = 3


@dataclass(slots=True)
class _Plan:
    """Routed messages of one call: rows to insert and what to answer."""

    messages: list[OutgoingMessage]
    copies: list[tuple[int, int]] = field(default_factory=list)
    results: list[PublishResult] = field(default_factory=list)
    queue_ids: set[int] = field(default_factory=set)
    unroutable: int = 0


class _Router:
    """Routes many messages against one exchange snapshot, memoizing what it can.

    For direct, fanout and topic exchanges the routing key alone decides, so each distinct
    key is routed once per call; a direct exchange's bindings are indexed by key, so a
    message looks at the bindings with its key only. Headers routing runs per message.
    """

    def __init__(self, routes: store.ExchangeRoutes) -> None:
        self.type = routes.type
        self.bindings = routes.bindings
        self._by_key: dict[str, list[BindingRule]] | None = None
        if self.type is ExchangeType.DIRECT:
            self._by_key = {}
            for binding in routes.bindings:
                self._by_key.setdefault(binding.routing_key, []).append(binding)
        self._memo: dict[str, list[str]] = {}

    def __call__(self, message: OutgoingMessage) -> list[str]:
        if self.type is ExchangeType.HEADERS:
            return route(self.type, self.bindings, message.routing_key, message.headers)
        queues = self._memo.get(message.routing_key)
        if queues is None:
            candidates = (
                self.bindings if self._by_key is None else self._by_key.get(message.routing_key, [])
            )
            queues = route(self.type, candidates, message.routing_key, message.headers)
            self._memo[message.routing_key] = queues
        return queues


def _where(index: int, total: int) -> str:
    return f"message {index} of the batch" if total > 1 else "the message"


class Publisher:
    def __init__(self, db: Database, metrics: Metrics, *, max_message_bytes: int) -> None:
        self.db = db
        self.metrics = metrics
        self.max_message_bytes = max_message_bytes
        self._listeners: list[PublishedListener] = []

    def add_published_listener(self, callback: PublishedListener) -> None:
        """Call ``callback(queue_ids)`` after each commit that stored at least one copy.

        A plain sync function, called on the event loop: it must not block (set events,
        schedule tasks). Its exceptions are logged and do not fail the publish.
        """
        self._listeners.append(callback)

    # ------------------------------------------------------------------------- use cases

    async def publish(
        self, actor: User, exchange_name: str, messages: Sequence[OutgoingMessage]
    ) -> list[PublishResult]:
        """Publish ``messages`` to an exchange in one transaction; results in order."""
        require(actor, Access.WRITE, exchange_name, "exchange")
        prepared = self._prepare(messages)
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                async with self.db.transaction() as conn:
                    routes = await store.load_exchange_routes(conn, exchange_name)
                    if routes is None:
                        raise NotFound(f"exchange '{exchange_name}' not found")
                    plan = self._route(routes, prepared)
                    await store.insert_messages(
                        conn, exchange=exchange_name, messages=plan.messages, copies=plan.copies
                    )
                break
            except store.QueueDeleted:
                if attempt == _ATTEMPTS:
                    raise
        return self._committed(plan)

    async def publish_to_queue(
        self, actor: User, queue_name: str, messages: Sequence[OutgoingMessage]
    ) -> list[PublishResult]:
        """Publish straight into a queue (the default exchange): exchange ``""``, routing key
        the queue's name, no routing. A missing queue is 404."""
        require(actor, Access.WRITE, queue_name, "queue")
        prepared = [replace(m, routing_key=queue_name) for m in self._prepare(messages)]
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                async with self.db.transaction() as conn:
                    queue_id = await store.find_queue_id(conn, queue_name)
                    if queue_id is None:
                        raise NotFound(f"queue '{queue_name}' not found")
                    plan = _Plan(prepared)
                    for index, message in enumerate(prepared):
                        plan.copies.append((index, queue_id))
                        plan.results.append(PublishResult(True, [queue_name], message.message_id))
                    plan.queue_ids.add(queue_id)
                    await store.insert_messages(
                        conn, exchange="", messages=plan.messages, copies=plan.copies
                    )
                break
            except store.QueueDeleted:
                if attempt == _ATTEMPTS:
                    raise NotFound(f"queue '{queue_name}' not found") from None
        return self._committed(plan)

    # ------------------------------------------------------------------------- steps

    def _prepare(self, messages: Sequence[OutgoingMessage]) -> list[OutgoingMessage]:
        """Enforce the size limit (the rule's one home) and settle each message's id.

        The id is the publisher's ``message_id`` or a new UUID; it is also written into the
        stored properties, so every copy and every delivery carries it.
        """
        limit = self.max_message_bytes
        prepared: list[OutgoingMessage] = []
        for index, message in enumerate(messages):
            if len(message.body) > limit:
                raise MessageTooLarge(
                    f"{_where(index, len(messages))}: the body is {len(message.body)} bytes, "
                    f"over the limit of {limit} bytes; nothing was stored"
                )
            message_id = message.message_id or str(uuid.uuid4())
            if message.message_id and message.properties.get("message_id") == message_id:
                prepared.append(message)
                continue
            properties = {**message.properties, "message_id": message_id}
            prepared.append(replace(message, message_id=message_id, properties=properties))
        return prepared

    def _route(self, routes: store.ExchangeRoutes, messages: list[OutgoingMessage]) -> _Plan:
        """Route every message; raise Unroutable for a mandatory message with no queue."""
        router = _Router(routes)
        plan = _Plan(messages)
        for index, message in enumerate(messages):
            queues = router(message)
            if not queues:
                if message.mandatory:
                    self.metrics.unroutable.inc()
                    raise Unroutable(
                        f"{_where(index, len(messages))} is mandatory and matched no queue; "
                        "nothing was stored"
                    )
                plan.unroutable += 1
            for queue in queues:
                queue_id = routes.queue_ids[queue]
                plan.copies.append((index, queue_id))
                plan.queue_ids.add(queue_id)
            plan.results.append(PublishResult(bool(queues), list(queues), message.message_id))
        return plan

    def _committed(self, plan: _Plan) -> list[PublishResult]:
        self.metrics.published.inc(len(plan.messages))
        if plan.copies:
            self.metrics.routed_copies.inc(len(plan.copies))
        if plan.unroutable:
            self.metrics.unroutable.inc(plan.unroutable)
        if plan.queue_ids:
            for listener in self._listeners:
                try:
                    listener(set(plan.queue_ids))
                except Exception:
                    log.exception("a published listener failed")
        return plan.results
