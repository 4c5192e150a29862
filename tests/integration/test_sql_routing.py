"""One routing semantics (contract §18): the broker's router (``routing_cache.Router`` over
``CompiledRoutes``: ``route_graph``) and the SQL publish (``messagex.publish``, migration
0013) answer the same queues, in the same order, on every generated case.

Each case is a random topology — exchanges of the four types, queue bindings and
exchange-to-exchange bindings with random keys and arguments (cycles included), alternate
exchanges (some naming an exchange that does not exist) — and a few random messages. It is
stored in one transaction, the SQL function publishes into it, and the transaction is rolled
back; the Python router routes the same topology built in memory, as the routing cache
compiles it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.broker.routing_cache import Router, Routes
from app.domain.model import ExchangeType
from app.domain.routing import BindingRule, CompiledRoutes
from app.storage.dsn import asyncpg_dsn
from app.storage.messages import RoutingVersion
from tests.support import PgCluster, Sql

TYPES = ["direct", "fanout", "topic", "headers"]
#: key words; patterns add the wildcards
WORDS = ["a", "b", ""]
PATTERN_WORDS = ["a", "b", "", "*", "#"]
HEADER_KEYS = ["a", "b", "x-c"]
HEADER_VALUES: list[Any] = [1, 1.0, 2, "1", "a", True, False, None, [1], [1.0, "a"], {"k": 1}]
X_MATCH = ["all", "any", "all-with-x", "any-with-x"]

_cases = itertools.count()


@pytest.fixture(scope="module")
def sql(pg_cluster: PgCluster, template_db: str) -> Iterator[Sql]:
    name = pg_cluster.create_database(template_db)
    session = Sql(asyncpg_dsn(pg_cluster.url_for(name)))
    try:
        yield session
    finally:
        session.close()
        pg_cluster.drop_database(name)


def keys(words: list[str]) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(words), max_size=4).map(".".join)


headers_st = st.dictionaries(st.sampled_from(HEADER_KEYS), st.sampled_from(HEADER_VALUES))
arguments_st = st.builds(
    lambda mode, rest: ({"x-match": mode} if mode else {}) | rest,
    st.one_of(st.none(), st.sampled_from(X_MATCH)),
    headers_st,
)


@dataclass
class Binding:
    source: int
    queue: int | None  # a queue's index, or None for an exchange-to-exchange binding
    exchange: int | None
    key: str
    arguments: dict[str, Any]


@dataclass
class Case:
    types: list[str]
    queues: int
    alternates: list[int | None]  # an exchange's index; -1: a name that does not exist
    bindings: list[Binding] = field(default_factory=list)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=5))
    n = len(types)
    queues = draw(st.integers(1, 4))
    alternates = draw(
        st.lists(st.one_of(st.none(), st.integers(-1, n - 1)), min_size=n, max_size=n)
    )
    case = Case(types, queues, alternates)
    for _ in range(draw(st.integers(0, 12))):
        source = draw(st.integers(0, n - 1))
        to_exchange = draw(st.booleans())
        kind = types[source]
        key = draw(keys(PATTERN_WORDS if kind == "topic" else WORDS))
        arguments = draw(arguments_st if kind == "headers" else headers_st)
        case.bindings.append(
            Binding(
                source,
                None if to_exchange else draw(st.integers(0, queues - 1)),
                draw(st.integers(0, n - 1)) if to_exchange else None,
                key,
                arguments,
            )
        )
    return case


def python_routes(case: Case, prefix: str) -> dict[str, Routes]:
    """The topology as the routing cache compiles it (bindings in id order)."""
    found: dict[str, Routes] = {}
    for index, kind in enumerate(case.types):
        queues: list[BindingRule] = []
        onward: list[BindingRule] = []
        for b in _unique(case.bindings):
            if b.source != index:
                continue
            if b.queue is not None:
                queues.append(BindingRule(f"{prefix}q{b.queue}", b.key, b.arguments))
            else:
                onward.append(BindingRule(f"{prefix}x{b.exchange}", b.key, b.arguments))
        alternate = _alternate(case, index, prefix)
        found[f"{prefix}x{index}"] = Routes(
            ExchangeType(kind),
            RoutingVersion(index, 0),
            CompiledRoutes(ExchangeType(kind), queues),
            {r.queue: 0 for r in queues},
            len(queues),
            CompiledRoutes(ExchangeType(kind), onward) if onward else None,
            alternate,
        )
    return found


def _alternate(case: Case, index: int, prefix: str) -> str | None:
    target = case.alternates[index]
    if target is None:
        return None
    return f"{prefix}missing" if target < 0 else f"{prefix}x{target}"


def _unique(bindings: list[Binding]) -> list[Binding]:
    """Identical bindings are one (contract §6: the unique constraint)."""
    seen: set[tuple[Any, ...]] = set()
    kept = []
    for b in bindings:
        identity = (b.source, b.queue, b.exchange, b.key, orjson.dumps(b.arguments))
        if identity not in seen:
            seen.add(identity)
            kept.append(b)
    return kept


def store(sql: Sql, case: Case, prefix: str) -> None:
    """The case's topology, in the caller's transaction: three statements, ids in the order
    given (so bindings come in the order the router compiled them)."""
    alternates = [_alternate(case, i, prefix) for i in range(len(case.types))]
    sql.exec(
        """INSERT INTO exchanges (name, type, arguments, onward)
           SELECT n, t, CASE WHEN a IS NULL THEN '{}'
                             ELSE jsonb_build_object('alternate-exchange', a) END,
                  CASE WHEN a IS NULL THEN 0 ELSE 1 END
           FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS x(n, t, a, o)
           ORDER BY o""",
        [f"{prefix}x{i}" for i in range(len(case.types))],
        case.types,
        alternates,
    )
    sql.exec(
        "INSERT INTO queues (name) SELECT unnest($1::text[])",
        [f"{prefix}q{i}" for i in range(case.queues)],
    )
    kept = _unique(case.bindings)
    sql.exec(
        """INSERT INTO bindings (exchange_id, queue_id, destination_exchange_id, routing_key,
                                 arguments)
           SELECT s.id, q.id, d.id, b.k, b.a
           FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::jsonb[])
                WITH ORDINALITY AS b(src, queue, dest, k, a, o)
           JOIN exchanges AS s ON s.name = b.src
           LEFT JOIN queues AS q ON q.name = b.queue
           LEFT JOIN exchanges AS d ON d.name = b.dest
           ORDER BY b.o""",
        [f"{prefix}x{b.source}" for b in kept],
        [None if b.queue is None else f"{prefix}q{b.queue}" for b in kept],
        [None if b.exchange is None else f"{prefix}x{b.exchange}" for b in kept],
        [b.key for b in kept],
        [b.arguments for b in kept],
    )


@settings(max_examples=150, deadline=None)
@given(
    case=cases(),
    messages=st.lists(
        st.tuples(st.integers(0, 4), keys(WORDS), headers_st), min_size=1, max_size=4
    ),
)
def test_the_sql_publish_routes_as_the_broker_router(
    sql: Sql, case: Case, messages: list[tuple[int, str, dict[str, Any]]]
) -> None:
    prefix = f"h{next(_cases)}-"
    routes = python_routes(case, prefix)
    sql.exec("BEGIN")
    try:
        store(sql, case, prefix)
        for root, key, headers in messages:
            exchange = f"{prefix}x{root % len(case.types)}"
            expected = Router(routes, exchange)(key, headers)
            result = sql.val("SELECT messagex.publish($1, $2, '1', $3)", exchange, key, headers)
            assert result["queues"] == expected, (exchange, key, headers)
            assert result["routed"] is bool(expected)
    finally:
        sql.exec("ROLLBACK")
