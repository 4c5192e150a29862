"""Publish and acknowledge inside the application's own PostgreSQL transaction (contract §18).

A service whose data lives in the same PostgreSQL database as MessageX calls the broker's SQL
functions (``messagex.publish``, ``publish_bytes``, ``publish_to_queue``, ``ack``) on its own
connection, inside its own transaction: the message exists if and only if that transaction
commits (no outbox table), and a delivery is acknowledged if and only if the work recorded
with it commits (exactly-once effects).

These helpers call those functions on whatever the application already holds:

- async (``await``): an ``asyncpg`` connection (or pool connection), a ``psycopg``
  ``AsyncConnection``, an SQLAlchemy ``AsyncSession`` or ``AsyncConnection``;
- sync (the ``*_sync`` functions): a ``psycopg`` ``Connection``, an SQLAlchemy ``Session`` or
  ``Connection``.

None of those libraries is imported here: an object is recognised by its class only when its
library is already loaded (it must be, for the object to exist). The helpers never commit,
roll back or open a transaction: that stays the caller's. A broker error (the SQL error's
message starts with the contract's code, ``not_found: ...``) is raised as the client's
:class:`~messagex_client.errors.BrokerError` subclass for that code, with the driver's
exception as ``__cause__``; as after any SQL error, the transaction is then aborted (use a
savepoint to go on).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from typing import Any, Final, TypedDict, Unpack

from messagex_client.client import PublishResult
from messagex_client.errors import BrokerError, error_from_frame

__all__ = [
    "PublishOptions",
    "ack_in_transaction",
    "ack_in_transaction_sync",
    "publish_in_transaction",
    "publish_in_transaction_sync",
    "publish_to_queue_in_transaction",
    "publish_to_queue_in_transaction_sync",
]

#: codes a broker SQL function raises with (contract §2, §18); anything else is not ours
_CODES: Final = frozenset(
    {
        "bad_request",
        "forbidden",
        "limit_exceeded",
        "message_too_large",
        "not_found",
        "precondition_failed",
        "unavailable",
        "unroutable",
        "validation_error",
    }
)
_CODE_PREFIX: Final = re.compile(r"^([a-z_]+): ")

# One SQL text per call and driver style. Parameters go in as text and the result comes back
# as text, so an application's own jsonb codec (asyncpg set_type_codec, psycopg loaders)
# cannot change what is sent or read.
_PUBLISH: Final = "SELECT messagex.{fn}({args})::text"
_ACK: Final = "SELECT messagex.ack({tag})"


def _publish_sql(fn: str, style: str, *, to_queue: bool, binary: bool) -> str:
    names = (["queue"] if to_queue else ["exchange", "routing_key"]) + [
        "body",
        "headers",
        "properties",
        "delay_ms",
    ]
    kinds = {
        "exchange": "text",
        "routing_key": "text",
        "queue": "text",
        "body": "bytea" if binary else "text::jsonb",
        "headers": "text::jsonb",
        "properties": "text::jsonb",
        "delay_ms": "bigint",
    }
    args = []
    for n, name in enumerate(names, start=1):
        placeholder = {"asyncpg": f"${n}", "psycopg": "%s", "sqlalchemy": f":{name}"}[style]
        cast = kinds[name]
        if style == "sqlalchemy":
            # ``:name::type`` would confuse SQLAlchemy's bind-parameter parser
            first, *rest = cast.split("::")
            expr = f"CAST({placeholder} AS {first})"
            for more in rest:
                expr = f"CAST({expr} AS {more})"
            args.append(expr)
        else:
            args.append(f"{placeholder}::{cast}")
    return _PUBLISH.format(fn=fn, args=", ".join(args))


def _ack_sql(style: str) -> str:
    tag = {"asyncpg": "$1::text", "psycopg": "%s::text", "sqlalchemy": "CAST(:tag AS text)"}
    return _ACK.format(tag=tag[style])


# -- recognising the caller's connection -----------------------------------------------------


def _loaded(module: str) -> Any:
    return sys.modules.get(module)


def _style(conn: Any, *, want_async: bool) -> str:
    """``asyncpg``, ``psycopg`` or ``sqlalchemy`` (with the sync/async flavour checked)."""
    asyncpg = _loaded("asyncpg")
    if asyncpg is not None:
        pool = _loaded("asyncpg.pool")
        kinds: tuple[type, ...] = (asyncpg.Connection,)
        if pool is not None:
            kinds += (pool.PoolConnectionProxy,)
        if isinstance(conn, kinds):
            return _checked("asyncpg", is_async=True, want_async=want_async, conn=conn)
        if isinstance(conn, asyncpg.Pool):
            raise TypeError(
                "give a connection of the transaction (pool.acquire()), not the pool itself"
            )
    psycopg = _loaded("psycopg")
    if psycopg is not None:
        if isinstance(conn, psycopg.AsyncConnection):
            return _checked("psycopg", is_async=True, want_async=want_async, conn=conn)
        if isinstance(conn, psycopg.Connection):
            return _checked("psycopg", is_async=False, want_async=want_async, conn=conn)
    sa_async = _loaded("sqlalchemy.ext.asyncio")
    if sa_async is not None and isinstance(conn, sa_async.AsyncSession | sa_async.AsyncConnection):
        return _checked("sqlalchemy", is_async=True, want_async=want_async, conn=conn)
    sa_orm = _loaded("sqlalchemy.orm")
    sa_engine = _loaded("sqlalchemy.engine")
    if (sa_orm is not None and isinstance(conn, sa_orm.Session)) or (
        sa_engine is not None and isinstance(conn, sa_engine.Connection)
    ):
        return _checked("sqlalchemy", is_async=False, want_async=want_async, conn=conn)
    raise TypeError(
        f"not a connection this helper knows: {type(conn).__module__}.{type(conn).__qualname__} "
        "(give an asyncpg connection, a psycopg connection, or an SQLAlchemy session or "
        "connection)"
    )


def _checked(style: str, *, is_async: bool, want_async: bool, conn: Any) -> str:
    if is_async != want_async:
        kind = f"{type(conn).__module__}.{type(conn).__qualname__}"
        if is_async:
            hint = "it is asynchronous: use the function without _sync, with await"
        else:
            hint = "it is synchronous: use the _sync function"
        raise TypeError(f"{kind}: {hint}")
    return style


# -- errors ----------------------------------------------------------------------------------


def _primary_message(exc: BaseException) -> str | None:
    """The server's message of a driver error (asyncpg, psycopg, or SQLAlchemy around them)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        diag = getattr(current, "diag", None)  # psycopg
        primary = getattr(diag, "message_primary", None)
        if isinstance(primary, str):
            return primary
        if hasattr(current, "sqlstate") and isinstance(getattr(current, "message", None), str):
            return str(current.message)  # type: ignore[attr-defined]  # asyncpg
        # SQLAlchemy's DBAPIError keeps the driver's error in .orig; its asyncpg adapter keeps
        # asyncpg's own error as the __cause__ of that
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return None


def _broker_error(exc: BaseException) -> BrokerError | None:
    message = _primary_message(exc)
    if message is None:
        return None
    match = _CODE_PREFIX.match(message)
    if match is None or match.group(1) not in _CODES:
        return None
    code = match.group(1)
    return error_from_frame({"code": code, "message": message[match.end() :]})


# -- arguments -------------------------------------------------------------------------------


#: the keyword options that are message properties (``expiration_ms`` is renamed)
_PROPERTY_OPTIONS: Final = (
    "message_id",
    "correlation_id",
    "reply_to",
    "content_type",
    "priority",
    "expiration_ms",
    "group_id",
)


def _properties(options: PublishOptions) -> str:
    """``properties`` merged with the named options (which win); ``None`` leaves one out."""
    merged: dict[str, Any] = dict(options.get("properties") or {})
    for name in _PROPERTY_OPTIONS:
        value = options.get(name)
        if value is None:
            continue
        if name == "expiration_ms":
            merged["expiration"] = str(value)
        else:
            merged[name] = value
    return json.dumps(merged)


def _result(raw: Any) -> PublishResult:
    return PublishResult.of(json.loads(raw) if isinstance(raw, str | bytes) else raw)


class _Call:
    """One SQL function call, ready for any of the three drivers."""

    def __init__(self, fn: str, names: list[str], values: list[Any], *, to_queue: bool) -> None:
        self.fn = fn
        self.names = names
        self.values = values
        self.to_queue = to_queue
        self.binary = fn == "publish_bytes"

    def sql(self, style: str) -> str:
        if self.fn == "ack":
            return _ack_sql(style)
        return _publish_sql(self.fn, style, to_queue=self.to_queue, binary=self.binary)

    def params(self, style: str) -> Any:
        if style == "sqlalchemy":
            return dict(zip(self.names, self.values, strict=True))
        return self.values


def _publish_call(
    target: list[str], body: Any, headers: Mapping[str, Any] | None, props: str, delay_ms: int
) -> _Call:
    """``target``: [queue] for publish_to_queue, else [exchange, routing_key]."""
    binary = isinstance(body, bytes | bytearray | memoryview)
    to_queue = len(target) == 1
    if to_queue:
        if binary:
            raise TypeError(
                "messagex.publish_to_queue takes a JSON body; publish bytes into a queue "
                'through the default exchange: publish_in_transaction(conn, "", queue, body)'
            )
        fn, names = "publish_to_queue", ["queue"]
    else:
        fn, names = ("publish_bytes" if binary else "publish"), ["exchange", "routing_key"]
    values = [
        *target,
        bytes(body) if binary else json.dumps(body),
        json.dumps(dict(headers or {})),
        props,
        int(delay_ms),
    ]
    return _Call(
        fn, [*names, "body", "headers", "properties", "delay_ms"], values, to_queue=to_queue
    )


def _ack_call(delivery_tag: str) -> _Call:
    if not isinstance(delivery_tag, str):
        raise TypeError("delivery_tag is the delivery's tag string (message.delivery_tag)")
    return _Call("ack", ["tag"], [delivery_tag], to_queue=False)


# -- running a call --------------------------------------------------------------------------


async def _run_async(conn: Any, call: _Call) -> Any:
    style = _style(conn, want_async=True)
    sql = call.sql(style)
    params = call.params(style)
    try:
        if style == "asyncpg":
            return await conn.fetchval(sql, *params)
        if style == "psycopg":
            cursor = await conn.execute(sql, params)
            row = await cursor.fetchone()
            return row[0]
        from sqlalchemy import text  # loaded: conn is an SQLAlchemy object

        result = await conn.execute(text(sql), params)
        return result.scalar_one()
    except Exception as exc:
        error = _broker_error(exc)
        if error is None:
            raise
        raise error from exc


def _run_sync(conn: Any, call: _Call) -> Any:
    style = _style(conn, want_async=False)
    sql = call.sql(style)
    params = call.params(style)
    try:
        if style == "psycopg":
            row = conn.execute(sql, params).fetchone()
            return row[0]
        from sqlalchemy import text

        return conn.execute(text(sql), params).scalar_one()
    except Exception as exc:
        error = _broker_error(exc)
        if error is None:
            raise
        raise error from exc


# -- the public functions --------------------------------------------------------------------


class PublishOptions(TypedDict, total=False):
    """The keywords of the publish helpers, as in :meth:`Client.publish
    <messagex_client.Client.publish>`. ``properties`` holds any message properties; the
    named ones override it. ``expiration_ms`` becomes the ``expiration`` property."""

    headers: Mapping[str, Any] | None
    properties: Mapping[str, Any] | None
    message_id: str | None
    correlation_id: str | None
    reply_to: str | None
    content_type: str | None
    priority: int | None
    expiration_ms: int | None
    group_id: str | None
    delay_ms: int


def _prepare(target: list[str], body: Any, options: PublishOptions) -> _Call:
    unknown = set(options) - set(PublishOptions.__annotations__)
    if unknown:
        raise TypeError(f"unexpected keyword arguments: {', '.join(sorted(unknown))}")
    props = _properties(options)
    return _publish_call(target, body, options.get("headers"), props, options.get("delay_ms", 0))


async def publish_in_transaction(
    conn: Any, exchange: str, routing_key: str, body: Any, **options: Unpack[PublishOptions]
) -> PublishResult:
    """Publish in the transaction open on ``conn`` (``messagex.publish``, or
    ``messagex.publish_bytes`` for a ``bytes`` body): the same routing, limits, TTL,
    priorities, groups, deduplication and result as :meth:`Client.publish
    <messagex_client.Client.publish>`, visible to consumers only once the caller commits; a
    rollback leaves nothing.

    ``conn``: an asyncpg connection, a psycopg ``AsyncConnection`` or an SQLAlchemy
    ``AsyncSession``/``AsyncConnection``. Keywords: :class:`PublishOptions` (``headers``,
    ``properties``, ``message_id``, ``correlation_id``, ``reply_to``, ``content_type``,
    ``priority``, ``expiration_ms``, ``group_id``, ``delay_ms``). ``exchange=""`` (the
    default exchange) with a queue's name as ``routing_key`` publishes straight into that
    queue, JSON or bytes.
    """
    call = _prepare([exchange, routing_key], body, options)
    return _result(await _run_async(conn, call))


async def publish_to_queue_in_transaction(
    conn: Any, queue: str, body: Any, **options: Unpack[PublishOptions]
) -> PublishResult:
    """Publish a JSON ``body`` straight into ``queue`` (``messagex.publish_to_queue``) in the
    transaction open on ``conn``; see :func:`publish_in_transaction`."""
    return _result(await _run_async(conn, _prepare([queue], body, options)))


async def ack_in_transaction(conn: Any, delivery_tag: str) -> bool:
    """Acknowledge a delivery (``messagex.ack``) in the transaction open on ``conn``, the one
    that records the delivery's effects. True: it was in flight under exactly this tag and is
    settled when the caller commits. False: it timed out, was released, settled or is
    unknown, so nothing changed: roll back the work, the message comes (or came) again.

    ``delivery_tag`` is :attr:`Message.delivery_tag <messagex_client.Message.delivery_tag>`.
    A message acked this way must not also be acked or nacked over the WebSocket.
    """
    return bool(await _run_async(conn, _ack_call(delivery_tag)))


def publish_in_transaction_sync(
    conn: Any, exchange: str, routing_key: str, body: Any, **options: Unpack[PublishOptions]
) -> PublishResult:
    """:func:`publish_in_transaction` for a psycopg ``Connection`` or an SQLAlchemy
    ``Session``/``Connection``."""
    return _result(_run_sync(conn, _prepare([exchange, routing_key], body, options)))


def publish_to_queue_in_transaction_sync(
    conn: Any, queue: str, body: Any, **options: Unpack[PublishOptions]
) -> PublishResult:
    """:func:`publish_to_queue_in_transaction` for a psycopg ``Connection`` or an SQLAlchemy
    ``Session``/``Connection``."""
    return _result(_run_sync(conn, _prepare([queue], body, options)))


def ack_in_transaction_sync(conn: Any, delivery_tag: str) -> bool:
    """:func:`ack_in_transaction` for a psycopg ``Connection`` or an SQLAlchemy
    ``Session``/``Connection``."""
    return bool(_run_sync(conn, _ack_call(delivery_tag)))
