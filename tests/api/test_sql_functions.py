"""Contract §18 through the real server: ``messagex.publish*`` and ``messagex.ack`` called
inside an application's own transaction (asyncpg), consumed over WebSocket.

Rollback and savepoints, the commit's wake-up, error codes, the REST result shape, ack's
true-exactly-once, the prefetch slot an SQL ack frees, length limits with parked maxlen
dead-lettering, and the grants an application role needs (and that its own objects cannot
stand in for the broker's)."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from app.storage.dsn import asyncpg_dsn
from tests.support import LiveServer, Sql, dsn_as, running_server, wait_for
from tests.support import test_settings as settings_for
from tests.wsclient import WsClient, bind, browse, declare_queue, stats

_names = itertools.count()


def fresh(prefix: str = "q") -> str:
    return f"{prefix}{next(_names)}x{uuid.uuid4().hex[:6]}"


@pytest.fixture
def pg(srv: LiveServer) -> Iterator[Sql]:
    """An application's own connection to the broker's database (superuser: the grants are
    tested with a role of their own)."""
    sql = Sql(asyncpg_dsn(srv.database_url))
    try:
        yield sql
    finally:
        sql.close()


def sql_publish(conn: Sql, exchange: str, key: str, body: Any, **kw: Any) -> Any:
    return conn.val(
        "SELECT messagex.publish($1, $2, $3, $4, $5, $6)",
        exchange,
        key,
        body,
        kw.get("headers", {}),
        kw.get("properties", {}),
        kw.get("delay_ms", 0),
    )


def to_queue(conn: Sql, queue: str, body: Any, **kw: Any) -> Any:
    return conn.val(
        "SELECT messagex.publish_to_queue($1, $2, $3, $4, $5)",
        queue,
        body,
        kw.get("headers", {}),
        kw.get("properties", {}),
        kw.get("delay_ms", 0),
    )


def bodies(adm: httpx.Client, queue: str) -> list[Any]:
    return [m.get("body", m.get("body_base64")) for m in browse(adm, queue)]


# ----------------------------------------------------------------------------- publish


def test_commit_delivers_to_a_subscribed_consumer_and_rollback_leaves_nothing(
    srv: LiveServer, adm: httpx.Client, pg: Sql
) -> None:
    q = fresh()
    declare_queue(adm, q)
    ws = WsClient.admin(srv.ws_url)
    try:
        ws.subscribe(q, prefetch=10)
        pg.exec("BEGIN")
        result = to_queue(pg, q, {"order": 1})
        assert result["routed"] is True
        assert result["queues"] == [q]
        assert result["rejected"] == []
        assert result["duplicates"] == []
        assert ws.quiet(0.2) == []  # nothing is visible before the commit
        assert bodies(adm, q) == []
        pg.exec("ROLLBACK")
        assert bodies(adm, q) == []

        with pg.tx():
            result = to_queue(pg, q, {"order": 2}, properties={"message_id": "m-2"})
        started = time.monotonic()
        frame = ws.delivery(timeout=5)
        assert time.monotonic() - started < 2  # woken by the commit's NOTIFY, not a poll
        assert frame["body"] == {"order": 2}
        assert frame["message_id"] == "m-2" == result["message_id"]
        assert frame["exchange"] == ""
        assert frame["routing_key"] == q
    finally:
        ws.close()


def test_a_savepoint_rolled_back_removes_just_its_publishes(adm: httpx.Client, pg: Sql) -> None:
    q = fresh()
    declare_queue(adm, q)

    def failing_part() -> None:
        with pg.tx():  # a savepoint
            to_queue(pg, q, "b")
            to_queue(pg, "no-such-queue-" + q, "c")

    with pg.tx():
        to_queue(pg, q, "a")
        with pytest.raises(asyncpg.PostgresError):
            failing_part()
        to_queue(pg, q, "d")
    assert bodies(adm, q) == ["a", "d"]


def test_the_result_is_the_rest_publish_result(adm: httpx.Client, pg: Sql) -> None:
    x, a, full = fresh("x"), fresh(), fresh()
    assert adm.put(f"/exchanges/{x}", json={"type": "topic"}).status_code == 201
    declare_queue(adm, a)
    declare_queue(adm, full, arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    bind(adm, x, a, "order.*")
    bind(adm, x, full, "#")
    for key in ("order.created", "other", ""):
        rest = adm.post(f"/exchanges/{x}/publish", json={"routing_key": key, "body": 1}).json()
        sql = sql_publish(pg, x, key, 1)
        assert set(sql) == set(rest)
        assert {k: v for k, v in sql.items() if k != "message_id"} == {
            k: v for k, v in rest.items() if k != "message_id"
        }
    assert stats(adm, a)["ready"] == 2
    assert stats(adm, full)["ready"] == 0


def test_stored_columns_binary_ttl_priority_group_and_delay(
    srv: LiveServer, adm: httpx.Client, pg: Sql
) -> None:
    q = fresh()
    declare_queue(adm, q, arguments={"x-message-ttl": 60000, "x-max-priority": 5})
    bind(adm, "amq.direct", q, q)
    props = {"priority": 9, "expiration": "1000", "group_id": "g1", "correlation_id": "c"}
    sql_publish(pg, "amq.direct", q, {"k": [1, 2]}, properties=props, headers={"h": 1})
    pg.val(
        "SELECT messagex.publish_bytes('amq.direct', $1, $2::bytea, delay_ms => 60000)",
        q,
        b"\x00\xff",
    )
    rows = pg.rows(
        'SELECT body, "binary", priority, group_id, headers, properties, '
        "extract(epoch FROM expires_at - available_at) * 1000 AS ttl, "
        "extract(epoch FROM available_at - created_at) * 1000 AS delay "
        "FROM messages WHERE queue_id = (SELECT id FROM queues WHERE name = $1) ORDER BY id",
        q,
    )
    assert orjson.loads(rows[0]["body"]) == {"k": [1, 2]}
    assert rows[0]["binary"] is False
    assert rows[0]["priority"] == 5
    assert rows[0]["group_id"] == "g1"
    assert rows[0]["ttl"] == 1000
    assert rows[0]["headers"] == {"h": 1}
    assert rows[0]["properties"]["correlation_id"] == "c"
    assert bytes(rows[1]["body"]) == b"\x00\xff"
    assert rows[1]["binary"] is True
    assert rows[1]["priority"] == 0
    assert rows[1]["group_id"] is None
    assert 59000 <= rows[1]["delay"] <= 61000
    assert rows[1]["ttl"] == 60000
    assert [m["status"] for m in browse(adm, q)] == ["ready", "delayed"]
    assert browse(adm, q)[1]["body_base64"] == "AP8="


@pytest.mark.parametrize(
    ("call", "code"),
    [
        ("messagex.publish('no-such-exchange', 'k', '1')", "not_found"),
        ("messagex.publish_to_queue('no-such-queue', '1')", "not_found"),
        ("messagex.publish('amq.topic', NULL, '1')", "validation_error"),
        ("messagex.publish(NULL, 'k', '1')", "validation_error"),
        ("messagex.publish_to_queue(NULL, '1')", "validation_error"),
        ("messagex.publish('amq.topic', 'k', NULL)", "validation_error"),
        ("messagex.publish('amq.topic', 'k', '1', '[]')", "validation_error"),
        ("messagex.publish('amq.topic', 'k', '1', '{}', '[]')", "validation_error"),
        (
            "messagex.publish('amq.topic', 'k', '1', '{}', '{\"priority\": 256}')",
            "validation_error",
        ),
        (
            "messagex.publish('amq.topic', 'k', '1', '{}', '{\"priority\": 1.5}')",
            "validation_error",
        ),
        (
            "messagex.publish('amq.topic', 'k', '1', '{}', '{\"priority\": \"1\"}')",
            "validation_error",
        ),
        (
            "messagex.publish('amq.topic', 'k', '1', '{}', '{\"expiration\": 5}')",
            "validation_error",
        ),
        (
            "messagex.publish('amq.topic', 'k', '1', '{}', '{\"expiration\": \"-5\"}')",
            "validation_error",
        ),
        (
            "messagex.publish('amq.topic', 'k', '1', '{}', '{\"expiration\": \"4294967296\"}')",
            "validation_error",
        ),
        (
            "messagex.publish('amq.topic', 'k', '1', '{}', '{\"group_id\": \"\"}')",
            "validation_error",
        ),
        (
            "messagex.publish('amq.topic', 'k', '1', '{}', '{\"message_id\": \"\"}')",
            "validation_error",
        ),
        (
            "messagex.publish('amq.topic', 'k', '1', '{}', '{\"colour\": \"red\"}')",
            "validation_error",
        ),
        ("messagex.publish('amq.topic', 'k', '1', '{}', '{}', -1)", "validation_error"),
        ("messagex.publish('amq.topic', 'k', '1', '{}', '{}', 604800001)", "validation_error"),
        (
            "messagex.publish_bytes('amq.topic', 'k', decode(repeat('00', 1048577), 'hex'))",
            "message_too_large",
        ),
        (
            "messagex.publish('amq.topic', 'k', '1', jsonb_build_object('h', repeat('x', 70000)))",
            "message_too_large",
        ),
    ],
)
def test_errors_carry_the_contract_code_and_store_nothing(
    adm: httpx.Client, pg: Sql, call: str, code: str
) -> None:
    q = fresh()
    declare_queue(adm, q)
    bind(adm, "amq.topic", q, "#")

    def work() -> None:
        with pg.tx():
            to_queue(pg, q, "before")  # the error rolls the caller's work back too
            pg.val(f"SELECT {call}")

    with pytest.raises(asyncpg.PostgresError) as caught:
        work()
    assert str(caught.value).startswith(f"{code}: "), caught.value
    assert stats(adm, q)["ready"] == 0

    def alone() -> None:
        with pg.tx():  # a savepoint
            pg.val(f"SELECT {call}")

    with pg.tx():  # and a call refused on its own stores nothing either
        with pytest.raises(asyncpg.PostgresError):
            alone()
        to_queue(pg, q, "after")
    assert bodies(adm, q) == ["after"]


def test_length_limits_reject_and_drop_head_and_park_for_maxlen_dead_lettering(
    adm: httpx.Client, pg: Sql
) -> None:
    rej, head, dlq, headdl, rejdl, dlq2 = (fresh() for _ in range(6))
    declare_queue(adm, rej, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    declare_queue(adm, head, arguments={"x-max-length-bytes": 4})
    declare_queue(adm, dlq)
    declare_queue(adm, headdl, dead_letter_queue=dlq, arguments={"x-max-length": 1})
    declare_queue(adm, dlq2)
    limited = {"x-max-length": 1, "x-overflow": "reject-publish-dlx"}
    declare_queue(adm, rejdl, dead_letter_queue=dlq2, arguments=limited)
    results = []
    with pg.tx():
        for body in (1, 22, 333):
            results.append(to_queue(pg, rej, body))
            to_queue(pg, head, body)
            to_queue(pg, headdl, body)
            to_queue(pg, rejdl, body, delay_ms=60000 if body == 333 else 0)
    assert [r["queues"] for r in results] == [[rej], [], []]
    assert [r["rejected"] for r in results] == [[], [rej], [rej]]
    assert bodies(adm, rej) == [1]
    assert bodies(adm, head) == [333]  # drop-head: 3 bytes, within 4
    # reject-publish-dlx: the rejected copy is dead-lettered; a delayed one is never rejected
    rejected = wait_for(lambda: browse(adm, dlq2), timeout=5)
    assert [m["body"] for m in rejected] == [22]
    assert rejected[0]["headers"]["x-death"][0]["reason"] == "maxlen"
    assert [m["status"] for m in browse(adm, rejdl)] == ["ready", "delayed"]
    # The shed copies of a queue with a dead-letter target: out of its ready set at once,
    # dead-lettered (maxlen) by the broker within a second.
    assert stats(adm, headdl)["ready"] == 1

    def dead_lettered() -> list[dict[str, Any]] | None:
        found = browse(adm, dlq)
        return found if len(found) == 2 else None

    moved = wait_for(dead_lettered, timeout=5)
    assert [m["body"] for m in moved] == [1, 22]
    assert {m["headers"]["x-death"][0]["reason"] for m in moved} == {"maxlen"}
    assert bodies(adm, headdl) == [333]


def test_the_default_exchange_routes_by_queue_name(adm: httpx.Client, pg: Sql) -> None:
    q = fresh()
    declare_queue(adm, q)
    assert sql_publish(pg, "", q, "via default")["queues"] == [q]
    assert browse(adm, q)[0]["exchange"] == ""
    with pytest.raises(asyncpg.PostgresError, match=r"^not_found: "):
        sql_publish(pg, "", "no-such-queue-" + q, 1)


def test_deduplication_window(adm: httpx.Client, pg: Sql) -> None:
    q, plain = fresh(), fresh()
    declare_queue(adm, q, arguments={"x-deduplication-window-seconds": 60})
    declare_queue(adm, plain)
    x = fresh("x")
    assert adm.put(f"/exchanges/{x}", json={"type": "fanout"}).status_code == 201
    bind(adm, x, q)
    bind(adm, x, plain)
    first = sql_publish(pg, x, "", 1, properties={"message_id": "once"})
    again = sql_publish(pg, x, "", 2, properties={"message_id": "once"})
    assert first["queues"] == [q, plain]
    assert first["duplicates"] == []
    assert again["queues"] == [plain]
    assert again["duplicates"] == [q]
    assert again["routed"] is True
    assert bodies(adm, q) == [1]
    assert bodies(adm, plain) == [1, 2]


# ----------------------------------------------------------------------------- ack


def ack(conn: Sql, tag: str | None) -> bool:
    found = conn.val("SELECT messagex.ack($1)", tag)
    assert isinstance(found, bool)
    return found


def test_ack_is_true_exactly_once_for_a_tag_in_flight(
    srv: LiveServer, adm: httpx.Client, pg: Sql
) -> None:
    q = fresh()
    declare_queue(adm, q)
    ws = WsClient.admin(srv.ws_url)
    try:
        ws.subscribe(q, prefetch=1)
        for body in ("m1", "m2", "m3"):
            to_queue(pg, q, body)
        first = ws.delivery()
        assert first["body"] == "m1"
        assert ws.quiet(0.2) == []  # prefetch 1: held
        tag = first["delivery_tag"]

        pg.exec("BEGIN")
        assert ack(pg, tag) is True
        assert ack(pg, tag) is False  # settled in this very transaction
        pg.exec("ROLLBACK")
        assert stats(adm, q)["in_flight"] == 1  # a rolled-back ack changed nothing

        with pg.tx():
            assert ack(pg, tag) is True
        # the holding subscription's slot is free after the commit: the next one comes
        started = time.monotonic()
        second = ws.delivery(timeout=5)
        assert second["body"] == "m2"
        assert time.monotonic() - started < 2
        assert ack(pg, tag) is False  # settled
        assert ws.ack(second["delivery_tag"])["type"] != "ERROR"
        assert ack(pg, second["delivery_tag"]) is False  # settled by the consumer

        third = ws.delivery()
        assert ws.nack(third["delivery_tag"], requeue=True)["type"] != "ERROR"
        again = ws.delivery()
        assert ack(pg, third["delivery_tag"]) is False  # released (redelivered anew)
        for unknown in ("", "abc", "999999999.x", f"{again['delivery_tag']}x", None):
            assert ack(pg, unknown) is False
        assert stats(adm, q)["in_flight"] == 1
        assert ack(pg, again["delivery_tag"]) is True
        wait_for(lambda: stats(adm, q)["in_flight"] == 0 and stats(adm, q)["ready"] == 0)
    finally:
        ws.close()


def test_commit_and_ack_reach_a_consumer_on_another_broker_process(
    srv: LiveServer, adm: httpx.Client, pg: Sql
) -> None:
    """Two broker processes on one database: the subscriber is on the second. Only the NOTIFY
    tells it about the SQL publish and the SQL ack (no process published or acked)."""
    q = fresh()
    declare_queue(adm, q)
    with running_server(settings_for(srv.database_url)) as other:
        ws = WsClient.admin(other.ws_url)
        try:
            ws.subscribe(q, prefetch=1)
            with pg.tx():
                to_queue(pg, q, "one")
                to_queue(pg, q, "two")
            first = ws.delivery(timeout=5)
            assert first["body"] == "one"
            assert ws.quiet(0.2) == []  # prefetch 1
            with pg.tx():
                assert ack(pg, first["delivery_tag"]) is True
            assert ws.delivery(timeout=5)["body"] == "two"
        finally:
            ws.close()


def test_ack_of_a_timed_out_delivery_is_false_and_changes_nothing(
    adm: httpx.Client, pg: Sql
) -> None:
    q = fresh()
    declare_queue(adm, q)
    to_queue(pg, q, "p")
    got = adm.post(f"/queues/{q}/get", json={"max_messages": 1})
    assert got.status_code == 200, got.text
    tag = got.json()["messages"][0]["delivery_tag"]
    # its lease ran out (the sweep has not released it yet): timed out
    pg.exec(
        "UPDATE messages SET lease_expires_at = now() - interval '1 second' "
        "WHERE delivery_tag = $1",
        tag,
    )
    assert ack(pg, tag) is False
    assert pg.val("SELECT count(*) FROM messages WHERE delivery_tag = $1", tag) in (
        0,
        1,
    )
    # a pull delivery in flight is acked by SQL like a WebSocket one
    to_queue(pg, q, "p2")
    tag2 = wait_for(
        lambda: [
            m["delivery_tag"]
            for m in adm.post(f"/queues/{q}/get", json={"max_messages": 1}).json()["messages"]
            if m["body"] == "p2"
        ]
    )[0]
    assert ack(pg, tag2) is True


# ----------------------------------------------------------------------------- grants


def test_an_application_role_needs_only_usage_and_execute_and_cannot_hijack(
    srv: LiveServer, adm: httpx.Client, pg: Sql
) -> None:
    role = fresh("app_role_")
    q = fresh()
    declare_queue(adm, q)
    database = pg.val("SELECT current_database()")
    pg.exec(f"""
        CREATE ROLE {role} LOGIN;
        GRANT CONNECT, CREATE ON DATABASE "{database}" TO {role};
        GRANT USAGE ON SCHEMA messagex TO {role};
        GRANT EXECUTE ON FUNCTION
            messagex.publish(text, text, jsonb, jsonb, jsonb, bigint),
            messagex.publish_bytes(text, text, bytea, jsonb, jsonb, bigint),
            messagex.publish_to_queue(text, jsonb, jsonb, jsonb, bigint),
            messagex.ack(text)
        TO {role};
    """)
    app = Sql(dsn_as(srv.database_url, role, database), codec=False)
    try:
        # its own look-alikes, first in its search_path and in pg_temp
        app.exec(f"""
            CREATE SCHEMA {role} AUTHORIZATION {role};
            CREATE TABLE {role}.queues (id bigint, name text, arguments jsonb);
            CREATE TABLE {role}.messages (queue_id bigint, body bytea);
            CREATE TABLE {role}.publish_settings (id int, max_message_bytes bigint,
                                                  max_header_bytes bigint);
            INSERT INTO {role}.publish_settings VALUES (1, 0, 0);
            CREATE FUNCTION {role}.array_append(anycompatiblearray, anycompatible)
                RETURNS anycompatiblearray LANGUAGE sql AS 'SELECT $1';
            CREATE TEMPORARY TABLE queues (id bigint, name text);
            SET search_path = {role}, public;
        """)
        result = orjson.loads(app.val("SELECT messagex.publish_to_queue($1, '\"hi\"')", q))
        assert result["queues"] == [q]
        assert app.val(f"SELECT count(*) FROM {role}.messages") == 0
        assert bodies(adm, q) == ["hi"]
        for forbidden in (
            "SELECT count(*) FROM public.messages",
            "SELECT messagex._topic_matches('a', 'a')",
            "SELECT messagex._publish(NULL, 'q', 'q', '\\x00', true, '{}', '{}', 0)",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                app.val(forbidden)
        got = adm.post(f"/queues/{q}/get", json={"max_messages": 1}).json()["messages"][0]
        assert app.val("SELECT messagex.ack($1)", got["delivery_tag"]) is True
        assert stats(adm, q)["in_flight"] == 0
    finally:
        app.close()
        pg.exec(f"""
            DROP SCHEMA IF EXISTS {role} CASCADE;
            DROP OWNED BY {role};
            REVOKE ALL ON DATABASE "{database}" FROM {role};
            DROP ROLE {role};
        """)


def test_the_broker_writes_its_size_limits_for_sql(srv: LiveServer, pg: Sql) -> None:
    row = pg.rows("SELECT max_message_bytes, max_header_bytes FROM publish_settings")[0]
    assert row is not None
    assert row["max_message_bytes"] == srv.settings.max_message_bytes
    assert row["max_header_bytes"] == srv.settings.max_header_bytes
