"""GET /queues/{name}/diagnosis on a queue of 1,000,000 copies (contract §19: under 200 ms).

Opt-in (``-m slow``): the fill alone takes tens of seconds. The queue is the worst case the
diagnosis reads: groups (10,000 of them), a length limit it is at (the count walks up to the
limit), a TTL, a dead-letter queue, copies in flight to a pull and a WebSocket consumer.
The timings are printed (docs/performance.md has them), never asserted; what is asserted is
that every statement's plan reads an index (or, for the count, stops at its limit).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import httpx
import pytest

from app.storage import diagnosis as store
from tests.api.test_multiprocess import _sql
from tests.support import LiveServer
from tests.wsclient import WsClient, declare_queue

N = 1_000_000

FILL = """
INSERT INTO messages (queue_id, message_id, exchange, routing_key, body, available_at,
                      expires_at, group_id)
SELECT $1, 'm-' || g, '', 'big', '"x"'::bytea, now(), now() + interval '1 hour',
       'g' || (g % 10000)
FROM generate_series(1, $2::bigint) AS g
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_diagnosis_of_a_million_copies(server: LiveServer, admin: httpx.Client) -> None:
    declare_queue(admin, "big-dlq")
    declare_queue(
        admin,
        "big",
        dead_letter_queue="big-dlq",
        # at its limit once the consumers below hold their 60 copies
        arguments={"x-message-groups": True, "x-max-length": N - 60, "x-message-ttl": 3_600_000},
    )
    (row,) = _sql(server.database_url, "SELECT id FROM queues WHERE name = 'big'")
    started = time.monotonic()
    _sql(server.database_url, FILL, row["id"], N)
    _sql(server.database_url, "ANALYZE messages")
    print(f"fill {time.monotonic() - started:.1f} s")
    r = admin.post("/queues/big/get", json={"max_messages": 50})
    assert r.status_code == 200, r.text
    with WsClient.admin(server.ws_url) as ws:
        ws.subscribe("big", 10)
        ws.deliveries_n(10)
        times: list[float] = []
        for _ in range(30):
            t0 = time.perf_counter()
            d = admin.get("/queues/big/diagnosis")
            times.append(1000 * (time.perf_counter() - t0))
            assert d.status_code == 200, d.text
        body: dict[str, Any] = d.json()
    print(
        f"diagnosis with {N} copies: p50 {statistics.median(times):.1f} ms, "
        f"max {max(times):.1f} ms, min {min(times):.1f} ms"
    )
    assert body["oldest_in_flight"] is not None
    assert "length_limit_reached" in [f["code"] for f in body["findings"]]
    plans = explain_all(server.database_url, row["id"])
    for name, plan in plans.items():
        if "Seq Scan on messages" in plan:
            # chosen only where (nearly) every row matches, as here: it stops at its limit
            assert name in ("ready_count", "dead_letters"), f"{name}:\n{plan}"
            assert "Limit" in plan, f"{name}:\n{plan}"


def explain_all(url: str, queue_id: int) -> dict[str, str]:
    """Each statement's plan on the filled queue (parameters as the check passes them)."""
    statements: dict[str, tuple[Any, dict[str, Any]]] = {
        "head": (store.HEAD_DUE, {"queue_id": queue_id}),
        "oldest_in_flight": (store.OLDEST_IN_FLIGHT, {"queue_id": queue_id}),
        "group_in_flight": (store.GROUP_IN_FLIGHT, {"queue_id": queue_id, "group_id": "g1"}),
        "poison": (store.POISON, {"queue_id": queue_id, "min": 3}),
        "ready_count": (store.READY_COUNT, {"queue_id": queue_id, "n": store.COUNT_SCAN}),
        "dead_letters": (
            store.DEAD_LETTERS,
            {"queue_id": queue_id, "source": None, "own": "big", "window": 300.0},
        ),
    }
    out: dict[str, str] = {}
    for name, (stmt, params) in statements.items():
        sql, args = _positional(str(stmt), params)
        rows = _sql(url, "EXPLAIN " + sql, *args)
        out[name] = "\n".join(r[0] for r in rows)
    return out


def _positional(sql: str, params: dict[str, Any]) -> tuple[str, list[Any]]:
    """``:name`` parameters as asyncpg's ``$n``."""
    args: list[Any] = []
    for i, (key, value) in enumerate(sorted(params.items(), key=lambda kv: -len(kv[0])), 1):
        sql = sql.replace(f":{key}", f"${i}")
        args.append(value)
    return sql, args
