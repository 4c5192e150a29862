"""Exchanges, queues and bindings: declare, inspect, delete (contract §4, §5, §6, §12).

Every method authorizes through ``app.auth.permissions`` first, then runs its statements
(``app.storage.topology``) in one transaction. Lists are filtered by visibility in Python,
because permissions are Python regular expressions: rows are scanned in name (or id) order
in batches until the page is full.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from app.auth.permissions import Access, allows_any, require, require_any
from app.domain.arguments import (
    check_dead_letter_target,
    parse_exchange_arguments,
    parse_queue_arguments,
)
from app.domain.model import (
    BUILTIN_EXCHANGES,
    RESERVED_PREFIX,
    Binding,
    Exchange,
    ExchangeType,
    Queue,
    QueueStats,
    Role,
    User,
)
from app.domain.routing import check_binding_arguments
from app.errors import Forbidden, NotFound, PreconditionFailed, ValidationFailed
from app.storage import topology as store
from app.storage.database import Database

log = logging.getLogger("messagex.topology")

T = TypeVar("T")
K = TypeVar("K", str, int)

#: ``async callback(queue_name)``, called after a queue deletion has committed.
QueueDeletedListener = Callable[[str], Awaitable[None]]

#: Rows read per round trip when a non-admin's list is filtered by permissions.
_SCAN_BATCH = 500


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A queue with its current stats, as ``GET /queues`` shows it."""

    queue: Queue
    stats: QueueStats


@dataclass(frozen=True, slots=True)
class Listing(Generic[T]):
    """One page of a list: the items and the cursor of the next page (None on the last)."""

    items: list[T]
    next_after: Any = None


def _refuse_reserved(name: str, kind: str) -> None:
    if name in BUILTIN_EXCHANGES and kind == "exchange":
        raise Forbidden(f"'{name}' is a built-in exchange and cannot be changed or deleted")
    if name.startswith(RESERVED_PREFIX):
        raise Forbidden(f"the prefix '{RESERVED_PREFIX}' is reserved: {kind} '{name}' refused")


def _differs(kind: str, name: str, differing: tuple[str, ...]) -> PreconditionFailed:
    return PreconditionFailed(
        f"{kind} '{name}' already exists with different properties: {', '.join(differing)}"
    )


async def _page(
    fetch: Callable[[K | None, int], Awaitable[list[T]]],
    key: Callable[[T], K],
    visible: Callable[[T], bool] | None,
    *,
    limit: int,
    after: K | None,
) -> tuple[list[T], K | None]:
    """Keyset pagination with an optional visibility filter.

    Reads one row more than the page (or batches, when filtering) so that ``next_after`` is
    set only when another visible item exists.
    """
    batch = limit + 1 if visible is None else max(limit + 1, _SCAN_BATCH)
    items: list[T] = []
    cursor = after
    while True:
        rows = await fetch(cursor, batch)
        for row in rows:
            if visible is None or visible(row):
                items.append(row)
                if len(items) > limit:
                    return items[:limit], key(items[limit - 1])
        if len(rows) < batch:
            return items, None
        cursor = key(rows[-1])


def _valid_for_any_exchange(arguments: dict[str, Any]) -> bool:
    """Binding arguments that ``check_binding_arguments`` accepts whatever the exchange's
    type (it checks only a headers exchange's x-match)."""
    try:
        check_binding_arguments(ExchangeType.HEADERS, arguments)
    except ValueError:
        return False
    return True


def _check_binding_arguments(exchange_type: ExchangeType, arguments: dict[str, Any]) -> None:
    try:
        check_binding_arguments(exchange_type, arguments)
    except ValueError as exc:
        raise ValidationFailed.on_field("arguments", str(exc)) from None


def _admin(user: User) -> bool:
    return user.role is Role.ADMIN


class TopologyService:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._queue_deleted_listeners: list[QueueDeletedListener] = []

    def add_queue_deleted_listener(self, callback: QueueDeletedListener) -> None:
        """Register ``async callback(queue_name)``, awaited after a queue deletion commits."""
        self._queue_deleted_listeners.append(callback)

    async def _queue_deleted(self, name: str) -> None:
        for callback in list(self._queue_deleted_listeners):
            try:
                await callback(name)
            except Exception:
                log.exception("queue-deleted listener failed for queue '%s'", name)

    # ----------------------------------------------------------------------- exchanges

    async def declare_exchange(self, user: User, exchange: Exchange) -> tuple[Exchange, bool]:
        """Create the exchange, or find an identical one: (exchange, created)."""
        alternate = parse_exchange_arguments(exchange.arguments).alternate_exchange
        _refuse_reserved(exchange.name, "exchange")
        require(user, Access.CONFIGURE, exchange.name, "exchange")
        if alternate is not None:
            # As RabbitMQ: messages go from this exchange into the alternate.
            require(user, Access.READ, exchange.name, "exchange")
            require(user, Access.WRITE, alternate, "exchange")
        async with self.db.transaction() as conn:
            # §14: the alternate must exist (an exchange may name itself: harmless, as each
            # exchange is visited once). Deleting it later is allowed (docs/decisions.md).
            if (
                alternate is not None
                and alternate != exchange.name
                and not await store.exchange_exists(conn, alternate)
            ):
                raise NotFound(f"alternate exchange '{alternate}' not found")
            declared = await store.declare_exchange(conn, exchange)
        if declared.differing:
            raise _differs("exchange", exchange.name, declared.differing)
        if declared.created:
            log.info("exchange '%s' declared by '%s'", exchange.name, user.username)
        return declared.value, declared.created

    async def get_exchange(self, user: User, name: str) -> Exchange:
        require_any(user, name, "exchange")
        async with self.db.connect() as conn:
            exchange = await store.get_exchange(conn, name)
        if exchange is None:
            raise NotFound(f"exchange '{name}' not found")
        return exchange

    async def list_exchanges(
        self, user: User, *, limit: int, after: str | None = None, contains: str | None = None
    ) -> Listing[Exchange]:
        async with self.db.transaction() as conn:

            async def fetch(cursor: str | None, n: int) -> list[Exchange]:
                return await store.list_exchanges(conn, after=cursor, limit=n, contains=contains)

            visible = None if _admin(user) else (lambda e: allows_any(user, e.name))
            items, next_after = await _page(
                fetch, lambda e: e.name, visible, limit=limit, after=after
            )
        return Listing(items, next_after)

    async def delete_exchange(self, user: User, name: str, *, if_unused: bool = False) -> None:
        _refuse_reserved(name, "exchange")
        require(user, Access.CONFIGURE, name, "exchange")
        async with self.db.transaction() as conn:
            exchanges = await store.delete_exchange(conn, name, if_unused=if_unused)
        log.info("exchange '%s' deleted by '%s'", name, user.username)
        for exchange in exchanges:
            log.info("auto-delete exchange '%s' deleted (no bindings left)", exchange)

    # ----------------------------------------------------------------------- queues

    async def declare_queue(self, user: User, queue: Queue) -> tuple[QueueInfo, bool]:
        """Create the queue, or find an identical one: (queue with stats, created).

        A dead-letter queue needs write permission on it: dead-lettering writes there.
        """
        if queue.dead_letter_queue == queue.name:
            raise ValidationFailed.on_field(
                "dead_letter_queue", "a queue cannot be its own dead-letter queue"
            )
        arguments = parse_queue_arguments(queue.arguments)
        check_dead_letter_target(arguments, queue.dead_letter_queue)
        dlx = arguments.dead_letter_exchange
        _refuse_reserved(queue.name, "queue")
        require(user, Access.CONFIGURE, queue.name, "queue")
        if queue.dead_letter_queue is not None:
            require(user, Access.WRITE, queue.dead_letter_queue, "queue")
        if dlx is not None:  # dead-lettering publishes there
            require(user, Access.WRITE, dlx, "exchange")
        locked = queue.dead_letter_queue is not None or dlx is not None
        # Without a dead-letter target to hold locked, each statement stands alone: a new
        # queue is one statement on the hot path's executor (no BEGIN, no COMMIT round trip,
        # no SQLAlchemy execution); an existing one is compared on an autocommit connection.
        if not locked and await store.create_queue(self.db.hot, queue):
            log.info("queue '%s' declared by '%s'", queue.name, user.username)
            return QueueInfo(queue, QueueStats()), True
        scope = self.db.transaction if locked else self.db.connect
        async with scope() as conn:
            if dlx is not None and not await store.lock_exchange_key_share(conn, dlx):
                raise NotFound(f"dead-letter exchange '{dlx}' not found")
            declared = await store.declare_queue(conn, queue)
            if declared.differing:
                raise _differs("queue", queue.name, declared.differing)
            if arguments.expires_ms is not None:  # declared or re-declared: used now
                await store.touch_queue(conn, queue.name)
            stats = QueueStats()
            if not declared.created:
                stats = (await store.queue_stats(conn, [queue.name])).get(queue.name, stats)
        if declared.created:
            log.info("queue '%s' declared by '%s'", queue.name, user.username)
        return QueueInfo(declared.value, stats), declared.created

    async def get_queue(self, user: User, name: str) -> QueueInfo:
        require_any(user, name, "queue")
        async with self.db.transaction() as conn:
            queue = await store.get_queue(conn, name)
            if queue is None:
                raise NotFound(f"queue '{name}' not found")
            stats = await store.queue_stats(conn, [name])
        return QueueInfo(queue, stats.get(name, QueueStats()))

    async def list_queues(
        self, user: User, *, limit: int, after: str | None = None, contains: str | None = None
    ) -> Listing[QueueInfo]:
        async with self.db.transaction() as conn:

            async def fetch(cursor: str | None, n: int) -> list[Queue]:
                return await store.list_queues(conn, after=cursor, limit=n, contains=contains)

            visible = None if _admin(user) else (lambda q: allows_any(user, q.name))
            queues, next_after = await _page(
                fetch, lambda q: q.name, visible, limit=limit, after=after
            )
            # One statement for the whole page's stats.
            stats = await store.queue_stats(conn, [q.name for q in queues])
        items = [QueueInfo(q, stats.get(q.name, QueueStats())) for q in queues]
        return Listing(items, next_after)

    async def delete_queue(
        self, user: User, name: str, *, if_empty: bool = False, if_unused: bool = False
    ) -> None:
        """Delete the queue; after the commit, tell the queue-deleted listeners."""
        _refuse_reserved(name, "queue")
        require(user, Access.CONFIGURE, name, "queue")
        await self._delete_queue(name, user.username, if_empty=if_empty, if_unused=if_unused)

    async def _delete_queue(
        self,
        name: str,
        by: str,
        *,
        if_empty: bool = False,
        if_unused: bool = False,
        if_idle: bool = False,
    ) -> None:
        async with self.db.transaction() as conn:
            exchanges = await store.delete_queue(
                conn, name, if_empty=if_empty, if_unused=if_unused, if_idle=if_idle
            )
        log.info("queue '%s' deleted by '%s'", name, by)
        for exchange in exchanges:
            log.info("auto-delete exchange '%s' deleted (no bindings left)", exchange)
        await self._queue_deleted(name)

    async def expire_idle_queues(self) -> int:
        """Delete the queues whose x-expires ran out (contract §13) as DELETE /queues/{name}
        does (same statements, same listeners), each re-checked under the delete's lock. Every
        process runs it; one that loses a race to another process finds the queue gone."""
        names = await store.idle_queues(self.db.hot, _SCAN_BATCH)
        deleted = 0
        for name in names:
            try:
                await self._delete_queue(name, "x-expires", if_idle=True)
                deleted += 1
            except (NotFound, PreconditionFailed):
                continue  # deleted elsewhere, used again, or a dead-letter queue (kept)
        return deleted

    async def purge_queue(self, user: User, name: str) -> int:
        """Remove the queue's ready, delayed and dead messages; the number removed."""
        require(user, Access.CONFIGURE, name, "queue")
        async with self.db.transaction() as conn:
            purged = await store.purge_queue(conn, name)
        log.info("queue '%s' purged by '%s': %d messages", name, user.username, purged)
        return purged

    # ----------------------------------------------------------------------- bindings

    @staticmethod
    def _require_binding(user: User, exchange: str, destination: tuple[str, str]) -> None:
        """Binding *from* an exchange needs read on it; *to* a queue needs write on it, and
        *to* an exchange (§14) write on that exchange."""
        require(user, Access.READ, exchange, "exchange")
        kind, name = destination
        require(user, Access.WRITE, name, kind)

    async def create_binding(
        self,
        user: User,
        *,
        exchange: str,
        queue: str | None = None,
        destination_exchange: str | None = None,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> tuple[Binding, bool]:
        """Bind, or find the identical binding: (binding, created). Exactly one of ``queue``
        and ``destination_exchange`` names the destination."""
        arguments = arguments or {}
        if destination_exchange is not None:
            if queue is not None:
                raise ValidationFailed.on_field(
                    "destination_exchange", "give either queue or destination_exchange, not both"
                )
            return await self._bind_exchange(
                user, exchange, destination_exchange, routing_key, arguments
            )
        if queue is None:
            raise ValidationFailed.on_field("queue", "give either queue or destination_exchange")
        self._require_binding(user, exchange, ("queue", queue))
        if _valid_for_any_exchange(arguments):
            # One statement, no transaction around it: the common case in one round trip.
            binding_id, created = await store.bind(
                self.db.hot, exchange, queue, routing_key=routing_key, arguments=arguments
            )
            binding = Binding(binding_id, exchange, queue, routing_key, arguments)
            if not created:  # answer with the stored one
                async with self.db.connect() as conn:
                    binding = await store.get_binding(conn, binding_id) or binding
            return binding, created
        async with self.db.transaction() as conn:
            ends = await store.lock_binding_ends(conn, exchange, queue)
            _check_binding_arguments(ends.exchange_type, arguments)
            binding_id, created = await store.create_binding(
                conn, ends, routing_key=routing_key, arguments=arguments
            )
            binding = Binding(binding_id, exchange, queue, routing_key, arguments)
            if not created:  # answer with the stored one
                binding = await store.get_binding(conn, binding_id) or binding
        return binding, created

    async def _bind_exchange(
        self,
        user: User,
        exchange: str,
        destination: str,
        routing_key: str,
        arguments: dict[str, Any],
    ) -> tuple[Binding, bool]:
        """An exchange-to-exchange binding (contract §14), in one transaction."""
        self._require_binding(user, exchange, ("exchange", destination))
        async with self.db.transaction() as conn:
            source_id, destination_id, kind = await store.lock_exchange_binding_ends(
                conn, exchange, destination
            )
            _check_binding_arguments(kind, arguments)
            binding_id, created = await store.create_exchange_binding(
                conn, source_id, destination_id, routing_key=routing_key, arguments=arguments
            )
            binding = Binding(binding_id, exchange, None, routing_key, arguments, destination)
            if not created:  # answer with the stored one
                binding = await store.get_binding(conn, binding_id) or binding
        return binding, created

    async def list_bindings(
        self,
        user: User,
        *,
        limit: int,
        after: int | None = None,
        exchange: str | None = None,
        queue: str | None = None,
        destination_exchange: str | None = None,
    ) -> Listing[Binding]:
        async with self.db.transaction() as conn:

            async def fetch(cursor: int | None, n: int) -> list[Binding]:
                return await store.list_bindings(
                    conn,
                    after=cursor,
                    limit=n,
                    exchange=exchange,
                    queue=queue,
                    destination_exchange=destination_exchange,
                )

            def visible(b: Binding) -> bool:
                return allows_any(user, b.exchange) or allows_any(user, b.destination[1])

            items, next_after = await _page(
                fetch,
                lambda b: b.id,
                None if _admin(user) else visible,
                limit=limit,
                after=after,
            )
        return Listing(items, next_after)

    async def delete_binding(self, user: User, binding_id: int) -> None:
        async with self.db.transaction() as conn:
            binding = await store.get_binding(conn, binding_id)
            if binding is None:
                raise NotFound(f"binding {binding_id} not found")
            self._require_binding(user, binding.exchange, binding.destination)
            deleted, exchanges = await store.delete_binding(conn, binding_id)
            if not deleted:
                raise NotFound(f"binding {binding_id} not found")
        for name in exchanges:
            log.info("auto-delete exchange '%s' deleted (no bindings left)", name)
