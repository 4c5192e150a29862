"""The hot statements use the indexes they were written for, whatever the backlog.

Asserted through ``EXPLAIN (FORMAT JSON)`` on a real PostgreSQL holding a backlog, for the
custom plan (the first executions of a prepared statement) and the generic plan (what
PostgreSQL may switch to after five), with statistics taken by ANALYZE:

- the claim walks ``ix_messages_claim`` (never a sequential scan or a sort of the queue),
  with the backlog in the claimed queue and in another one;
- the dispatcher's poll (which queues have ready rows) is a loose index scan of
  ``ix_messages_claim``, one probe per queue, never a walk of a queue's backlog;
- a batched ACK finds its rows by primary key even when many deliveries are in flight (it
  used to walk the partial in-flight index, a cost that grew with the deliveries in flight);
- the publish's route read does not read the bindings of an exchange whose compiled copy
  is current.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import asyncpg
import pytest

from app.storage import deliveries, planner, queries
from app.storage.dsn import asyncpg_dsn
from app.storage.fastpath import HotPath, Statement

BACKLOG = 50_000
IN_FLIGHT = 5_000


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        busy = await c.fetchval("INSERT INTO queues (name) VALUES ('busy') RETURNING id")
        probed = await c.fetchval("INSERT INTO queues (name) VALUES ('probed') RETURNING id")
        # A backlog of ready rows in both queues, and deliveries in flight in the busy one.
        await c.execute(
            """
            INSERT INTO messages (queue_id, message_id, exchange, routing_key, body)
            SELECT CASE WHEN g % 10 = 0 THEN $2::bigint ELSE $1::bigint END,
                   'm' || g, '', 'k', '\\x00'
            FROM generate_series(1, $3) AS g
            """,
            busy,
            probed,
            BACKLOG,
        )
        await c.execute(
            """
            UPDATE messages SET status = 'in_flight', delivery_tag = id::text || '.t',
                   lease_expires_at = now() + interval '1 hour', delivered_at = now(),
                   owner_connection = gen_random_uuid()
            WHERE id IN (SELECT id FROM messages WHERE queue_id = $1 ORDER BY id LIMIT $2)
            """,
            busy,
            IN_FLIGHT,
        )
        await c.execute("ANALYZE messages")
        yield c
    finally:
        await c.close()


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


async def _plan(
    conn: asyncpg.Connection, statement: Statement, params: dict[str, Any], mode: str
) -> list[dict[str, Any]]:
    await conn.execute(f"SET plan_cache_mode = {mode}")
    raw = await conn.fetchval("EXPLAIN (FORMAT JSON) " + statement.sql, *statement.args(params))
    document = raw if isinstance(raw, list) else json.loads(raw)
    return list(_nodes(document[0]["Plan"]))


def _scans(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plan's reads of the messages table (not the UPDATE/DELETE node itself)."""
    return [
        n for n in nodes if n.get("Relation Name") == "messages" and n["Node Type"] != "ModifyTable"
    ]


def _limited(node: dict[str, Any]) -> bool:
    """Every path from ``node`` down to a scan of messages passes through a Limit."""
    if node["Node Type"] == "Limit":
        return True
    if node.get("Relation Name") == "messages":
        return False
    return all(_limited(child) for child in node.get("Plans", ()))


async def _in_flight(conn: asyncpg.Connection, n: int) -> list[asyncpg.Record]:
    """(id, delivery tag, owner connection) of n deliveries in flight."""
    return list(
        await conn.fetch(
            "SELECT id, delivery_tag, owner_connection::text FROM messages "
            "WHERE status = 'in_flight' ORDER BY id LIMIT $1",
            n,
        )
    )


MODES = ["force_custom_plan", "force_generic_plan"]


def claim_params(queue_id: int, n: int = 100) -> dict[str, Any]:
    """Parameters of a WebSocket claim of up to ``n`` rows of ``queue_id``."""
    return {
        "queue_id": queue_id,
        "n": n,
        "lease_seconds": 30.0,
        "process_id": str(uuid.uuid4()),
        "owners": [str(uuid.uuid4())] * n,
        "owner_user": None,
    }


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("queue", ["busy", "probed"])
async def test_the_claim_walks_its_index(conn: asyncpg.Connection, mode: str, queue: str) -> None:
    queue_id = await conn.fetchval("SELECT id FROM queues WHERE name = $1", queue)
    nodes = await _plan(conn, queries.CLAIM, claim_params(queue_id), mode)
    scans = _scans(nodes)
    assert any(n.get("Index Name") == "ix_messages_claim" for n in scans), nodes
    assert not any(n["Node Type"] == "Seq Scan" for n in scans), nodes
    # The picked rows are numbered in claim order: a sort of at most n rows, above the Limit.
    for sort in (n for n in nodes if n["Node Type"] == "Sort"):
        assert _limited(sort), sort


@pytest.mark.parametrize("mode", MODES)
async def test_the_claim_of_queues_due_together_walks_the_index_of_each(
    conn: asyncpg.Connection, mode: str
) -> None:
    """CLAIM_DUE: per queue of the unnest, the plain claim's walk of ix_messages_claim (and
    one probe of ix_messages_priority) under a Limit, and one probe of ix_messages_claim for
    its next due copy: never a sequential scan, never a sort of a backlog."""
    ids = [r[0] for r in await conn.fetch("SELECT id FROM queues ORDER BY id")]
    wants = [deliveries.ClaimWant(q, [str(uuid.uuid4())] * 100, 30.0) for q in ids]
    params = deliveries.claim_due_params(wants, str(uuid.uuid4()))
    nodes = await _plan(conn, queries.CLAIM_DUE, params, mode)
    scans = _scans(nodes)
    assert any(n.get("Index Name") == "ix_messages_claim" for n in scans), nodes
    assert not any(n["Node Type"] == "Seq Scan" for n in scans), nodes
    for sort in (n for n in nodes if n["Node Type"] == "Sort"):
        assert _limited(sort), sort


@pytest.mark.parametrize("mode", MODES)
async def test_the_poll_probes_each_queue_once(conn: asyncpg.Connection, mode: str) -> None:
    """READY_QUEUES (every queue with ready rows) and READY_QUEUES_OF (given queues): every
    read of messages walks ix_messages_claim under a Limit (one row per queue, whatever its
    backlog), and the answers are each queue's first ready row."""
    ids = [r[0] for r in await conn.fetch("SELECT id FROM queues ORDER BY id")]
    for statement, params in (
        (queries.READY_QUEUES, {"after": 0}),
        (queries.READY_QUEUES_OF, {"queue_ids": ids}),
    ):
        nodes = await _plan(conn, statement, params, mode)
        scans = _scans(nodes)
        assert scans, nodes
        assert all(n.get("Index Name") == "ix_messages_claim" for n in scans), scans
        assert _limited(nodes[0]), nodes
        rows = await conn.fetch(statement.sql, *statement.args(params))
        assert sorted(r[0] for r in rows) == ids
        assert all(r[1] <= 0 for r in rows)  # their first ready rows are due


@pytest.mark.parametrize("mode", MODES)
async def test_batched_acks_find_their_rows_by_primary_key(
    conn: asyncpg.Connection, mode: str
) -> None:
    rows = await _in_flight(conn, 50)
    ids, tags = [r[0] for r in rows], [r[1] for r in rows]
    for statement, params in (
        (queries.ACK_MANY, {"ids": ids, "tags": tags, "owners": [r[2] for r in rows]}),
        (queries.ACK_PULL_MANY, {"ids": ids, "tags": tags, "owner_user": "u"}),
    ):
        nodes = await _plan(conn, statement, params, mode)
        scans = _scans(nodes)
        assert scans, nodes
        assert all(n.get("Index Name") == "pk_messages" for n in scans), scans


@pytest.mark.parametrize("mode", MODES)
async def test_a_pull_ack_and_a_nack_find_their_row_by_primary_key(
    conn: asyncpg.Connection, mode: str
) -> None:
    [row] = await _in_flight(conn, 1)
    for statement, params in (
        (queries.ACK_PULL_MANY, {"ids": [row[0]], "tags": [row[1]], "owner_user": "u"}),
        (
            Statement(deliveries.LOCK_BY_TAG),
            {"id": row[0], "tag": row[1], "owner_connection": None, "owner_user": "u"},
        ),
    ):
        nodes = await _plan(conn, statement, params, mode)
        assert [n.get("Index Name") for n in _scans(nodes)] == ["pk_messages"], nodes


# -- plans made while the table looked empty (app/storage/planner.py) -----------------------

_OWNER = str(uuid.uuid4())


def _publish(queue_id: int, owner: str | None = None) -> dict[str, Any]:
    """Parameters of a one-message publish to ``queue_id``; with ``owner``, for the
    INSERT that hands the copy off to that connection."""
    params: dict[str, Any] = {
        "receipt": str(uuid.uuid4()),
        "copy_msg": [1],
        "copy_queue": [queue_id],
        "exchange": [""],
        "message_id": ["m"],
        "routing_key": ["k"],
        "headers": ["{}"],
        "properties": ["{}"],
        "body": [b"1"],
        "is_binary": [False],
        "delay_ms": [0],
        "copy_priority": [None],
        "expiration_ms": [None],
    }
    if owner is not None:
        params.update(process_id=owner, copy_owner=[owner], copy_lease=[30.0])
    return params


#: statement, and its parameters for a queue id
_AFTER_EMPTY: dict[str, tuple[Statement, Callable[[int], dict[str, Any]]]] = {
    "claim": (
        queries.CLAIM,
        lambda q: {
            "queue_id": q,
            "n": 100,
            "lease_seconds": 30.0,
            "process_id": _OWNER,
            "owners": [_OWNER] * 100,
            "owner_user": None,
        },
    ),
    "claim of queues due together": (
        queries.CLAIM_DUE,
        lambda q: deliveries.claim_due_params(
            [deliveries.ClaimWant(q, [_OWNER] * 100, 30.0)], _OWNER
        ),
    ),
    "next due": (queries.NEXT_DUE, lambda q: {"queue_id": q}),
    "poll of queues": (queries.READY_QUEUES_OF, lambda q: {"queue_ids": [q]}),
    "ack": (
        queries.ACK_MANY,
        lambda q: {"ids": [1, 2], "tags": ["1.a", "2.b"], "owners": [_OWNER] * 2},
    ),
    "pull ack": (
        queries.ACK_PULL_MANY,
        lambda q: {"ids": [1], "tags": ["1.a"], "owner_user": "u"},
    ),
    "publish handing off": (
        queries.INSERT_COPIES_HANDING_OFF,
        lambda q: _publish(q, _OWNER),
    ),
    "nack": (
        Statement(deliveries.LOCK_BY_TAG),
        lambda q: {"id": 1, "tag": "1.a", "owner_connection": _OWNER, "owner_user": None},
    ),
    "ack timeouts": (Statement(deliveries.LOCK_EXPIRED), lambda q: {"n": 100}),
    "release a connection": (
        Statement(deliveries.LOCK_OWNED_BY_CONNECTIONS),
        lambda q: {"owners": [_OWNER]},
    ),
    "release a process": (
        Statement(deliveries.LOCK_OWNED_BY_PROCESSES),
        lambda q: {"processes": [_OWNER]},
    ),
    "reconcile": (Statement(deliveries.STILL_IN_FLIGHT), lambda q: {"owners": [_OWNER]}),
    "resubscribe": (
        Statement(deliveries.OWNED_TAGS),
        lambda q: {"owner": _OWNER, "queue_id": q},
    ),
    "expiry probe": (Statement(deliveries.ANY_EXPIRED_READY), lambda q: {"lead_s": 0}),
    "full poll": (queries.READY_QUEUES, lambda q: {"after": 0}),
}


#: the column each index of messages must be searched by for a read not to grow with the
#: table; None: a partial index of the deliveries in flight, which the prefetch and the pull
#: deliveries outstanding bound, not the backlog
_LEADING = {
    "pk_messages": "id",
    "ix_messages_expiry": None,
    "ix_messages_claim": "queue_id",
    "ix_messages_priority": "queue_id",
    "ix_messages_queue": "queue_id",
    "ix_messages_lease": None,
    "ix_messages_owner": None,
}


def _unbounded(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The reads of messages in ``plan`` that grow with the table: a sequential scan, or an
    index scan not searched by the index's leading column (a walk of the whole index)."""
    found = []
    for node in _nodes(plan):
        if node["Node Type"] == "Seq Scan" and node.get("Relation Name") == "messages":
            found.append(node)
        elif node.get("Index Name") in _LEADING:
            leading = _LEADING[node["Index Name"]]
            condition = node.get("Index Cond", "")
            # "> ": the full poll's loose index scan, a probe per queue from the last one,
            # each under LIMIT 1
            if leading is not None and not re.search(rf"\b{leading} [=>] ", condition):
                found.append(node)
    return found


def _literal(value: Any) -> str:
    """A SQL literal of a parameter value (untyped: EXECUTE casts it to the parameter's type)."""
    if value is None:
        return "NULL"
    if isinstance(value, list):
        text = "{" + ",".join(_element(e) for e in value) + "}"
    elif isinstance(value, bytes):
        text = "\\x" + value.hex()
    else:
        text = str(value)
    return "'" + text.replace("'", "''") + "'"


def _element(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return '"\\\\x' + value.hex() + '"'
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


@pytest.mark.parametrize("name", list(_AFTER_EMPTY))
async def test_a_plan_made_while_the_table_looked_empty_still_uses_an_index(
    database_url: str, name: str
) -> None:
    """Autovacuum leaves an emptied messages table at 0 pages and 0 rows, and PostgreSQL
    then replans what reads it as if it were empty: a prepared statement would keep such a
    plan while a backlog builds (app/storage/planner.py). With the broker's connection
    settings, the plan is made six times while the table looks empty (after five, PostgreSQL
    may keep a generic one), then the table fills up, and the plan must not read it from end
    to end."""
    statement, params_for = _AFTER_EMPTY[name]
    conn = await asyncpg.connect(asyncpg_dsn(database_url), server_settings=planner.SETTINGS)
    try:
        queue_id = await conn.fetchval("INSERT INTO queues (name) VALUES ('q') RETURNING id")
        params = params_for(queue_id)
        await conn.execute("VACUUM messages")
        pages, rows = await conn.fetchrow(
            "SELECT relpages, reltuples FROM pg_class WHERE relname = 'messages'"
        )
        assert (pages, rows) == (0, 0)  # what the planner now believes
        await conn.execute(f"PREPARE probe AS {statement.sql}")
        # EXECUTE takes no bind parameters: the arguments go in as literals
        args = ", ".join(_literal(v) for v in statement.args(params))
        explain = f"EXPLAIN (FORMAT JSON) EXECUTE probe{f'({args})' if args else ''}"
        for _ in range(6):
            await conn.fetchval(explain)
        await conn.execute(
            """
            INSERT INTO messages (queue_id, message_id, exchange, routing_key, body, status,
                                  delivery_tag, lease_expires_at, owner_connection)
            SELECT $1, 'm' || g, '', 'k', '\\x00',
                   CASE WHEN g % 10 = 0 THEN 'in_flight' ELSE 'ready' END,
                   CASE WHEN g % 10 = 0 THEN g::text || '.t' END,
                   CASE WHEN g % 10 = 0 THEN now() + interval '1 hour' END,
                   CASE WHEN g % 10 = 0 THEN gen_random_uuid() END
            FROM generate_series(1, 20000) AS g
            """,
            queue_id,
        )
        raw = await conn.fetchval(explain)
        document = raw if isinstance(raw, list) else json.loads(raw)
        plan = document[0]["Plan"]
        assert _scans(list(_nodes(plan))), plan
        assert not _unbounded(plan), (name, _unbounded(plan))
    finally:
        await conn.close()


@pytest.mark.parametrize("mode", MODES)
async def test_the_hand_off_probes_its_queue_not_the_backlog_of_others(
    conn: asyncpg.Connection, mode: str
) -> None:
    """A publish that may hand off asks whether its queue has a due ready message: one probe
    of ix_messages_claim, not a read of the other queues' backlog (written as EXISTS, it was
    planned as a sequential scan expected to stop at its first row)."""
    idle = await conn.fetchval("INSERT INTO queues (name) VALUES ('idle') RETURNING id")
    params = _publish(idle, str(uuid.uuid4()))
    async with conn.transaction():  # EXPLAIN only; nothing is inserted
        nodes = await _plan(conn, queries.INSERT_COPIES_HANDING_OFF, params, mode)
    reads = [n for n in nodes if n.get("Relation Name") == "messages" and n.get("Index Name")]
    assert [n["Index Name"] for n in reads] == ["ix_messages_claim"], nodes
    assert not _unbounded(nodes[0]), _unbounded(nodes[0])


async def test_the_plain_publish_reads_nothing_of_messages(conn: asyncpg.Connection) -> None:
    """Why the publish INSERT without a hand-off may keep a generic plan (its connections
    are HotPath's stable pool): no plan of it reads the messages table."""
    busy = await conn.fetchval("SELECT id FROM queues WHERE name = 'busy'")
    params = _publish(busy)
    for mode in MODES:
        async with conn.transaction():
            nodes = await _plan(conn, queries.INSERT_COPIES, params, mode)
        assert _scans(nodes) == [], nodes


async def test_each_hot_path_pool_has_its_planner_settings(database_url: str) -> None:
    hot = HotPath(asyncpg_dsn(database_url))
    try:
        async with hot.connection() as c:
            assert await c.fetchval("SHOW plan_cache_mode") == "force_custom_plan"
        async with hot.connection(stable=True) as c:
            assert await c.fetchval("SHOW plan_cache_mode") == "auto"
    finally:
        await hot.close()


async def _wide_exchange(conn: asyncpg.Connection) -> int:
    """A topic exchange 'wide' with 20,000 bindings to the queue 'busy': its id."""
    exchange_id: int = await conn.fetchval(
        "INSERT INTO exchanges (name, type) VALUES ('wide', 'topic') RETURNING id"
    )
    queue_id = await conn.fetchval("SELECT id FROM queues WHERE name = 'busy'")
    await conn.execute(
        """
        INSERT INTO bindings (exchange_id, queue_id, routing_key)
        SELECT $1, $2, 'k.' || g FROM generate_series(1, 20000) AS g
        """,
        exchange_id,
        queue_id,
    )
    return exchange_id


@pytest.mark.parametrize("mode", MODES)
async def test_a_current_routing_copy_reads_no_binding(conn: asyncpg.Connection, mode: str) -> None:
    """The publish's route read returns the bindings only of exchanges whose routing version
    differs from the caller's compiled copy: with the copy current, the bindings of an
    exchange with many are not read at all (a one-time filter), however it is planned."""
    exchange_id = await _wide_exchange(conn)
    await conn.execute("ANALYZE bindings")
    version = await conn.fetchval(
        "SELECT routing_version FROM exchanges WHERE id = $1", exchange_id
    )
    current = {"names": ["wide"], "known_ids": [exchange_id], "known_versions": [version]}
    stale = {**current, "known_versions": [version - 1]}
    statement = queries.LOAD_ROUTES
    for params, rows in ((current, 1), (stale, 20000)):
        await conn.execute(f"SET plan_cache_mode = {mode}")
        raw = await conn.fetchval(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + statement.sql, *statement.args(params)
        )
        document = raw if isinstance(raw, list) else json.loads(raw)
        plan = document[0]["Plan"]
        assert plan["Actual Rows"] == rows, plan
        reads = [n for n in _nodes(plan) if n.get("Relation Name") == "bindings"]
        assert reads, plan
        if params is current:
            assert all(n["Actual Loops"] == 0 for n in reads), reads


@pytest.mark.parametrize("mode", MODES)
async def test_the_route_graph_read_probes_only_exchange_bindings(
    conn: asyncpg.Connection, mode: str
) -> None:
    """The §14 read (LOAD_ROUTE_GRAPH) walks exchange-to-exchange bindings through their
    partial index: an exchange of 20,000 queue bindings with an e2e binding and an alternate
    costs the walk a few index probes, and with the copies current no queue binding is read."""
    wide = await _wide_exchange(conn)
    narrow = await conn.fetchval(
        "INSERT INTO exchanges (name, type) VALUES ('narrow', 'fanout') RETURNING id"
    )
    alternate = await conn.fetchval(
        "INSERT INTO exchanges (name, type, arguments) VALUES "
        "('alt', 'fanout', '{\"alternate-exchange\": \"wide\"}') RETURNING id"
    )
    await conn.execute(
        "INSERT INTO bindings (exchange_id, destination_exchange_id) VALUES ($1, $2)", wide, narrow
    )
    await conn.execute(
        "INSERT INTO bindings (exchange_id, destination_exchange_id) VALUES ($1, $2)",
        narrow,
        alternate,
    )
    await conn.execute("ANALYZE bindings")
    rows = await conn.fetch(
        "SELECT name, id, routing_version FROM exchanges WHERE id = ANY($1)",
        [wide, narrow, alternate],
    )
    current = {
        "roots": ["wide"],
        "names": [r["name"] for r in rows],
        "known_ids": [r["id"] for r in rows],
        "known_versions": [r["routing_version"] for r in rows],
    }
    statement = queries.LOAD_ROUTE_GRAPH
    await conn.execute(f"SET plan_cache_mode = {mode}")
    raw = await conn.fetchval(
        "EXPLAIN (ANALYZE, FORMAT JSON) " + statement.sql, *statement.args(current)
    )
    document = raw if isinstance(raw, list) else json.loads(raw)
    plan = document[0]["Plan"]
    assert plan["Actual Rows"] == 3, plan  # one row per reached exchange, no binding
    reads = [n for n in _nodes(plan) if n.get("Relation Name") == "bindings"]
    assert reads, plan
    for node in reads:
        if node["Actual Loops"]:
            assert node["Actual Rows"] <= 1, node
            assert node.get("Rows Removed by Filter", 0) == 0, node
            assert node.get("Rows Removed by Index Recheck", 0) == 0, node
    indexes = {n.get("Index Name") for n in _nodes(plan) if n.get("Actual Loops")}
    assert "uq_bindings_exchange_to_exchange" in indexes, plan


def _compiled(statement: Any) -> str:
    from sqlalchemy.dialects import postgresql

    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    return str(statement.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))


class _Capture:
    """Stands in for a connection to capture the statement a storage function runs."""

    def __init__(self) -> None:
        self.statements: list[Any] = []

    async def execute(self, statement: Any) -> list[Any]:
        self.statements.append(statement)
        return []


@pytest.mark.parametrize("after", [None, "q0010000"])
async def test_a_queue_list_page_is_read_in_index_order(
    conn: asyncpg.Connection, after: str | None
) -> None:
    """GET /queues pages by name in byte order: with many queues, a page is read from the
    unique index in order (queues.name has collation "C"), never sorted whole."""
    from app.storage import topology

    await conn.execute(
        "INSERT INTO queues (name) SELECT 'q' || lpad(g::text, 7, '0') "
        "FROM generate_series(1, 20000) AS g"
    )
    await conn.execute("ANALYZE queues")
    capture = _Capture()
    await topology.list_queues(capture, after=after, limit=101)  # type: ignore[arg-type]
    raw = await conn.fetchval("EXPLAIN (FORMAT JSON) " + _compiled(capture.statements[0]))
    document = raw if isinstance(raw, list) else json.loads(raw)
    nodes = list(_nodes(document[0]["Plan"]))
    assert not [n for n in nodes if n["Node Type"] in ("Sort", "Incremental Sort")], nodes
    names = {n.get("Index Name") for n in nodes if n.get("Relation Name") == "queues"}
    assert "uq_queues_name" in names, nodes


async def test_the_overview_counts_scan_messages_once_and_in_background_on_one_core(
    conn: asyncpg.Connection,
) -> None:
    """``/overview`` counts messages by status in one pass over the table; the count it makes
    in the background (broker/overview.py) plans no parallel workers, even where PostgreSQL
    would use them for the same count in a request."""
    from app.storage import overview

    async def plan(statement: Any) -> list[dict[str, Any]]:
        raw = await conn.fetchval("EXPLAIN (FORMAT JSON) " + _compiled(statement))
        document = raw if isinstance(raw, list) else json.loads(raw)
        return list(_nodes(document[0]["Plan"]))

    def gathers(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [n for n in nodes if n["Node Type"] in ("Gather", "Gather Merge")]

    async with conn.transaction():
        # parallel plans made cheap: a table of any size would be scanned in parallel
        for setting in (
            "parallel_setup_cost",
            "parallel_tuple_cost",
            "min_parallel_table_scan_size",
        ):
            await conn.execute(f"SET LOCAL {setting} = 0")
        await conn.execute("SET LOCAL max_parallel_workers_per_gather = 2")
        in_request = await plan(overview._overview_query())
        assert len(_scans(in_request)) == 1, in_request
        assert gathers(in_request), in_request  # the control: parallel when allowed

        capture = _Capture()
        with contextlib.suppress(AttributeError):  # the capture gives no row back
            await overview.message_counts_on_one_core(capture)  # type: ignore[arg-type]
        setting, count = capture.statements
        await conn.execute(_compiled(setting))
        in_background = await plan(count)
        assert len(_scans(in_background)) == 1, in_background
        assert not gathers(in_background), in_background


async def _priority_backlog(conn: asyncpg.Connection) -> int:
    """A priority queue with a backlog of its own (every row carries a priority)."""
    queue_id: int = await conn.fetchval(
        "INSERT INTO queues (name, arguments) VALUES ('prio', '{\"x-max-priority\": 9}') "
        "RETURNING id"
    )
    await conn.execute(
        """
        INSERT INTO messages (queue_id, message_id, exchange, routing_key, body, priority)
        SELECT $1, 'p' || g, '', 'k', '\\x00', g % 10 FROM generate_series(1, $2) AS g
        """,
        queue_id,
        BACKLOG,
    )
    await conn.execute("ANALYZE messages")
    return queue_id


@pytest.mark.parametrize("mode", MODES)
async def test_a_priority_claim_walks_the_priority_index(
    conn: asyncpg.Connection, mode: str
) -> None:
    """Claim order (priority, available_at, id) is an index walk, never a sort of the
    backlog: the claim branch of plain queues is not reached while the priority one fills
    the limit, and a plain queue's claim probes the priority index once."""
    queue_id = await _priority_backlog(conn)
    for queue in (queue_id, await conn.fetchval("SELECT id FROM queues WHERE name = 'busy'")):
        params = {
            "queue_id": queue,
            "n": 100,
            "lease_seconds": 30.0,
            "process_id": _OWNER,
            "owners": [_OWNER] * 100,
            "owner_user": None,
        }
        nodes = await _plan(conn, queries.CLAIM, params, mode)
        names = {n.get("Index Name") for n in _scans(nodes)}
        assert {"ix_messages_priority", "ix_messages_claim"} <= names, nodes
        assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], nodes
        for sort in (n for n in nodes if n["Node Type"] == "Sort"):
            assert _limited(sort), sort
        document = await conn.fetchval(
            "EXPLAIN (FORMAT JSON) " + queries.CLAIM.sql, *queries.CLAIM.args(params)
        )
        assert not _unbounded(
            (document if isinstance(document, list) else json.loads(document))[0]["Plan"]
        )


@pytest.mark.parametrize("mode", MODES)
async def test_the_length_rule_reads_only_the_limited_queue(
    conn: asyncpg.Connection, mode: str
) -> None:
    """The count, and the head that drop-head removes, search the queue's own rows in the
    claim indexes (the count is bounded by the limit, which holds), whatever else waits."""
    from app.storage import limits

    prio = await _priority_backlog(conn)
    busy = await conn.fetchval("SELECT id FROM queues WHERE name = 'busy'")
    # a limited queue holds few of the table's rows (the limit holds): 'probed' is 10 %
    probed = await conn.fetchval("SELECT id FROM queues WHERE name = 'probed'")
    statements = [
        (Statement(limits.READY_SIZES), {"ids": [busy, prio], "with_bytes": [False, True]}),
        (Statement(limits.HEAD), {"queue_id": busy, "n": 10}),
        (Statement(limits.HEAD), {"queue_id": prio, "n": 10}),
        (Statement(limits.TRIM_HEAD), {"queue_id": probed, "max_length": 4_000}),
        (Statement(limits.INSERT_TRIMMING), _insert_trimming(probed, 4_000)),
    ]
    for statement, params in statements:
        await conn.execute(f"SET plan_cache_mode = {mode}")
        document = await conn.fetchval(
            "EXPLAIN (FORMAT JSON) " + statement.sql, *statement.args(params)
        )
        plan = (document if isinstance(document, list) else json.loads(document))[0]["Plan"]
        assert not _unbounded(plan), plan
        nodes = list(_nodes(plan))
        assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], nodes


def _insert_trimming(queue_id: int, max_length: int) -> dict[str, Any]:
    """INSERT_TRIMMING's parameters: one message into ``queue_id``, trimmed to the limit."""
    from app.domain.model import OutgoingMessage
    from app.storage.messages import insert_params

    message = OutgoingMessage(body=b"1", binary=False, routing_key="k", message_id="m")
    params = insert_params([("", message)], [(0, queue_id)], str(uuid.uuid4()))
    params.update(trim_queue=[queue_id], trim_max=[max_length], trim_added=[1])
    return params


@pytest.mark.parametrize("mode", MODES)
async def test_a_single_active_promotion_probes_the_holders_deliveries(
    conn: asyncpg.Connection, mode: str
) -> None:
    """PROMOTE (storage/single_active.py) asks whether the previous holder still has
    deliveries of the queue in flight: a walk of ix_messages_owner for that one connection,
    never a read of the queue's backlog nor of every delivery in flight."""
    from app.storage import single_active

    busy = await conn.fetchval("SELECT id FROM queues WHERE name = 'busy'")
    holder = (await _in_flight(conn, 1))[0][2]
    await conn.execute(
        "INSERT INTO single_active_holders (queue_id, connection_id) VALUES ($1, $2)", busy, holder
    )
    params = {"queue_ids": [busy], "connections": [str(uuid.uuid4())]}
    nodes = await _plan(conn, Statement(single_active.PROMOTE), params, mode)
    scans = _scans(nodes)
    assert [n.get("Index Name") for n in scans] == ["ix_messages_owner"], nodes
    gate = {"queue_id": busy, "connection": holder}
    assert not _scans(await _plan(conn, single_active.GATE, gate, mode))
