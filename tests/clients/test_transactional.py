"""publish_in_transaction / ack_in_transaction (contract §18) through every driver the Python
client knows — asyncpg, psycopg (sync and async), SQLAlchemy (sync and async, session and
connection) — against a real broker and its database, with a real WebSocket consumer."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import messagex_client as mx
import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from app.storage.dsn import asyncpg_dsn
from tests.support import ADMIN_PASSWORD, ADMIN_USER, LiveServer, client, dsn_as

#: how long a delivery that must come may take (it comes in milliseconds)
DELIVERY_DEADLINE = 10.0


def _sa_url(url: str, driver: str) -> str:
    return asyncpg_dsn(url).replace("postgresql://", f"postgresql+{driver}://", 1)


class Adapter:
    """Runs one step inside a transaction of one driver: ``await tx(step, commit=...)``. The
    step gets the driver's connection (or session) and returns the helper's result (awaited
    for the async drivers; sync drivers run in a thread)."""

    def __init__(self, name: str, database_url: str) -> None:
        self.name = name
        self.url = database_url
        self.is_async = "-sync" not in name

    async def run(self, step: Callable[[Any], Any], *, commit: bool = True) -> Any:
        if self.is_async:
            async with self._async_tx(commit) as conn:
                return await step(conn)
        return await asyncio.to_thread(self._sync_run, step, commit)

    @asynccontextmanager
    async def _async_tx(self, commit: bool) -> AsyncIterator[Any]:
        if self.name == "asyncpg":
            conn = await asyncpg.connect(asyncpg_dsn(self.url))
            try:
                tx = conn.transaction()
                await tx.start()
                try:
                    yield conn
                except BaseException:
                    await tx.rollback()
                    raise
                await (tx.commit() if commit else tx.rollback())
            finally:
                await conn.close()
        elif self.name == "psycopg-async":
            async with await psycopg.AsyncConnection.connect(asyncpg_dsn(self.url)) as conn:
                yield conn
                await (conn.commit() if commit else conn.rollback())
        else:
            engine = create_async_engine(_sa_url(self.url, "asyncpg"))
            try:
                if self.name == "sqlalchemy-async-session":
                    async with AsyncSession(engine) as session:
                        yield session
                        await (session.commit() if commit else session.rollback())
                else:
                    async with engine.connect() as connection:
                        yield connection
                        await (connection.commit() if commit else connection.rollback())
            finally:
                await engine.dispose()

    def _sync_run(self, step: Callable[[Any], Any], commit: bool) -> Any:
        if self.name == "psycopg-sync":
            with psycopg.connect(asyncpg_dsn(self.url)) as conn:
                result = step(conn)
                conn.commit() if commit else conn.rollback()
                return result
        engine = create_engine(_sa_url(self.url, "psycopg"))
        try:
            if self.name == "sqlalchemy-sync-session":
                with Session(engine) as session:
                    result = step(session)
                    session.commit() if commit else session.rollback()
                    return result
            with engine.connect() as connection:
                result = step(connection)
                connection.commit() if commit else connection.rollback()
                return result
        finally:
            engine.dispose()

    # the helpers, sync or async as the driver is
    def publish(self, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        fn = mx.publish_in_transaction if self.is_async else mx.publish_in_transaction_sync
        return lambda conn: fn(conn, *args, **kwargs)

    def publish_to_queue(self, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        if self.is_async:
            return lambda conn: mx.publish_to_queue_in_transaction(conn, *args, **kwargs)
        return lambda conn: mx.publish_to_queue_in_transaction_sync(conn, *args, **kwargs)

    def ack(self, tag: str) -> Callable[[Any], Any]:
        fn = mx.ack_in_transaction if self.is_async else mx.ack_in_transaction_sync
        return lambda conn: fn(conn, tag)


ADAPTERS = [
    "asyncpg",
    "psycopg-async",
    "psycopg-sync",
    "sqlalchemy-async-session",
    "sqlalchemy-async-connection",
    "sqlalchemy-sync-session",
    "sqlalchemy-sync-connection",
]


async def _next(messages: mx.Subscription) -> mx.Message:
    async with asyncio.timeout(DELIVERY_DEADLINE):
        return await anext(messages)


def _stats(broker: LiveServer, queue: str) -> dict[str, Any]:
    with client(broker.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as rest:
        stats: dict[str, Any] = rest.get(f"/queues/{queue}").json()["stats"]
        return stats


@pytest.mark.parametrize("name", ADAPTERS)
async def test_publish_and_ack_in_transaction(broker: LiveServer, name: str) -> None:
    adapter = Adapter(name, broker.database_url)
    queue = f"tx-{name}"
    with client(broker.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as rest:
        assert rest.put(f"/queues/{queue}", json={}).status_code == 201
        r = rest.post(
            "/bindings", json={"exchange": "amq.topic", "queue": queue, "routing_key": f"{name}.*"}
        )
        assert r.status_code == 201, r.text
    async with (
        mx.Client(broker.base_url, username=ADMIN_USER, password=ADMIN_PASSWORD) as consumer,
        consumer.subscribe(queue, prefetch=1) as messages,
    ):
        # A rolled-back publish leaves nothing; the committed one after it is what comes.
        rolled_back = await adapter.run(
            adapter.publish("amq.topic", f"{name}.created", {"n": 0}, message_id=f"{name}-0"),
            commit=False,
        )
        assert rolled_back.queues == [queue]
        committed = await adapter.run(
            adapter.publish(
                "amq.topic",
                f"{name}.created",
                {"n": 1},
                message_id=f"{name}-1",
                headers={"h": "v"},
                priority=3,
            )
        )
        assert committed == mx.PublishResult(True, [queue], f"{name}-1", [], [])
        first = await _next(messages)
        assert (first.message_id, first.body, first.headers) == (f"{name}-1", {"n": 1}, {"h": "v"})
        assert first.routing_key == f"{name}.created"
        # bytes go through messagex.publish_bytes (here: the default exchange, into the
        # queue); JSON straight into a queue, publish_to_queue
        await adapter.run(adapter.publish("", queue, b"\x00raw\xff", message_id=f"{name}-b"))
        await adapter.run(adapter.publish_to_queue(queue, [1, 2], message_id=f"{name}-q"))

        # ack: rolled back, it settles nothing (the delivery stays in flight) ...
        assert await adapter.run(adapter.ack(first.delivery_tag), commit=False) is True
        assert _stats(broker, queue)["in_flight"] == 1
        # ... committed, it settles once and frees the prefetch slot: the next one comes
        assert await adapter.run(adapter.ack(first.delivery_tag)) is True
        second = await _next(messages)
        assert (second.message_id, second.body) == (f"{name}-b", b"\x00raw\xff")
        assert await adapter.run(adapter.ack(first.delivery_tag)) is False
        assert await adapter.run(adapter.ack("no-such-tag")) is False
        assert await adapter.run(adapter.ack(second.delivery_tag)) is True
        third = await _next(messages)
        assert (third.message_id, third.body) == (f"{name}-q", [1, 2])
        assert await adapter.run(adapter.ack(third.delivery_tag)) is True

        # a broker error is the client's exception with the contract's code
        with pytest.raises(mx.NotFound) as raised:
            await adapter.run(adapter.publish("no-such-exchange", "k", {}), commit=False)
        assert raised.value.code == "not_found"
        with pytest.raises(mx.BrokerError) as invalid:
            await adapter.run(adapter.publish("amq.topic", "k", {}, priority=999), commit=False)
        assert invalid.value.code == "validation_error"

    stats = _stats(broker, queue)
    assert (stats["ready"], stats["in_flight"]) == (0, 0)


async def test_the_wrong_kind_of_connection_is_refused(broker: LiveServer) -> None:
    """A sync connection given to the async helper (and the other way round) or an object
    that is no connection: a TypeError that says what to use, and nothing is called."""
    with (
        psycopg.connect(asyncpg_dsn(broker.database_url)) as sync_conn,
        pytest.raises(TypeError, match="_sync"),
    ):
        await mx.publish_in_transaction(sync_conn, "amq.topic", "k", {})
    conn = await asyncpg.connect(asyncpg_dsn(broker.database_url))
    try:
        with pytest.raises(TypeError, match="with await"):
            mx.ack_in_transaction_sync(conn, "tag")
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(asyncpg_dsn(broker.database_url), min_size=1, max_size=1)
    try:
        with pytest.raises(TypeError, match="not the pool"):
            await mx.ack_in_transaction(pool, "tag")
        async with pool.acquire() as pooled:  # a pool's connection is fine
            assert await mx.ack_in_transaction(pooled, "tag") is False
    finally:
        await pool.close()
    with pytest.raises(TypeError, match="not a connection"):
        await mx.ack_in_transaction(object(), "tag")
    with pytest.raises(TypeError, match="publish_to_queue takes a JSON body"):
        mx.publish_to_queue_in_transaction_sync(object(), "q", b"bytes")


async def test_an_application_role_with_only_the_grants_uses_the_helpers(
    broker: LiveServer,
) -> None:
    """The helpers need nothing beyond docs/operations.md's grants (their casts and
    ``::text`` included)."""
    role = f"tx_app_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(asyncpg_dsn(broker.database_url))
    database = await admin.fetchval("SELECT current_database()")
    await admin.execute(f"""
        CREATE ROLE {role} LOGIN;
        GRANT CONNECT ON DATABASE "{database}" TO {role};
        GRANT USAGE ON SCHEMA messagex TO {role};
        GRANT EXECUTE ON FUNCTION
            messagex.publish(text, text, jsonb, jsonb, jsonb, bigint),
            messagex.publish_bytes(text, text, bytea, jsonb, jsonb, bigint),
            messagex.publish_to_queue(text, jsonb, jsonb, jsonb, bigint),
            messagex.ack(text)
        TO {role};
    """)
    queue = "tx-role"
    try:
        with client(broker.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as rest:
            assert rest.put(f"/queues/{queue}", json={}).status_code == 201
        url = dsn_as(broker.database_url, role)
        app = await asyncpg.connect(url)
        try:
            async with app.transaction():
                await mx.publish_to_queue_in_transaction(app, queue, {"a": 1}, priority=1)
                await mx.publish_in_transaction(app, "", queue, b"\x01")
            with client(broker.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as rest:
                r = rest.post(f"/queues/{queue}/get", json={"max_messages": 2})
                got = r.json()["messages"]
            assert [m.get("body", m.get("body_base64")) for m in got] == [{"a": 1}, "AQ=="]
            async with app.transaction():
                for m in got:
                    assert await mx.ack_in_transaction(app, m["delivery_tag"]) is True
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await app.fetchval("SELECT count(*) FROM public.messages")
        finally:
            await app.close()
        assert _stats(broker, queue)["in_flight"] == 0
    finally:
        await admin.execute(f"""
            DROP OWNED BY {role};
            REVOKE ALL ON DATABASE "{database}" FROM {role};
            DROP ROLE {role};
        """)
        await admin.close()
