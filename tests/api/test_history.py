"""The charts' history (GET /overview/history, /queues/{name}/history): rates summed over
two broker processes sharing one database, depth sampled by one of them, nothing stored for
idle queues. Both servers sample every second (MESSAGEX_HISTORY_INTERVAL_SECONDS=1)."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from app.storage.dsn import asyncpg_dsn
from app.storage.history import DEPTH_LOCK_KEY
from tests.api.test_multiprocess import Pair, database, start_pair
from tests.api.test_queues import assert_problem, sql
from tests.support import client, login, wait_for
from tests.wsclient import WsClient, declare_queue, make_user, publish

_names = itertools.count()


__all__ = ["database"]  # the module's own database (a module-scoped fixture)


def fresh() -> str:
    return f"hist{next(_names)}x{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def pair(database: str) -> Iterator[Pair]:
    with ExitStack() as stack:
        yield start_pair(stack, database, history_interval_seconds=1)


def history(c: httpx.Client, path: str) -> dict[str, Any]:
    r = c.get(path)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def totals(body: dict[str, Any]) -> tuple[int, int, int]:
    s = body["samples"]
    return (
        sum(x["published"] for x in s),
        sum(x["delivered"] for x in s),
        sum(x["acked"] for x in s),
    )


def last_depth(body: dict[str, Any]) -> dict[str, int] | None:
    for sample in reversed(body["samples"]):
        if sample["ready"] is not None:
            return {k: sample[k] for k in ("ready", "delayed", "in_flight", "dead")}
    return None


def pull(c: httpx.Client, queue: str, n: int) -> list[str]:
    r = c.post(f"/queues/{queue}/get", json={"max_messages": n})
    assert r.status_code == 200, r.text
    return [m["delivery_tag"] for m in r.json()["messages"]]


def test_rates_are_summed_over_both_processes_and_depth_sampled_once(pair: Pair) -> None:
    q = fresh()
    declare_queue(pair.rest_a, q)
    for i in range(3):
        publish(pair.rest_a, q, i)
    for i in range(2):
        publish(pair.rest_b, q, i)
    publish(pair.rest_a, q, "later", delay_ms=600_000)
    tags_a = pull(pair.rest_a, q, 2)
    tags_b = pull(pair.rest_b, q, 1)
    assert len(tags_a) == 2
    assert len(tags_b) == 1
    for tag in tags_a:
        assert pair.rest_a.post(f"/deliveries/{tag}/ack").status_code == 204
    with WsClient.admin(pair.b.ws_url) as ws:
        ws.subscribe(q, 1)
        for _ in range(2):  # the last two ready, one after the other (prefetch 1)
            ws.ack(ws.delivery()["delivery_tag"])
    # published 6 (one delayed), delivered 5 (pull 2 on a, pull 1 + push 2 on b), acked 4;
    # the copy pulled on b is still in flight
    want_rates = (6, 5, 4)
    want_depth = {"ready": 0, "delayed": 1, "in_flight": 1, "dead": 0}
    path = f"/queues/{q}/history"
    deadline = time.monotonic() + 15
    while True:  # poll until sampled, or fail showing what was seen
        body = history(pair.rest_a, path)
        seen = (totals(body), last_depth(body))
        if seen == (want_rates, want_depth) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert seen == (want_rates, want_depth)
    for rest in (pair.rest_a, pair.rest_b):  # either process answers the same
        body = history(rest, path)
        assert totals(body) == want_rates
        assert last_depth(body) == want_depth
        assert body["interval_seconds"] == 1
        times = [datetime.fromisoformat(s["at"]) for s in body["samples"]]
        assert len(times) == 600
        assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(times))
    # one depth row per sample time, whichever process took it
    dupes = sql(
        pair.a.database_url,
        "SELECT at FROM queue_samples WHERE queue_id IS NULL AND ready IS NOT NULL "
        "GROUP BY at HAVING count(*) > 1",
    )
    assert dupes == []
    overview = history(pair.rest_b, "/overview/history")
    published, delivered, acked = totals(overview)
    assert published >= 6
    assert delivered >= 5
    assert acked >= 4
    depth = last_depth(overview)
    assert depth is not None
    assert depth["delayed"] >= 1
    assert depth["in_flight"] >= 1


def test_an_idle_queue_costs_no_rows(pair: Pair) -> None:
    idle, busy = fresh(), fresh()
    declare_queue(pair.rest_a, idle)
    declare_queue(pair.rest_a, busy)
    publish(pair.rest_b, busy, "x")
    wait_for(
        lambda: totals(history(pair.rest_a, f"/queues/{busy}/history"))[0] == 1,
        timeout=15,
        interval=0.2,
        message="the busy queue's publish to be sampled",
    )
    rows = sql(
        pair.a.database_url,
        "SELECT count(*) FROM queue_samples AS s JOIN queues AS q ON q.id = s.queue_id "
        "WHERE q.name = $1",
        idle,
    )
    assert rows[0][0] == 0
    body = history(pair.rest_a, f"/queues/{idle}/history")
    assert totals(body) == (0, 0, 0)
    assert last_depth(body) == {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 0}


def test_bad_requests_are_refused(pair: Pair) -> None:
    q = fresh()
    declare_queue(pair.rest_a, q)
    assert_problem(pair.rest_a.get(f"/queues/{fresh()}/history"), 404, "not_found")
    assert_problem(pair.rest_a.get("/queues/-bad-/history"), 422, "validation_error")
    with client(pair.a.base_url) as anon:
        assert anon.get("/overview/history").status_code == 401
    user = fresh()
    make_user(pair.rest_a, user, read=q)
    with client(pair.a.base_url, login(pair.a.base_url, user, "user-password-1")) as c:
        assert_problem(c.get("/overview/history"), 403, "forbidden")
        assert_problem(c.get(f"/queues/{fresh()}/history"), 403, "forbidden")
        assert history(c, f"/queues/{q}/history")["interval_seconds"] == 1


def test_rows_older_than_15_minutes_are_deleted(pair: Pair) -> None:
    url = pair.a.database_url
    sql(
        url,
        "INSERT INTO queue_samples (at, queue_id, published) "
        "VALUES (now() - interval '16 minutes', NULL, 7), (now() - interval '14 minutes', NULL, 1)",
    )

    def swept() -> bool:
        old = sql(
            url,
            "SELECT count(*) FROM queue_samples WHERE at < now() - interval '15 minutes 30 s'",
        )
        return bool(old[0][0] == 0)

    wait_for(swept, timeout=10, interval=0.2, message="the old sample to be deleted")
    kept = sql(
        url,
        "SELECT count(*) FROM queue_samples WHERE published = 1 AND queue_id IS NULL "
        "AND at < now() - interval '13 minutes'",
    )
    assert kept[0][0] == 1


def pace_last_depth_sample(url: str, depth_ms: int) -> datetime:
    """Pretend the last depth count took ``depth_ms``, under the samplers' lock (so that no
    sampler is between its check and its insert); returns its time."""

    async def run() -> datetime:
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", DEPTH_LOCK_KEY)
                at: datetime = await conn.fetchval(
                    "UPDATE queue_samples SET depth_ms = $1 WHERE queue_id IS NULL "
                    "AND ready IS NOT NULL AND at = (SELECT max(at) FROM queue_samples "
                    "WHERE queue_id IS NULL AND ready IS NOT NULL) RETURNING at",
                    depth_ms,
                )
                return at
        finally:
            await conn.close()

    return asyncio.run(run())


def test_a_slow_depth_count_paces_the_next_and_its_depth_stands_meanwhile(pair: Pair) -> None:
    """A depth count that took 250 ms waits 20 times that (5 s) before the next one; the
    times in between show the last depth, not null."""
    url = pair.a.database_url
    wait_for(
        lambda: sql(url, "SELECT 1 FROM queue_samples WHERE queue_id IS NULL AND ready >= 0"),
        timeout=10,
        interval=0.2,
        message="a first depth sample",
    )
    paced = pace_last_depth_sample(url, 250)

    def next_depth() -> datetime | None:
        found = sql(
            url,
            "SELECT min(at) FROM queue_samples WHERE queue_id IS NULL AND ready IS NOT NULL "
            "AND at > $1",
            paced,
        )
        at: datetime | None = found[0][0]
        return at

    following = wait_for(next_depth, timeout=15, interval=0.2, message="the next depth sample")
    assert following - paced >= timedelta(seconds=5)
    samples = history(pair.rest_a, "/overview/history")["samples"]
    between = [s for s in samples if paced < datetime.fromisoformat(s["at"]) < following]
    assert len(between) >= 4
    assert all(s["ready"] is not None for s in between)
