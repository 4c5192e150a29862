"""TopologyService against real PostgreSQL: statement counts, locking, races, listeners."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import asyncpg
import pytest
from sqlalchemy import event, text

from app.broker.topology import TopologyService
from app.domain.model import Exchange, ExchangeType, Permissions, Queue, Role, User
from app.errors import NotFound, PreconditionFailed
from app.storage.database import Database
from app.storage.dsn import asyncpg_dsn
from tests.support import async_wait_for

ADMIN = User("admin", Role.ADMIN, Permissions(".*", ".*", ".*"))


@pytest.fixture
def topology(db: Database) -> TopologyService:
    return TopologyService(db)


@contextmanager
def counting_statements(db: Database) -> Iterator[list[str]]:
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    engine = db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", record)


async def add_ready_message(db: Database, queue: str) -> None:
    async with db.transaction() as conn:
        await conn.execute(
            text(
                "INSERT INTO messages (queue_id, message_id, exchange, routing_key, body)"
                " SELECT id, 'm', '', name, '1'::bytea FROM queues WHERE name = :q"
            ),
            {"q": queue},
        )


async def exchange_exists(db: Database, name: str) -> bool:
    async with db.connect() as conn:
        found = await conn.execute(text("SELECT 1 FROM exchanges WHERE name = :n"), {"n": name})
        return found.first() is not None


async def waiting_for_lock(db: Database) -> bool:
    """Whether some other session of this database is blocked on a lock."""
    async with db.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            )
        )
        return rows.first() is not None


async def test_list_queues_reads_stats_of_a_whole_page_in_one_statement(
    db: Database, topology: TopologyService
) -> None:
    for i in range(3):
        await topology.declare_queue(ADMIN, Queue(f"q{i:02}"))

    with counting_statements(db) as small:
        page = await topology.list_queues(ADMIN, limit=100)
    assert len(page.items) == 3

    for i in range(3, 40):
        await topology.declare_queue(ADMIN, Queue(f"q{i:02}"))
        await add_ready_message(db, f"q{i:02}")
    with counting_statements(db) as large:
        page = await topology.list_queues(ADMIN, limit=100)
    assert len(page.items) == 40
    assert [info.stats.ready for info in page.items] == [0] * 3 + [1] * 37
    # The number of statements does not grow with the number of queues.
    assert len(large) == len(small) <= 2


async def test_a_new_queue_and_its_binding_are_one_statement_each(
    db: Database, topology: TopologyService
) -> None:
    """The per-request cost of declaring many queues (issue 19, "Many resources"): each is
    one statement on the hot path's executor, with no BEGIN/COMMIT round trips and nothing
    through the SQLAlchemy engine."""
    await topology.declare_exchange(ADMIN, Exchange("ex", ExchangeType.TOPIC))
    hot: list[str] = []
    connection = db.hot.connection

    def spy(method: Any) -> Any:
        def spied(*args: Any, **kwargs: Any) -> Any:
            hot.append(method.__name__)
            return method(*args, **kwargs)

        return spied

    db.hot.connection = spy(connection)  # type: ignore[method-assign]
    try:
        with counting_statements(db) as engine_statements:
            _, created = await topology.declare_queue(ADMIN, Queue("q"))
            binding, bound = await topology.create_binding(
                ADMIN, exchange="ex", queue="q", routing_key="a.#"
            )
    finally:
        del db.hot.connection
    assert (created, bound) == (True, True)
    # One pooled connection each, one statement on it (store.create_queue, store.bind).
    assert (engine_statements, hot) == ([], ["connection", "connection"])
    # The same again: found, not created, with the stored objects.
    again, created = await topology.declare_queue(ADMIN, Queue("q"))
    same, bound = await topology.create_binding(ADMIN, exchange="ex", queue="q", routing_key="a.#")
    assert (created, bound, same, again.queue) == (False, False, binding, Queue("q"))
    # A missing exchange is reported before a missing queue, as before.
    with pytest.raises(NotFound, match="'ghost'"):
        await topology.create_binding(ADMIN, exchange="ghost", queue="phantom")
    with pytest.raises(NotFound, match="'phantom'"):
        await topology.create_binding(ADMIN, exchange="ex", queue="phantom")


async def test_queue_deleted_listeners_run_after_commit(
    db: Database, topology: TopologyService
) -> None:
    await topology.declare_queue(ADMIN, Queue("doomed"))
    seen: list[tuple[str, bool]] = []

    async def failing(name: str) -> None:
        raise RuntimeError("a broken listener must not break the delete")

    async def record(name: str) -> None:
        async with db.connect() as conn:  # another connection: sees only committed state
            row = await conn.execute(text("SELECT 1 FROM queues WHERE name = :n"), {"n": name})
            seen.append((name, row.first() is None))

    topology.add_queue_deleted_listener(failing)
    topology.add_queue_deleted_listener(record)
    await topology.delete_queue(ADMIN, "doomed")
    assert seen == [("doomed", True)]

    # A refused delete tells nobody.
    await topology.declare_queue(ADMIN, Queue("full"))
    await add_ready_message(db, "full")
    with pytest.raises(PreconditionFailed):
        await topology.delete_queue(ADMIN, "full", if_empty=True)
    with pytest.raises(NotFound):
        await topology.delete_queue(ADMIN, "ghost")
    assert seen == [("doomed", True)]


async def test_concurrent_declares_create_once(topology: TopologyService) -> None:
    results = await asyncio.gather(
        *(topology.declare_queue(ADMIN, Queue("same", max_delivery_count=3)) for _ in range(10)),
        *(
            topology.declare_exchange(ADMIN, Exchange("same", ExchangeType.TOPIC))
            for _ in range(10)
        ),
    )
    created = [c for _, c in results]
    assert created.count(True) == 2


async def test_delete_if_empty_waits_for_an_uncommitted_publish(
    db: Database, topology: TopologyService
) -> None:
    """A message inserted by a transaction still open when the delete starts: the delete waits
    for it (the queue row's FOR UPDATE lock) and then refuses, instead of losing the message."""
    await topology.declare_queue(ADMIN, Queue("q"))
    async with db.transaction() as publish:
        await publish.execute(
            text(
                "INSERT INTO messages (queue_id, message_id, exchange, routing_key, body)"
                " SELECT id, 'm', '', name, '1'::bytea FROM queues WHERE name = 'q'"
            )
        )
        deleting = asyncio.create_task(topology.delete_queue(ADMIN, "q", if_empty=True))
        await async_wait_for(lambda: waiting_for_lock(db), message="the delete to block")
        assert not deleting.done()
    with pytest.raises(PreconditionFailed):
        await deleting
    assert (await topology.get_queue(ADMIN, "q")).stats.ready == 1


async def test_declaring_a_queue_with_a_dead_letter_queue_being_deleted(
    db: Database, topology: TopologyService
) -> None:
    """The delete of a dead-letter queue and a declare naming it are serialized."""
    await topology.declare_queue(ADMIN, Queue("dlq"))
    async with db.transaction() as declare:
        await declare.execute(
            text(
                "INSERT INTO queues (name, dead_letter_queue_id)"
                " SELECT 'work', id FROM queues WHERE name = 'dlq'"
            )
        )
        deleting = asyncio.create_task(topology.delete_queue(ADMIN, "dlq"))
        await async_wait_for(lambda: waiting_for_lock(db), message="the delete to block")
    with pytest.raises(PreconditionFailed, match="work"):
        await deleting


async def test_concurrent_deletes_of_the_last_bindings_remove_an_auto_delete_exchange(
    db: Database, topology: TopologyService
) -> None:
    for q in ("q1", "q2"):
        await topology.declare_queue(ADMIN, Queue(q))
    for round_ in range(5):
        name = f"auto{round_}"
        await topology.declare_exchange(
            ADMIN, Exchange(name, ExchangeType.FANOUT, auto_delete=True)
        )
        b1, _ = await topology.create_binding(ADMIN, exchange=name, queue="q1")
        b2, _ = await topology.create_binding(ADMIN, exchange=name, queue="q2")
        await asyncio.gather(
            topology.delete_binding(ADMIN, b1.id), topology.delete_binding(ADMIN, b2.id)
        )
        assert not await exchange_exists(db, name)


async def test_racing_deletes_and_binds_never_deadlock(
    db: Database, topology: TopologyService
) -> None:
    """Queue delete, exchange delete, bind and unbind on the same rows, all at once: each
    either succeeds or reports a clean NotFound/PreconditionFailed."""
    for round_ in range(8):
        ex, q, q2 = f"x{round_}", f"q{round_}", f"r{round_}"
        await topology.declare_exchange(ADMIN, Exchange(ex, ExchangeType.DIRECT, auto_delete=True))
        await topology.declare_queue(ADMIN, Queue(q))
        await topology.declare_queue(ADMIN, Queue(q2))
        b1, _ = await topology.create_binding(ADMIN, exchange=ex, queue=q, routing_key="a")
        await topology.create_binding(ADMIN, exchange=ex, queue=q2, routing_key="b")
        results = await asyncio.gather(
            topology.delete_queue(ADMIN, q),
            topology.delete_exchange(ADMIN, ex),
            topology.create_binding(ADMIN, exchange=ex, queue=q2, routing_key="c"),
            topology.delete_binding(ADMIN, b1.id),
            topology.delete_queue(ADMIN, q2),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                assert isinstance(result, (NotFound, PreconditionFailed)), repr(result)
        assert not await exchange_exists(db, ex)
    async with db.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM bindings"))).scalar() == 0


async def test_purge_leaves_a_message_claimed_meanwhile(
    db: Database, topology: TopologyService
) -> None:
    """A claim in progress (row locked, status about to become in_flight): purge waits for it
    and then leaves the now in-flight message alone."""
    await topology.declare_queue(ADMIN, Queue("q"))
    await add_ready_message(db, "q")
    await add_ready_message(db, "q")
    async with db.transaction() as claim:
        await claim.execute(
            text(
                "UPDATE messages SET status = 'in_flight', delivery_tag = 't',"
                " lease_expires_at = now() + interval '1 minute'"
                " WHERE id = (SELECT min(id) FROM messages)"
            )
        )
        purging = asyncio.create_task(topology.purge_queue(ADMIN, "q"))
        await async_wait_for(lambda: waiting_for_lock(db), message="the purge to block")
    assert await purging == 1
    stats = (await topology.get_queue(ADMIN, "q")).stats
    assert (stats.ready, stats.in_flight) == (0, 1)


@pytest.mark.parametrize("how", ["engine", "hot"])
async def test_a_bind_locks_its_exchange_for_its_update_up_front(
    db: Database, database_url: str, topology: TopologyService, how: str
) -> None:
    """A bind takes the exchange row's FOR NO KEY UPDATE (the routing_version trigger's
    lock) before anything else there, not KEY SHARE first: concurrent binds to one exchange
    then never share the row, and make no multixacts (docs/performance.md, "Scale")."""
    from app.storage import topology as store

    await topology.declare_exchange(ADMIN, Exchange("x", ExchangeType.TOPIC))
    await topology.declare_queue(ADMIN, Queue("q"))
    if how == "hot":  # the one-statement bind's text: the same lock on the exchange
        assert "FROM exchanges WHERE name = :exchange FOR NO KEY UPDATE" in str(store._BIND)
        return
    async with db.transaction() as binding:
        await store.lock_binding_ends(binding, "x", "q")  # no binding row yet
        other = await asyncpg.connect(asyncpg_dsn(database_url))
        try:
            # KEY SHARE, what the foreign key takes, is still compatible; the update is not
            await other.fetchval("SELECT id FROM exchanges WHERE name = 'x' FOR KEY SHARE NOWAIT")
            with pytest.raises(asyncpg.LockNotAvailableError):
                await other.fetchval(
                    "SELECT id FROM exchanges WHERE name = 'x' FOR NO KEY UPDATE NOWAIT"
                )
        finally:
            await other.close()


async def test_exchanges_onward_counts_e2e_bindings_exactly_under_concurrency(
    database_url: str,
) -> None:
    """exchanges.onward (migration 0009) = e2e bindings from it (+1 with an alternate), kept
    by the bindings trigger from the statement's own rows: multi-row statements, cascades,
    and a queue bind whose trigger waits for an uncommitted e2e bind all leave it exact."""
    import asyncpg

    from app.storage.dsn import asyncpg_dsn

    first = await asyncpg.connect(asyncpg_dsn(database_url))
    second = await asyncpg.connect(asyncpg_dsn(database_url))
    try:

        async def onward(name: str) -> int:
            value: int = await first.fetchval("SELECT onward FROM exchanges WHERE name = $1", name)
            return value

        ids = {
            name: await first.fetchval(
                "INSERT INTO exchanges (name, type) VALUES ($1, 'fanout') RETURNING id", name
            )
            for name in ("o-x", "o-y", "o-z")
        }
        q = await first.fetchval("INSERT INTO queues (name) VALUES ('o-q') RETURNING id")
        x, y, z = ids["o-x"], ids["o-y"], ids["o-z"]
        await first.execute(
            "INSERT INTO bindings (exchange_id, destination_exchange_id, routing_key) "
            "VALUES ($1, $2, 'a'), ($1, $2, 'b'), ($1, $3, ''), ($2, $3, '')",
            x,
            y,
            z,
        )
        assert [await onward(n) for n in ("o-x", "o-y", "o-z")] == [3, 1, 0]
        # A queue bind of x waits (in its trigger) for an uncommitted e2e bind of x.
        tx = first.transaction()
        await tx.start()
        await first.execute(
            "INSERT INTO bindings (exchange_id, destination_exchange_id, routing_key) "
            "VALUES ($1, $2, 'c')",
            x,
            y,
        )
        waiting = asyncio.ensure_future(
            second.execute("INSERT INTO bindings (exchange_id, queue_id) VALUES ($1, $2)", x, q)
        )
        pid = second.get_server_pid()

        async def blocked() -> bool:
            event = await first.fetchval(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid
            )
            return bool(event == "Lock")

        await async_wait_for(blocked, timeout=10)  # the second statement waits on x's row
        assert not waiting.done()
        await tx.commit()
        await waiting
        assert await onward("o-x") == 4
        await first.execute("DELETE FROM exchanges WHERE id = $1", z)  # cascade: x and y lose one
        assert [await onward(n) for n in ("o-x", "o-y")] == [3, 0]
        await first.execute(
            "UPDATE bindings SET routing_key = 'd' WHERE exchange_id = $1 AND routing_key = 'a'", x
        )
        assert await onward("o-x") == 3
        await first.execute("DELETE FROM bindings WHERE exchange_id = $1", x)
        assert await onward("o-x") == 0
    finally:
        await first.close()
        await second.close()


async def test_the_routers_one_entry_point_routes_one_message_through_the_graph(
    db: Database, topology: TopologyService
) -> None:
    """RoutingCache.route (what dead-lettering through an exchange calls): one message, one
    read, through e2e bindings and alternates; queue ids with the names; None when missing."""
    from app.broker.routing_cache import RoutingCache

    admin = User("admin", Role.ADMIN, Permissions())
    for name, kind, arguments in (
        ("r-alt", ExchangeType.FANOUT, {}),
        ("r-down", ExchangeType.TOPIC, {}),
        ("r-main", ExchangeType.DIRECT, {"alternate-exchange": "r-alt"}),
    ):
        await topology.declare_exchange(admin, Exchange(name, kind, arguments=arguments))
    for queue in ("r-q1", "r-q2"):
        await topology.declare_queue(admin, Queue(queue))
    await topology.create_binding(admin, exchange="r-alt", queue="r-q1")
    await topology.create_binding(admin, exchange="r-down", queue="r-q2", routing_key="a.*")
    await topology.create_binding(
        admin, exchange="r-main", destination_exchange="r-down", routing_key="a.b"
    )
    cache = RoutingCache()
    through = await cache.route(db.hot, "r-main", "a.b", {})
    caught = await cache.route(db.hot, "r-main", "z", {})
    assert through is not None
    assert list(through) == ["r-q2"]
    assert caught is not None
    assert list(caught) == ["r-q1"]
    assert through["r-q2"] != caught["r-q1"]
    assert await cache.route(db.hot, "r-missing", "k", {}) is None
    assert await cache.route(db.hot, "r-down", "a.c", {}) == through
