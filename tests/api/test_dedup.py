"""Idempotent publish (contract §15) through the real server: ``duplicates`` in REST, batch
and WebSocket results, a repeat inside one batch, the window running out, the sweep of the
bookkeeping, the claim outliving the copy (ack, expiry, dead-lettering), length limits that
do not burn a message_id, and exactly one copy when two broker processes race."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import uuid
from contextlib import ExitStack
from typing import Any

import asyncpg
import httpx
import pytest

from app.storage.dsn import asyncpg_dsn
from tests.api import test_multiprocess
from tests.api.test_multiprocess import start_pair
from tests.api.test_queues import assert_problem
from tests.support import LiveServer, metric, wait_for
from tests.wsclient import WsClient, bind, browse, declare_queue, stats

SERVER_SETTINGS = {"ack_timeout_check_interval_ms": 100}
WINDOW = "x-deduplication-window-seconds"

_names = itertools.count()


def fresh(prefix: str = "q") -> str:
    return f"{prefix}{next(_names)}x{uuid.uuid4().hex[:6]}"


def windowed(adm: httpx.Client, seconds: int = 60, **body: Any) -> str:
    q = fresh()
    arguments = {WINDOW: seconds, **body.pop("arguments", {})}
    declare_queue(adm, q, arguments=arguments, **body)
    return q


def to_queue(
    adm: httpx.Client, q: str, message_id: str | None, body: Any = "m", **extra: Any
) -> Any:
    properties = {} if message_id is None else {"message_id": message_id}
    r = adm.post(f"/queues/{q}/messages", json={"body": body, "properties": properties, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def batch(adm: httpx.Client, exchange: str, items: list[tuple[str, str]]) -> list[Any]:
    """(routing key, message_id) per message; returns the results."""
    messages = [
        {"routing_key": key, "body": f"{key}:{mid}", "properties": {"message_id": mid}}
        for key, mid in items
    ]
    r = adm.post(f"/exchanges/{exchange}/publish-batch", json={"messages": messages})
    assert r.status_code == 200, r.text
    results: list[Any] = r.json()["results"]
    return results


def rows(database_url: str, queue: str) -> int:
    async def count() -> int:
        conn = await asyncpg.connect(asyncpg_dsn(database_url))
        try:
            found: int = await conn.fetchval(
                "SELECT count(*) FROM publish_dedup d JOIN queues q ON q.id = d.queue_id "
                "WHERE q.name = $1",
                queue,
            )
            return found
        finally:
            await conn.close()

    return asyncio.run(count())


# -- the result's duplicates ------------------------------------------------------------------


def test_a_repeated_message_id_is_a_duplicate_in_this_queue_only(adm: httpx.Client) -> None:
    exchange = fresh("fan")
    assert adm.put(f"/exchanges/{exchange}", json={"type": "fanout"}).status_code in (200, 201)
    q, plain = windowed(adm), fresh("plain")
    declare_queue(adm, plain)
    bind(adm, exchange, q)
    bind(adm, exchange, plain)
    body = {"routing_key": "", "body": 1, "properties": {"message_id": "order-1"}}
    first = adm.post(f"/exchanges/{exchange}/publish", json=body).json()
    assert (first["queues"], first["duplicates"]) == ([q, plain], [])
    again = adm.post(f"/exchanges/{exchange}/publish", json=body).json()
    assert again == {
        "routed": True,
        "queues": [plain],
        "message_id": "order-1",
        "rejected": [],
        "duplicates": [q],
    }
    assert (stats(adm, q)["ready"], stats(adm, plain)["ready"]) == (1, 2)


def test_a_mandatory_duplicate_is_routed_and_stores_nothing(adm: httpx.Client) -> None:
    q = windowed(adm)
    bind(adm, "amq.direct", q, q)
    body = {"routing_key": q, "body": 1, "mandatory": True, "properties": {"message_id": "m"}}
    assert adm.post("/exchanges/amq.direct/publish", json=body).json()["queues"] == [q]
    r = adm.post("/exchanges/amq.direct/publish", json=body)
    assert r.status_code == 200, r.text
    assert (r.json()["routed"], r.json()["duplicates"]) == (True, [q])
    assert stats(adm, q)["ready"] == 1


def test_publish_straight_to_the_queue_and_broker_made_ids(adm: httpx.Client) -> None:
    q = windowed(adm)
    assert to_queue(adm, q, "a")["queues"] == [q]
    dup = to_queue(adm, q, "a")
    assert (dup["routed"], dup["queues"], dup["duplicates"]) == (True, [], [q])
    # without a message_id each publish gets a new one: never a duplicate...
    made = [to_queue(adm, q, None) for _ in range(2)]
    assert [r["queues"] for r in made] == [[q], [q]]
    # ...and the one the broker made counts as the publisher's own on a retry
    assert to_queue(adm, q, made[0]["message_id"])["duplicates"] == [q]
    assert stats(adm, q)["ready"] == 3


def test_a_batch_repeat_is_a_duplicate_of_the_earlier_item(adm: httpx.Client) -> None:
    q = windowed(adm)
    bind(adm, "amq.direct", q, q)
    results = batch(adm, "amq.direct", [(q, "a"), (q, "b"), (q, "a")])
    assert [(r["queues"], r["duplicates"]) for r in results] == [([q], []), ([q], []), ([], [q])]
    results = batch(adm, "amq.direct", [(q, "b"), (q, "c"), (q, "c")])
    assert [r["duplicates"] for r in results] == [[q], [], [q]]
    assert [m["body"] for m in browse(adm, q)] == [f"{q}:a", f"{q}:b", f"{q}:c"]


def test_websocket_published_frames_carry_duplicates(srv: LiveServer, adm: httpx.Client) -> None:
    q = windowed(adm)
    with WsClient.admin(srv.ws_url) as ws:
        frame = {"type": "PUBLISH", "queue": q, "body": 1, "properties": {"message_id": "w"}}
        first = ws.request(frame)
        assert (first["type"], first["queues"], first["duplicates"]) == ("PUBLISHED", [q], [])
        again = ws.request(frame)
        assert (again["routed"], again["queues"], again["duplicates"]) == (True, [], [q])
    assert stats(adm, q)["ready"] == 1
    text = httpx.get(f"{srv.base_url}/metrics").text
    assert (metric(text, "messagex_message_copies_duplicate_total") or 0) >= 1


def test_a_queue_without_the_argument_stores_every_copy(adm: httpx.Client) -> None:
    q = fresh("plain")
    declare_queue(adm, q)
    assert [to_queue(adm, q, "same")["queues"] for _ in range(3)] == [[q], [q], [q]]
    assert stats(adm, q)["ready"] == 3


# -- the window -------------------------------------------------------------------------------


def test_after_the_window_the_same_message_id_is_stored_again(adm: httpx.Client) -> None:
    q = windowed(adm, 1)
    assert to_queue(adm, q, "a")["queues"] == [q]
    assert to_queue(adm, q, "a")["duplicates"] == [q]
    wait_for(lambda: to_queue(adm, q, "a")["queues"] == [q], timeout=5, interval=0.1)
    assert stats(adm, q)["ready"] == 2


def test_the_sweep_deletes_rows_older_than_their_window(srv: LiveServer, adm: httpx.Client) -> None:
    short, long_ = windowed(adm, 1), windowed(adm, 3600)
    for i in range(30):
        to_queue(adm, short, f"s{i}")
        to_queue(adm, long_, f"l{i}")
    assert rows(srv.database_url, short) > 0
    wait_for(lambda: rows(srv.database_url, short) == 0, timeout=10, interval=0.2)
    assert rows(srv.database_url, long_) == 30
    assert to_queue(adm, long_, "l0")["duplicates"] == [long_]


# -- the claim outlives the copy ----------------------------------------------------------------


def test_a_duplicate_even_after_ack_expiry_and_dead_lettering(
    srv: LiveServer, adm: httpx.Client
) -> None:
    dlq = windowed(adm)
    q = windowed(adm, dead_letter_queue=dlq)
    # acknowledged
    to_queue(adm, q, "acked")
    with WsClient.admin(srv.ws_url) as ws:
        ws.subscribe(q, 1)
        delivery = ws.delivery()
        assert delivery["message_id"] == "acked"
        assert ws.ack(delivery["delivery_tag"])["type"] != "ERROR"
        wait_for(lambda: stats(adm, q)["in_flight"] == 0, message="the ack")
        assert to_queue(adm, q, "acked")["duplicates"] == [q]
        # dead-lettered (NACK without requeue), into a queue with its own window that
        # already had that message_id: dead-lettering is no publish, the copy arrives
        assert to_queue(adm, dlq, "dead")["queues"] == [dlq]
        to_queue(adm, q, "dead")
        delivery = ws.delivery()
        ws.nack(delivery["delivery_tag"], requeue=False)
    wait_for(lambda: stats(adm, dlq)["ready"] == 2, message="the dead-lettered copy")
    assert stats(adm, q)["ready"] == 0
    assert to_queue(adm, q, "dead")["duplicates"] == [q]
    # expired (TTL 0, nobody subscribed)
    ttl = windowed(adm, arguments={"x-message-ttl": 0})
    to_queue(adm, ttl, "gone")
    wait_for(lambda: stats(adm, ttl)["ready"] == 0, message="the expiry")
    assert to_queue(adm, ttl, "gone")["duplicates"] == [ttl]


def test_a_delayed_copy_claims_its_message_id_at_publish(adm: httpx.Client) -> None:
    q = windowed(adm)
    assert to_queue(adm, q, "later", delay_ms=60_000)["queues"] == [q]
    assert to_queue(adm, q, "later")["duplicates"] == [q]
    assert len(browse(adm, q, "delayed")) == 1
    assert stats(adm, q)["ready"] == 0


def test_a_rejected_copy_does_not_burn_its_message_id(srv: LiveServer, adm: httpx.Client) -> None:
    q = windowed(adm, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    assert to_queue(adm, q, "first")["queues"] == [q]
    full = to_queue(adm, q, "second")
    assert (full["queues"], full["rejected"], full["duplicates"]) == ([], [q], [])
    with WsClient.admin(srv.ws_url) as ws:
        ws.subscribe(q, 1)
        ws.ack(ws.delivery()["delivery_tag"])
        wait_for(lambda: stats(adm, q)["in_flight"] == 0, message="the ack")
    retry = to_queue(adm, q, "second")  # the queue has room again: stored, not a duplicate
    assert (retry["queues"], retry["rejected"], retry["duplicates"]) == ([q], [], [])
    again = to_queue(adm, q, "second")  # it is the queue's own now
    assert (again["rejected"], again["duplicates"]) == ([], [q])


def test_a_batch_with_duplicates_and_rejections_in_one_queue(adm: httpx.Client) -> None:
    q = windowed(adm, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    bind(adm, "amq.direct", q, q)
    results = batch(adm, "amq.direct", [(q, "a"), (q, "a"), (q, "b"), (q, "c"), (q, "b")])
    summary = [(r["queues"], r["rejected"], r["duplicates"]) for r in results]
    # a duplicate takes no room: "b" is the second copy stored, "c" the one rejected
    assert summary == [
        ([q], [], []),
        ([], [], [q]),
        ([q], [], []),
        ([], [q], []),
        ([], [], [q]),
    ]
    assert stats(adm, q)["ready"] == 2


# -- bad arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 86_401, 1.5, "60", True, None, -1])
def test_a_bad_window_is_422_naming_it_and_changes_nothing(adm: httpx.Client, value: Any) -> None:
    q = fresh()
    r = adm.put(f"/queues/{q}", json={"arguments": {WINDOW: value}})
    problem = assert_problem(r, 422, "validation_error")
    assert WINDOW in problem["detail"]
    assert problem["errors"][0]["loc"] == ["body", "arguments", WINDOW]
    assert adm.get(f"/queues/{q}").status_code == 404


def test_the_window_is_part_of_the_declaration(adm: httpx.Client) -> None:
    q = windowed(adm, 60)
    assert adm.get(f"/queues/{q}").json()["arguments"] == {WINDOW: 60}
    assert adm.put(f"/queues/{q}", json={"arguments": {WINDOW: 60}}).status_code == 200
    assert adm.put(f"/queues/{q}", json={"arguments": {WINDOW: 61}}).status_code == 409


# -- exact under concurrency: two broker processes -----------------------------------------------

#: a database of the module's own, as tests/api/test_multiprocess.py makes it
database = test_multiprocess.database


def test_two_processes_racing_one_message_id_store_one_copy(database: str) -> None:
    rounds = 40
    with ExitStack() as stack:
        pair = start_pair(stack, database)
        rests = [pair.rest_a, pair.rest_b]
        q = windowed(rests[0])
        bind(rests[0], "amq.direct", q, q)
        barrier = threading.Barrier(4)
        outcomes: list[tuple[int, str]] = []
        lock = threading.Lock()

        def publisher(rest: httpx.Client, single: bool) -> None:
            for round_ in range(rounds):
                barrier.wait(timeout=30)
                mid = f"race-{round_}"
                if single:
                    r = rest.post(
                        f"/queues/{q}/messages", json={"body": 1, "properties": {"message_id": mid}}
                    )
                    assert r.status_code == 200, r.text
                    found = [r.json()]
                else:
                    found = batch(rest, "amq.direct", [(q, f"other-{round_}"), (q, mid)])[1:]
                with lock:
                    outcomes.extend(
                        (round_, "stored" if f["queues"] == [q] else "duplicate") for f in found
                    )

        threads = [
            threading.Thread(target=publisher, args=(rest, single))
            for rest in rests
            for single in (True, False)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(outcomes) == 4 * rounds
        for round_ in range(rounds):
            mine = sorted(o for r, o in outcomes if r == round_)
            assert mine == ["duplicate", "duplicate", "duplicate", "stored"], (round_, mine)
        # one copy per race, plus each batch's own "other" message (two batches share it)
        assert stats(rests[1], q)["ready"] == 2 * rounds
        ids = [m["message_id"] for m in browse(rests[1], q)]
        assert len(ids) == len(set(ids))


def test_rest_racing_an_sql_publish_of_one_message_id_stores_one_copy(
    srv: LiveServer, adm: httpx.Client
) -> None:
    """Contract §15 and §18: a REST publish and a ``messagex.publish_to_queue`` from an
    application's own transaction, released together, store one copy between them."""
    rounds = 30
    q = windowed(adm)
    barrier = threading.Barrier(2)
    outcomes: list[tuple[int, str, str]] = []
    lock = threading.Lock()

    def rest_side() -> None:
        for round_ in range(rounds):
            barrier.wait(timeout=30)
            r = adm.post(
                f"/queues/{q}/messages",
                json={"body": 1, "properties": {"message_id": f"x-{round_}"}},
            )
            assert r.status_code == 200, r.text
            with lock:
                outcomes.append((round_, "rest", "stored" if r.json()["queues"] else "duplicate"))

    async def sql_side() -> None:
        conn = await asyncpg.connect(asyncpg_dsn(str(srv.settings.database_url)))
        try:
            for round_ in range(rounds):
                await asyncio.to_thread(barrier.wait, 30)
                result = await conn.fetchval(
                    "SELECT messagex.publish_to_queue($1, '1', '{}', $2::jsonb)::text",
                    q,
                    f'{{"message_id": "x-{round_}"}}',
                )
                stored = q in json.loads(result)["queues"]
                with lock:
                    outcomes.append((round_, "sql", "stored" if stored else "duplicate"))
        finally:
            await conn.close()

    rest = threading.Thread(target=rest_side)
    rest.start()
    asyncio.run(sql_side())
    rest.join()
    for round_ in range(rounds):
        mine = sorted(o for r, _, o in outcomes if r == round_)
        assert mine == ["duplicate", "stored"], (round_, mine)
    assert stats(adm, q)["ready"] == rounds
    winners = {side for _, side, o in outcomes if o == "stored"}
    print(f"\nREST vs SQL: {rounds} races, stored by {sorted(winners)}")
