"""Where driver errors become domain errors: one classification for both ways storage talks to
PostgreSQL, the SQLAlchemy engine (``database.Database``) and the asyncpg hot path
(``fastpath.HotPath``).

A SQLAlchemy error wraps the asyncpg exception (``exc.orig.__cause__``); the hot path sees the
asyncpg exception itself. Everything here reads either form: ``driver_error`` unwraps it.

- Connection-level failures become ``Unavailable`` (503): the request did nothing and may be
  retried.
- Any other driver error becomes ``InternalError`` (500), logged by SQLSTATE and constraint
  only: its text may carry SQL and message data, which belong in no response and no log line.
- A broken constraint that means something to the caller (a queue deleted mid-publish, a
  missing dead-letter queue) is caught by that caller around the one statement that can break
  it, by the constraint's name (``CONSTRAINTS``); ``tables.NAMING_CONVENTION`` keeps the names
  stable.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from sqlalchemy import exc as sa_exc

from app.errors import BrokerError, DiskFull, InternalError, Unavailable

log = logging.getLogger("messagex.storage")

# -- what "the database cannot serve us now" looks like --------------------------------------

#: asyncpg errors without a SQLSTATE that mean the connection itself is gone or unusable
#: (these classes exactly: their subclasses, such as ``DataError`` for a parameter that does
#: not encode, are our own mistakes)
_DRIVER_CONNECTION_ERRORS: frozenset[type[BaseException]] = frozenset(
    {
        asyncpg.exceptions.ConnectionDoesNotExistError,
        asyncpg.exceptions.InterfaceError,
        asyncpg.exceptions.InternalClientError,
        # several hosts in DATABASE_URL and none of them the primary (target_session_attrs=
        # read-write mid-failover: the old primary is down, the standby not promoted yet)
        asyncpg.exceptions.TargetServerAttributeNotMatched,
    }
)

#: SQLSTATE classes that mean "the database cannot serve us now", whatever the statement:
#: 08 connection exception, 28 invalid authorization (only ever at connect), 53 insufficient
#: resources (too many connections, disk full, out of memory), 57 operator intervention
#: (admin/crash shutdown, cannot connect now, database dropped, query cancelled by timeout).
_UNAVAILABLE_SQLSTATE_CLASSES = frozenset({"08", "28", "53", "57"})

#: Single SQLSTATEs with the same meaning: 3D000 the database does not exist (dropped or not
#: created yet); 25006 a read-only transaction (we reached a standby, e.g. mid-failover);
#: 58030 io_error (the database's own storage failed a read or write: the statement did
#: nothing, and the fault is the server's, not the request's).
_UNAVAILABLE_SQLSTATES = frozenset({"3D000", "25006", "58030"})

#: 53100 disk_full: PostgreSQL could not extend a file ("No space left on device"). The
#: statement failed and its transaction rolled back; reads (and deletes, whose WAL fits) still
#: work. A 503 that says so (``DiskFull``), and a log line an operator can alert on
#: (docs/operations.md).
DISK_FULL = "53100"

#: 55000 (object not in prerequisite state) means "database is not currently accepting
#: connections" when it is raised while connecting (SQLAlchemy then has no statement; the hot
#: path had not got a connection yet).
_CONNECT_ONLY_SQLSTATES = frozenset({"55000"})

# -- SQLSTATEs and constraints that mean something to a caller --------------------------------

#: 54000 program_limit_exceeded: e.g. an index row over the btree limit (~2.7 kB): a binding's
#: key and arguments too large → 422
PROGRAM_LIMIT_EXCEEDED = "54000"

#: 25006 read_only_sql_transaction (one of the unavailable ones above): the connection's server
#: is not, or no longer, the primary. Both paths drop such a connection (database.py,
#: fastpath.py) so that the next one finds the primary.
READ_ONLY = "25006"

#: messages.queue_id → queues: a queue the publish routed to was deleted meanwhile
FK_MESSAGES_QUEUE = "fk_messages_queue_id_queues"
#: queues.dead_letter_queue_id → queues: declaring a queue whose dead-letter queue does not
#: exist (404), or deleting a queue that is another's dead-letter queue (409)
FK_DEAD_LETTER_QUEUE = "fk_queues_dead_letter_queue_id_queues"
#: publish_dedup.queue_id → queues: a queue with a deduplication window was deleted while a
#: publish claimed a message_id in it
FK_PUBLISH_DEDUP_QUEUE = "fk_publish_dedup_queue_id_queues"

#: Every constraint a caller maps to a domain error, by name, with where and to what.
CONSTRAINTS: dict[str, str] = {
    FK_MESSAGES_QUEUE: "storage.messages: QueueDeleted, the publisher routes again",
    FK_DEAD_LETTER_QUEUE: "storage.topology: NotFound on declare, PreconditionFailed on delete",
    FK_PUBLISH_DEDUP_QUEUE: "storage.dedup: QueueDeleted, the publisher routes again",
}


def driver_error(exc: BaseException) -> BaseException:
    """The asyncpg exception behind a SQLAlchemy error, or ``exc`` itself."""
    cause = getattr(getattr(exc, "orig", None), "__cause__", None)
    return cause if cause is not None else exc


def sqlstate(exc: BaseException) -> str | None:
    state = getattr(driver_error(exc), "sqlstate", None) or getattr(
        getattr(exc, "orig", None), "sqlstate", None
    )
    return state if isinstance(state, str) else None


def constraint(exc: BaseException) -> str | None:
    """The name of the constraint an integrity error broke, if any."""
    name = getattr(driver_error(exc), "constraint_name", None)
    return name if isinstance(name, str) else None


def is_unavailable(exc: BaseException, *, connecting: bool = False) -> bool:
    """True when ``exc`` means the database could not be reached, the connection broke, or
    the server refuses to serve us now: the request did nothing and may be retried (503).

    Covers the pool (checkout timeout), the socket (refused, reset, timed out), a server that
    terminated our sessions or refuses new ones (``ALTER DATABASE ... ALLOW_CONNECTIONS
    false``, shutdown, too many connections), a dropped database, and statement timeouts.
    ``connecting``: a bare asyncpg error was raised while getting a connection (SQLAlchemy's
    errors say so themselves).
    """
    if isinstance(exc, (sa_exc.TimeoutError, sa_exc.DisconnectionError)):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        connecting = exc.statement is None
    cause = driver_error(exc)
    if isinstance(cause, (OSError, TimeoutError, ConnectionError)):
        return True
    if type(cause) in _DRIVER_CONNECTION_ERRORS:
        return True
    state = sqlstate(exc)
    if state is None:
        return False
    if state[:2] in _UNAVAILABLE_SQLSTATE_CLASSES or state in _UNAVAILABLE_SQLSTATES:
        return True
    return connecting and state in _CONNECT_ONLY_SQLSTATES


def domain_error(exc: Exception, *, connecting: bool = False) -> BrokerError | None:
    """What a driver failure becomes: ``Unavailable`` (503) or ``InternalError`` (500, logged
    by SQLSTATE and constraint only); None for an exception that is not the driver's."""
    if is_unavailable(exc, connecting=connecting):
        state = sqlstate(exc)
        if state == DISK_FULL:
            log.warning("database out of disk space (sqlstate %s): writes fail", state)
            return DiskFull()
        where = f" (sqlstate {state})" if state else ""
        log.warning("database unavailable: %s%s", type(exc).__name__, where)
        return Unavailable()
    if isinstance(exc, (sa_exc.SQLAlchemyError, asyncpg.PostgresError)):
        log.error(
            "database error %s (sqlstate %s, constraint %s)",
            type(driver_error(exc)).__name__,
            sqlstate(exc),
            constraint(exc),
        )
        return InternalError()
    return None


@asynccontextmanager
async def guard() -> AsyncIterator[None]:
    """The SQLAlchemy path's edge: driver errors become domain errors (``domain_error``);
    domain errors raised inside pass through unchanged."""
    try:
        yield
    except BrokerError:
        raise
    except Exception as exc:
        mapped = domain_error(exc)
        if mapped is None:
            raise
        raise mapped from None
