"""Publish (route lookup, insert of routed copies) and browse/read/delete of stored messages.

Claim, ack and release live in ``storage.deliveries``; the publish's statements, as every
hot-path statement, in ``storage.queries``. Every statement is constant SQL text built once
at import, so asyncpg's prepared-statement cache hits on every call; each carries a comment
on its concurrency reasoning. Callers own the transactions.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
from sqlalchemy import CursorResult, TextClause, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection

from app.domain.arguments import parse_expiration
from app.domain.model import BrowseStatus, ExchangeType, OutgoingMessage, StoredMessage
from app.domain.routing import BindingRule
from app.errors import NotFound, Unavailable
from app.storage import queries
from app.storage.driver_errors import FK_MESSAGES_QUEUE, constraint
from app.storage.fastpath import HotPath, Statement, jsonb_text, jsonb_text_sized


class QueueDeleted(NotFound):
    """A queue the message was routed to was deleted while publishing; nothing was stored."""


async def _run(
    conn: AsyncConnection, statement: TextClause, params: Mapping[str, Any]
) -> CursorResult[*tuple[Any, ...]]:
    """Execute one statement; a publish racing a queue deletion becomes QueueDeleted.
    Every other driver error is mapped by ``driver_errors.guard`` (503 or 500)."""
    try:
        return await conn.execute(statement, params)
    except sa_exc.IntegrityError as exc:
        if constraint(exc) == FK_MESSAGES_QUEUE:
            raise QueueDeleted() from None
        raise


# ----------------------------------------------------------------------------- publish


@dataclass(frozen=True, slots=True)
class RoutingVersion:
    """Which binding set of an exchange a copy was read at: its id (a re-declared exchange
    has a new one) and its ``routing_version``."""

    id: int
    version: int


@dataclass(frozen=True, slots=True)
class ExchangeRoutes:
    """What routing needs about an exchange: its type, its queue bindings, its queues' ids,
    its exchange-to-exchange bindings (each rule's ``queue`` is the destination exchange's
    name), its alternate exchange's name, and the version they were read at. ``complete``
    is False when a plain read found it routes on: its e2e bindings and alternate were not
    read (the caller reads its graph)."""

    type: ExchangeType
    at: RoutingVersion
    bindings: list[BindingRule]
    queue_ids: dict[str, int]
    onward: list[BindingRule] = field(default_factory=list)
    alternate: str | None = None
    complete: bool = True


async def load_routes(
    hot: HotPath,
    names: Sequence[str],
    known: Mapping[str, RoutingVersion] | None = None,
    *,
    graph: bool = False,
) -> dict[str, ExchangeRoutes | RoutingVersion]:
    """For each named exchange that exists — and with ``graph``, for every exchange reachable
    from them through exchange-to-exchange bindings and alternate exchanges — in one round
    trip: its routes, or only its current version when that is the one ``known`` gives for it
    (the caller's copy is current). Without ``graph``, a changed exchange that routes on
    comes back with ``complete`` False."""
    known = known or {}
    given = list(known) if graph else list(names)
    versions = [known.get(name) for name in given]
    params: dict[str, Any] = {
        "names": given,
        "known_ids": [v.id if v else None for v in versions],
        "known_versions": [v.version if v else None for v in versions],
    }
    if not graph:
        rows = await hot.fetch(queries.LOAD_ROUTES, params)
        return _routes(known, [(*r[:4], None, r[5], r[6], None, *r[7:], r[4] > 0) for r in rows])
    params["roots"] = list(names)
    rows = await hot.fetch(queries.LOAD_ROUTE_GRAPH, params)
    return _routes(known, [(*r, False) for r in rows])


def _routes(
    known: Mapping[str, RoutingVersion], rows: list[tuple[Any, ...]]
) -> dict[str, ExchangeRoutes | RoutingVersion]:
    """Rows of (name, id, type, version, alternate, queue id, queue name, destination
    exchange, key, arguments, routes on but not read) → each exchange's routes."""
    routes: dict[str, ExchangeRoutes | RoutingVersion] = {}
    for row in rows:
        name, id_, type_, version, alternate, queue_id, queue_name, destination, key, args, part = (
            row
        )
        found = routes.get(name)
        if found is None:
            at = RoutingVersion(id_, version)
            if known.get(name) == at:
                routes[name] = at
                continue
            found = routes[name] = ExchangeRoutes(
                ExchangeType(type_), at, [], {}, alternate=alternate, complete=not part
            )
        assert isinstance(found, ExchangeRoutes)
        if queue_id is not None:
            found.bindings.append(BindingRule(queue_name, key, args))
            found.queue_ids[queue_name] = queue_id
        elif destination is not None:
            found.onward.append(BindingRule(destination, key, args))
        # else: the exchange has no bindings
    return routes


async def find_queue_ids(hot: HotPath, names: Sequence[str]) -> dict[str, int]:
    rows = await hot.fetch(queries.FIND_QUEUES, {"names": list(names)})
    return {str(r[0]): int(r[1]) for r in rows}


class PublishInDoubt(Exception):
    """The connection failed after the publish statement was sent: it may have committed.
    ``settle_in_doubt`` with the same receipt says which way it went. ``cause``: the 503 to
    answer if it did not (e.g. the database is out of disk space)."""

    def __init__(self, cause: Unavailable | None = None) -> None:
        self.cause = cause or Unavailable()
        super().__init__(self.cause.message)


@dataclass(frozen=True, slots=True)
class HandOffTo:
    """Where each copy of a publish may go straight to (the direct hand-off): per copy, the
    owning connection and its lease in seconds, or None; and the owning broker process."""

    process_id: str
    owners: Sequence[tuple[str, float] | None]


@dataclass(frozen=True, slots=True)
class HandedOff:
    """A copy stored in flight by the publish itself (see INSERT_COPIES_HANDING_OFF)."""

    copy: int  # index into the publish's copies
    id: int
    delivery_tag: str
    created_at: datetime
    headers: str  # the JSON text stored, as a claim would return it
    properties: str


def encode_metadata(
    headers: Mapping[str, Any], properties: Mapping[str, Any]
) -> tuple[tuple[str, str], int]:
    """A message's headers and properties as the JSON text ``insert_copies`` stores, and
    their size together in bytes (what MESSAGEX_MAX_HEADER_BYTES bounds), from one encoding."""
    headers_text, headers_size = jsonb_text_sized(headers) if headers else ("{}", 2)
    properties_text, properties_size = jsonb_text_sized(properties)
    return (headers_text, properties_text), headers_size + properties_size


def _stored_json(m: OutgoingMessage) -> tuple[str, str]:
    if m.stored_json is not None:
        return m.stored_json
    return jsonb_text(m.headers) if m.headers else "{}", jsonb_text(m.properties)


def insert_params(
    messages: Sequence[tuple[str, OutgoingMessage]],
    copies: Sequence[tuple[int, int]],
    receipt: str,
    priorities: Sequence[int | None] | None = None,
) -> dict[str, Any]:
    """The parameters of INSERT_COPIES (and its variants) for these copies."""
    stored = [_stored_json(m) for _, m in messages]
    return {
        "receipt": receipt,
        "copy_msg": [index + 1 for index, _ in copies],
        "copy_queue": [queue_id for _, queue_id in copies],
        "exchange": [e for e, _ in messages],
        "message_id": [m.message_id for _, m in messages],
        "routing_key": [m.routing_key for _, m in messages],
        "headers": [h for h, _ in stored],
        "properties": [p for _, p in stored],
        "body": [m.body for _, m in messages],
        "is_binary": [m.binary for _, m in messages],
        "delay_ms": [m.delay_ms for _, m in messages],
        "copy_priority": list(priorities) if priorities is not None else [None] * len(copies),
        "expiration_ms": [parse_expiration(m.properties.get("expiration")) for _, m in messages],
    }


async def insert_copies(
    hot: HotPath,
    messages: Sequence[tuple[str, OutgoingMessage]],
    copies: Sequence[tuple[int, int]],
    receipt: str,
    handoff: HandOffTo | None = None,
    priorities: Sequence[int | None] | None = None,
    within: asyncpg.Connection | None = None,
) -> list[HandedOff]:
    """Insert one row per ``(message index, queue id)`` in ``copies``, in that order, and
    the publish receipt ``receipt`` (a UUID, new for each call) with them.

    ``messages`` are (exchange, message) pairs whose messages carry their final
    ``message_id`` and ``properties``. With ``handoff``, the offered copies of each queue
    that has no due ready message are stored in flight to their owners, and returned; a
    queue's offered copies are all handed off or none is. ``priorities``: each copy's claim
    priority (None outside priority queues; all None when not given). ``within``: run on
    this connection, inside its caller's transaction (the length-limited publish,
    broker/limits.py), which then owns the in-doubt case. Raises QueueDeleted (nothing
    stored) when a target queue no longer exists; Unavailable when the statement was never
    sent (nothing stored); PublishInDoubt when the connection failed after it was sent.
    """
    if not copies:
        return []
    params = insert_params(messages, copies, receipt, priorities)
    statement = queries.INSERT_COPIES
    if handoff is not None:
        statement = queries.INSERT_COPIES_HANDING_OFF
        params["process_id"] = handoff.process_id
        params["copy_owner"] = [o[0] if o else None for o in handoff.owners]
        params["copy_lease"] = [o[1] if o else None for o in handoff.owners]
    if within is not None:
        rows = await _execute_insert(within, statement, params, returning=handoff is not None)
        if handoff is None:
            return []
        return _match_handed(rows, copies, handoff.owners, params["headers"], params["properties"])
    sent = False
    try:
        # without a hand-off the INSERT reads nothing of messages: it keeps a generic plan
        async with hot.connection(stable=handoff is None) as conn:
            sent = True
            rows = await _execute_insert(conn, statement, params, returning=handoff is not None)
            if handoff is None:
                return []
    except Unavailable as exc:
        if sent:
            raise PublishInDoubt(exc) from None
        raise
    return _match_handed(rows, copies, handoff.owners, params["headers"], params["properties"])


async def _execute_insert(
    conn: asyncpg.Connection, statement: Statement, params: dict[str, Any], *, returning: bool
) -> Sequence[Any]:
    if not returning:
        await execute_insert(conn, statement, params)
        return []
    with _queue_deleted_on_foreign_key():
        rows: Sequence[Any] = await conn.fetch(statement.sql, *statement.args(params))
    return rows


async def execute_insert(
    conn: asyncpg.Connection, statement: Statement, params: dict[str, Any]
) -> str:
    """Run a statement that inserts copies (INSERT_COPIES or one built on it); its status
    (``"DELETE 3"`` for one whose last part deletes). QueueDeleted when a target queue is
    gone (the foreign key)."""
    with _queue_deleted_on_foreign_key():
        status: str = await conn.execute(statement.sql, *statement.args(params))
    return status


async def fetchval_insert(
    conn: asyncpg.Connection, statement: Statement, params: dict[str, Any]
) -> Any:
    """``execute_insert`` for a statement that returns one value (a function that inserts
    copies: storage/limits.py TRIMMING_FUNCTION)."""
    with _queue_deleted_on_foreign_key():
        return await conn.fetchval(statement.sql, *statement.args(params))


@contextmanager
def _queue_deleted_on_foreign_key() -> Iterator[None]:
    """An insert of copies whose queue was deleted meanwhile: QueueDeleted, not a 500."""
    try:
        yield
    except asyncpg.ForeignKeyViolationError as exc:
        if constraint(exc) == FK_MESSAGES_QUEUE:
            raise QueueDeleted() from None
        raise


def _match_handed(
    rows: Sequence[Any],
    copies: Sequence[tuple[int, int]],
    owners: Sequence[tuple[str, float] | None],
    headers: Sequence[str],
    properties: Sequence[str],
) -> list[HandedOff]:
    """Pair the rows stored in flight (by id, so in copy order) with the offered copies of
    their queues, in copy order."""
    by_queue: dict[int, list[Any]] = {}
    for row in rows:
        by_queue.setdefault(row[1], []).append(row)
    if not by_queue:
        return []
    taken = dict.fromkeys(by_queue, 0)
    handed: list[HandedOff] = []
    for index, (message, queue_id) in enumerate(copies):
        if owners[index] is None or queue_id not in by_queue:
            continue
        row = by_queue[queue_id][taken[queue_id]]
        taken[queue_id] += 1
        handed.append(
            HandedOff(index, row[0], row[2], row[3], headers[message], properties[message])
        )
    return handed


async def settle_in_doubt(hot: HotPath, receipt: str) -> bool:
    """Whether the publish that carried ``receipt`` committed; from now on it cannot.
    Raises Unavailable when the database cannot be asked."""
    fenced = await hot.fetchval(queries.SETTLE_RECEIPT, {"receipt": receipt})
    return fenced is None


async def sweep_receipts(hot: HotPath, older_than_seconds: int) -> int:
    async with hot.connection() as conn:
        status: str = await conn.execute(
            queries.SWEEP_RECEIPTS.sql,
            *queries.SWEEP_RECEIPTS.args({"older_than_seconds": older_than_seconds}),
        )
    return int(status.rsplit(" ", 1)[-1])


# ----------------------------------------------------------------------------- browse

_COLUMNS = """m.id, m.message_id,
       CASE WHEN m.status = 'ready' AND m.available_at > now() THEN 'delayed'
            ELSE m.status END AS browse_status,
       m.exchange, m.routing_key, m.headers, m.properties, m.body, m."binary",
       m.delivery_count, m.created_at, m.available_at, m.delivery_tag"""

_STATUS_FILTERS: dict[BrowseStatus | None, str] = {
    None: "true",
    BrowseStatus.READY: "m.status = 'ready' AND m.available_at <= now()",
    BrowseStatus.DELAYED: "m.status = 'ready' AND m.available_at > now()",
    BrowseStatus.IN_FLIGHT: "m.status = 'in_flight'",
    BrowseStatus.DEAD: "m.status = 'dead'",
}

# One page of a queue's messages by id (keyset), optionally of one status, in ONE round
# trip: zero rows means no such queue; one row of NULLs, an empty page. A plain snapshot
# read through ix_messages_queue (queue_id, id): it takes no row locks, so browsing never
# blocks or is blocked by claims (SKIP LOCKED), acks or publishes, and it may show a message
# that is claimed or acked a moment later. "delayed" is derived with the database clock.
# One constant statement per status filter (five in all), so each keeps its cached plan.
BROWSE = {
    status: text(f"""
SELECT q.id, p.*
FROM queues AS q
LEFT JOIN LATERAL (
    SELECT {_COLUMNS}
    FROM messages AS m
    WHERE m.queue_id = q.id AND m.id > :after AND {condition}
    ORDER BY m.id
    LIMIT :limit
) AS p ON true
WHERE q.name = :queue
ORDER BY p.id
""")
    for status, condition in _STATUS_FILTERS.items()
}

# One message of a named queue, whatever its status: zero rows, no such queue; a row of
# NULLs, no such message in it. Snapshot read, no locks (as BROWSE).
GET_ONE = text(f"""
SELECT q.id, {_COLUMNS}
FROM queues AS q
LEFT JOIN messages AS m ON m.queue_id = q.id AND m.id = :id
WHERE q.name = :queue
""")

# Delete one message of a named queue whatever its status, in ONE statement. The DELETE
# locks the row: if a claim or an ack holds it, we wait for that transaction and then
# re-check (READ COMMITTED): already acked → nothing deleted (404); claimed → the in-flight
# row is deleted and a later ack of its tag finds nothing (unknown_delivery_tag). RETURNING
# tells who owned an in-flight copy, so its consumer's prefetch slot can be freed.
DELETE_ONE = text("""
WITH q AS (SELECT id FROM queues WHERE name = :queue),
gone AS (
    DELETE FROM messages AS m USING q
    WHERE m.id = :id AND m.queue_id = q.id
    RETURNING m.status, m.delivery_tag, m.owner_process, m.owner_connection
)
SELECT q.id, gone.status, gone.delivery_tag, gone.owner_process, gone.owner_connection
FROM q LEFT JOIN gone ON true
""")


def _stored(queue: str, row: Sequence[Any]) -> StoredMessage:
    (
        id_,
        message_id,
        status,
        exchange,
        routing_key,
        headers,
        properties,
        body,
        binary,
        delivery_count,
        created_at,
        available_at,
        delivery_tag,
    ) = row
    return StoredMessage(
        id=id_,
        queue=queue,
        message_id=message_id,
        status=BrowseStatus(status),
        exchange=exchange,
        routing_key=routing_key,
        headers=headers,
        properties=properties,
        body=bytes(body),
        binary=binary,
        delivery_count=delivery_count,
        created_at=created_at,
        available_at=available_at,
        delivery_tag=delivery_tag,
    )


#: A browse item's columns over ``messages AS m``, and the row → StoredMessage, for the other
#: reads in the browse list shape (storage/filters.py, contract §17).
BROWSE_COLUMNS = _COLUMNS
stored_message = _stored


def _queue_not_found(queue: str) -> NotFound:
    return NotFound(f"queue '{queue}' not found")


def _message_not_found(queue: str, id_: int) -> NotFound:
    return NotFound(f"message {id_} not found in queue '{queue}'")


async def browse(
    conn: AsyncConnection,
    queue: str,
    *,
    status: BrowseStatus | None,
    limit: int,
    after: int,
) -> list[StoredMessage]:
    """Up to ``limit`` messages with id > ``after`` in id order; NotFound for no such queue."""
    rows = (
        await _run(conn, BROWSE[status], {"queue": queue, "after": after, "limit": limit})
    ).all()
    if not rows:
        raise _queue_not_found(queue)
    return [_stored(queue, row[1:]) for row in rows if row[1] is not None]


async def get_message(conn: AsyncConnection, queue: str, id_: int) -> StoredMessage:
    """One message of ``queue``, whatever its status; NotFound for a missing queue or id."""
    row = (await _run(conn, GET_ONE, {"queue": queue, "id": id_})).first()
    if row is None:
        raise _queue_not_found(queue)
    if row[1] is None:
        raise _message_not_found(queue, id_)
    return _stored(queue, row[1:])


@dataclass(frozen=True, slots=True)
class DeletedMessage:
    """What was deleted: the owner of an in-flight copy needs its prefetch slot back."""

    queue_id: int
    status: str
    delivery_tag: str | None
    owner_process: str | None
    owner_connection: str | None


async def delete_message(conn: AsyncConnection, queue: str, id_: int) -> DeletedMessage:
    """Delete one message of ``queue``, whatever its status; NotFound for a missing queue
    or id."""
    row = (await _run(conn, DELETE_ONE, {"queue": queue, "id": id_})).first()
    if row is None:
        raise _queue_not_found(queue)
    queue_id, status, delivery_tag, owner_process, owner_connection = row
    if status is None:
        raise _message_not_found(queue, id_)
    return DeletedMessage(
        queue_id=queue_id,
        status=status,
        delivery_tag=delivery_tag,
        owner_process=None if owner_process is None else str(owner_process),
        owner_connection=None if owner_connection is None else str(owner_connection),
    )
