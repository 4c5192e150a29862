"""Priorities and length limits (contract §13) through the real server: claim order by
priority, x-max-length / x-max-length-bytes with each x-overflow, the ``rejected`` field of
every publish result, the metrics, and the limit holding exactly with publishers on two
broker processes racing."""

from __future__ import annotations

import asyncio
import base64
import itertools
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
from tests.support import (
    LiveServer,
    metric,
    wait_for,
)
from tests.wsclient import WsClient, bind, browse, declare_queue, publish, stats

_names = itertools.count()


def fresh(prefix: str = "q") -> str:
    return f"{prefix}{next(_names)}x{uuid.uuid4().hex[:6]}"


@pytest.fixture
def url(srv: LiveServer) -> str:
    return srv.ws_url


def counter(srv: LiveServer, name: str, **labels: str) -> float:
    return metric(httpx.get(f"{srv.base_url}/metrics").text, name, **labels) or 0.0


def bodies(adm: httpx.Client, queue: str, status: str | None = None) -> list[Any]:
    return [m["body"] for m in browse(adm, queue, status)]


def publish_to(adm: httpx.Client, exchange: str, key: str, body: Any, **extra: Any) -> Any:
    r = adm.post(f"/exchanges/{exchange}/publish", json={"routing_key": key, "body": body, **extra})
    assert r.status_code == 200, r.text
    return r.json()


# -- priority -----------------------------------------------------------------------------


def test_a_prefetch_1_consumer_sees_priority_order(url: str, adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q, arguments={"x-max-priority": 10})
    sent = [("p1", 1), ("none", None), ("p5a", 5), ("p10", 10), ("p200", 200), ("p5b", 5)]
    for body, priority in sent:
        properties = {} if priority is None else {"priority": priority}
        publish(adm, q, body, properties=properties)
    # 200 counts as the maximum, 10: after p10 (published first); no priority counts as 0
    expected = ["p10", "p200", "p5a", "p5b", "p1", "none"]
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 1)
        got = []
        for _ in expected:
            d = ws.delivery()
            got.append(d["body"])
            assert ws.quiet(0.05) == []  # prefetch 1: nothing more until the ack
            assert ws.ack(d["delivery_tag"])["type"] == "ACKED"
    assert got == expected


def test_a_pull_get_claims_by_priority_and_a_plain_queue_ignores_it(adm: httpx.Client) -> None:
    prio, plain = fresh(), fresh()
    declare_queue(adm, prio, arguments={"x-max-priority": 3})
    declare_queue(adm, plain)
    for body, priority in [("a", 0), ("b", 2), ("c", 3), ("d", 9)]:
        publish(adm, prio, body, properties={"priority": priority})
        publish(adm, plain, body, properties={"priority": priority})
    got = adm.post(f"/queues/{prio}/get", json={"max_messages": 4}).json()
    assert [m["body"] for m in got["messages"]] == ["c", "d", "b", "a"]
    got = adm.post(f"/queues/{plain}/get", json={"max_messages": 4}).json()
    assert [m["body"] for m in got["messages"]] == ["a", "b", "c", "d"]


def test_a_requeued_copy_keeps_its_priority(url: str, adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q, arguments={"x-max-priority": 5})
    publish(adm, q, "high", properties={"priority": 5})
    publish(adm, q, "low")
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 1)
        d = ws.delivery()
        assert d["body"] == "high"
        assert ws.nack(d["delivery_tag"])["outcome"] == "requeued"
        assert ws.delivery()["body"] == "high"


def test_a_copy_dead_lettered_into_a_priority_queue_takes_its_priority(
    url: str, adm: httpx.Client
) -> None:
    dlq, q = fresh("dlq"), fresh()
    declare_queue(adm, dlq, arguments={"x-max-priority": 9})
    declare_queue(adm, q, dead_letter_queue=dlq)
    publish(adm, dlq, "waiting", properties={"priority": 1})
    publish(adm, q, "urgent", properties={"priority": 7})
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 1)
        d = ws.delivery()
        assert ws.nack(d["delivery_tag"], requeue=False)["outcome"] == "dead_lettered"
    with WsClient.admin(url) as ws:
        ws.subscribe(dlq, 1)
        assert ws.delivery()["body"] == "urgent"


# -- length limits --------------------------------------------------------------------------


def test_drop_head_dead_letters_the_oldest_with_reason_maxlen(
    srv: LiveServer, url: str, adm: httpx.Client
) -> None:
    dlq, q = fresh("dlq"), fresh()
    declare_queue(adm, dlq)
    declare_queue(adm, q, dead_letter_queue=dlq, arguments={"x-max-length": 2})
    before = counter(
        srv, "messagex_message_copies_dropped_total", reason="maxlen", outcome="dead_lettered"
    )
    for i in range(5):
        result = publish(adm, q, i)
        assert result["queues"] == [q]
        assert result["rejected"] == []
    assert bodies(adm, q) == [3, 4]
    dead = browse(adm, dlq)
    assert [m["body"] for m in dead] == [0, 1, 2]
    for m in dead:
        [death] = m["headers"]["x-death"]
        assert death["queue"] == q
        assert death["reason"] == "maxlen"
        assert death["routing_keys"] == [q]
    after = counter(
        srv, "messagex_message_copies_dropped_total", reason="maxlen", outcome="dead_lettered"
    )
    assert after - before == 3
    # the dead-lettered copies are delivered from the dead-letter queue
    with WsClient.admin(url) as ws:
        ws.subscribe(dlq, 10)
        assert [d["body"] for d in ws.deliveries_n(3)] == [0, 1, 2]


def test_drop_head_without_a_target_deletes_and_a_batch_keeps_its_tail(
    srv: LiveServer, adm: httpx.Client
) -> None:
    q = fresh()
    declare_queue(adm, q, arguments={"x-max-length": 3, "x-overflow": "drop-head"})
    bind(adm, "amq.direct", q, q)
    before = counter(
        srv, "messagex_message_copies_dropped_total", reason="maxlen", outcome="discarded"
    )
    r = adm.post(
        "/exchanges/amq.direct/publish-batch",
        json={"messages": [{"routing_key": q, "body": i} for i in range(10)]},
    )
    assert r.status_code == 200, r.text
    assert all(res["queues"] == [q] and res["rejected"] == [] for res in r.json()["results"])
    assert bodies(adm, q) == [7, 8, 9]
    after = counter(
        srv, "messagex_message_copies_dropped_total", reason="maxlen", outcome="discarded"
    )
    assert after - before == 7


def test_reject_publish_in_a_fan_out_stores_the_other_copies(
    srv: LiveServer, adm: httpx.Client
) -> None:
    exchange, full, other = fresh("fan"), fresh("full"), fresh("other")
    assert adm.put(f"/exchanges/{exchange}", json={"type": "fanout"}).status_code == 201
    declare_queue(adm, full, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    declare_queue(adm, other)
    bind(adm, exchange, full)
    bind(adm, exchange, other)
    before = counter(
        srv, "messagex_message_copies_rejected_total", reason="maxlen", outcome="discarded"
    )
    first = publish_to(adm, exchange, "", "first")
    assert sorted(first["queues"]) == sorted([full, other])
    assert first["rejected"] == []
    assert first["duplicates"] == []
    second = publish_to(adm, exchange, "", "second")
    assert second["routed"] is True
    assert second["queues"] == [other]
    assert second["rejected"] == [full]
    assert second["duplicates"] == []
    assert bodies(adm, full) == ["first"]
    assert bodies(adm, other) == ["first", "second"]
    after = counter(
        srv, "messagex_message_copies_rejected_total", reason="maxlen", outcome="discarded"
    )
    assert after - before == 1
    # a mandatory publish whose only queue rejects it is routed, so not unroutable
    r = adm.post(f"/queues/{full}/messages", json={"body": "third", "mandatory": True})
    assert r.status_code == 200, r.text
    assert r.json()["routed"] is True
    assert r.json()["queues"] == []
    assert r.json()["rejected"] == [full]


def test_reject_publish_dlx_dead_letters_the_rejected_copy(
    srv: LiveServer, adm: httpx.Client
) -> None:
    dlq, q = fresh("dlq"), fresh()
    declare_queue(adm, dlq)
    declare_queue(
        adm,
        q,
        dead_letter_queue=dlq,
        arguments={"x-max-length": 1, "x-overflow": "reject-publish-dlx"},
    )
    bind(adm, "amq.direct", q, q)
    r = adm.post(
        "/exchanges/amq.direct/publish-batch",
        json={"messages": [{"routing_key": q, "body": i} for i in range(3)]},
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [res["queues"] for res in results] == [[q], [], []]
    assert [res["rejected"] for res in results] == [[], [q], [q]]
    assert bodies(adm, q) == [0]
    dead = browse(adm, dlq)
    assert [m["body"] for m in dead] == [1, 2]
    assert [m["message_id"] for m in dead] == [res["message_id"] for res in results[1:]]
    for m in dead:
        [death] = m["headers"]["x-death"]
        assert (death["queue"], death["reason"], death["exchange"]) == (q, "maxlen", "amq.direct")
    assert (
        counter(
            srv,
            "messagex_message_copies_rejected_total",
            reason="maxlen",
            outcome="dead_lettered",
        )
        >= 2
    )


def test_the_bytes_limit_counts_body_bytes_of_ready_copies(adm: httpx.Client) -> None:
    drop, reject = fresh("drop"), fresh("reject")
    declare_queue(adm, drop, arguments={"x-max-length-bytes": 10})
    declare_queue(adm, reject, arguments={"x-max-length-bytes": 10, "x-overflow": "reject-publish"})
    for i in range(3):
        raw = base64.b64encode(bytes([i]) * 4).decode()
        publish(adm, drop, body_base64=raw)
        result = publish(adm, reject, body_base64=raw)
        assert result["rejected"] == ([] if i < 2 else [reject])
    # 12 bytes do not fit in 10: the oldest 4 leave (drop-head); the third is refused
    assert [m["body_base64"] for m in browse(adm, drop)] == [
        base64.b64encode(bytes([i]) * 4).decode() for i in (1, 2)
    ]
    assert len(browse(adm, reject)) == 2
    # a body larger than the whole limit never fits
    big = base64.b64encode(b"x" * 11).decode()
    assert publish(adm, reject, body_base64=big)["rejected"] == [reject]
    publish(adm, drop, body_base64=big)
    assert browse(adm, drop) == []


def test_drop_head_in_a_fan_out_trims_each_queue_and_not_the_delayed(
    srv: LiveServer, adm: httpx.Client
) -> None:
    """The trim that runs in the publish's own INSERT (storage/limits.py INSERT_TRIMMING):
    two full queues in one publish, each trimmed by its own count; a delayed copy is stored
    and does not count, so it drops nothing."""
    queues = [fresh(), fresh()]
    key = fresh("k")
    for q in queues:
        declare_queue(adm, q, arguments={"x-max-length": 3})
        bind(adm, "amq.direct", q, key)
    before = counter(
        srv, "messagex_message_copies_dropped_total", reason="maxlen", outcome="discarded"
    )

    def batch(items: list[dict[str, Any]]) -> None:
        r = adm.post("/exchanges/amq.direct/publish-batch", json={"messages": items})
        assert r.status_code == 200, r.text
        assert all(res["queues"] == sorted(queues) for res in r.json()["results"]), r.text

    batch([{"routing_key": key, "body": i} for i in range(3)])
    batch(
        [
            {"routing_key": key, "body": 3},
            {"routing_key": key, "body": 4},
            {"routing_key": key, "body": "later", "delay_ms": 60_000},
        ]
    )
    for q in queues:
        assert bodies(adm, q, "ready") == [2, 3, 4]
        s = stats(adm, q)
        assert (s["ready"], s["delayed"]) == (3, 1)
    after = counter(
        srv, "messagex_message_copies_dropped_total", reason="maxlen", outcome="discarded"
    )
    assert after - before == 4


def test_delayed_and_in_flight_copies_do_not_count(url: str, adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 1)
        assert publish(adm, q, "in flight")["rejected"] == []
        assert ws.delivery()["body"] == "in flight"
        for i in range(2):
            assert publish(adm, q, f"later {i}", delay_ms=60_000)["rejected"] == []
        assert publish(adm, q, "ready")["rejected"] == []
        assert publish(adm, q, "one too many")["rejected"] == [q]
        s = stats(adm, q)
        assert (s["ready"], s["delayed"], s["in_flight"]) == (1, 2, 1)


def test_a_requeue_into_a_full_queue_drops_the_head(url: str, adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q, arguments={"x-max-length": 2})
    publish(adm, q, "first")
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 1)
        d = ws.delivery()
        publish(adm, q, "second")
        publish(adm, q, "third")
        # in flight does not count: the queue holds 2 ready; the requeued copy (oldest in
        # claim order) would be a third, so the head leaves and the limit holds
        assert ws.nack(d["delivery_tag"])["outcome"] == "requeued"
        assert ws.ack(ws.delivery()["delivery_tag"])["type"] == "ACKED"
    assert bodies(adm, q) == ["third"]


def test_websocket_published_frames_carry_rejected(url: str, adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q, arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    with WsClient.admin(url) as ws:
        reply = ws.request({"type": "PUBLISH", "queue": q, "body": 1})
        assert reply["type"] == "PUBLISHED"
        assert (reply["routed"], reply["queues"], reply["rejected"]) == (True, [], [q])
        assert reply["duplicates"] == []
    assert stats(adm, q)["ready"] == 0


# -- exact under concurrency: two broker processes --------------------------------------------

#: a database of the module's own, as tests/api/test_multiprocess.py makes it
database = test_multiprocess.database


class Sampler(threading.Thread):
    """Counts a queue's ready copies as fast as it can, each count one snapshot (so the
    state after some commit), and keeps the largest."""

    def __init__(self, database_url: str, queue: str) -> None:
        super().__init__(daemon=True)
        self.url, self.queue = asyncpg_dsn(database_url), queue
        self.stop = threading.Event()
        self.samples: list[int] = []

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            queue_id = await conn.fetchval("SELECT id FROM queues WHERE name = $1", self.queue)
            while not self.stop.is_set():
                self.samples.append(
                    await conn.fetchval(
                        "SELECT count(*) FROM messages WHERE queue_id = $1 "
                        "AND status = 'ready' AND available_at <= now()",
                        queue_id,
                    )
                )
        finally:
            await conn.close()


@pytest.mark.parametrize("overflow", ["drop-head", "reject-publish"])
def test_two_processes_racing_never_pass_the_limit(database: str, overflow: str) -> None:
    q = fresh()
    with ExitStack() as stack:
        pair = start_pair(stack, database)
        rests = [pair.rest_a, pair.rest_b]
        declare_queue(rests[0], q, arguments={"x-max-length": 100, "x-overflow": overflow})
        bind(rests[0], "amq.direct", q, q)
        sampler = Sampler(database, q)
        sampler.start()
        wait_for(lambda: sampler.samples, message="first sample")
        rejected: list[int] = []

        def publisher(rest: httpx.Client, name: str) -> None:
            for round_ in range(15):
                r = rest.post(
                    "/exchanges/amq.direct/publish-batch",
                    json={
                        "messages": [
                            {"routing_key": q, "body": f"{name}{round_}.{i}"} for i in range(20)
                        ]
                    },
                )
                assert r.status_code == 200, r.text
                rejected.append(sum(1 for res in r.json()["results"] if res["rejected"]))

        threads = [
            threading.Thread(target=publisher, args=(rest, f"p{n}{k}"))
            for n, rest in enumerate(rests)
            for k in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sampler.stop.set()
        sampler.join()
        assert max(sampler.samples) <= 100, max(sampler.samples)
        assert len(sampler.samples) > 10
        assert stats(rests[1], q)["ready"] == 100
        if overflow == "reject-publish":
            assert sum(rejected) == 4 * 15 * 20 - 100
        else:
            assert sum(rejected) == 0


def test_drop_head_in_a_priority_queue_drops_in_claim_order(adm: httpx.Client) -> None:
    """The head is what would be claimed next: the highest priority first."""
    q = fresh()
    declare_queue(adm, q, arguments={"x-max-priority": 9, "x-max-length": 2})
    for body, priority in [("p1", 1), ("p5", 5), ("p3", 3)]:
        publish(adm, q, body, properties={"priority": priority})
    assert bodies(adm, q) == ["p1", "p3"]
    got = adm.post(f"/queues/{q}/get", json={"max_messages": 2}).json()
    assert [m["body"] for m in got["messages"]] == ["p3", "p1"]


@pytest.mark.parametrize("overflow", ["drop-head", "reject-publish-dlx"])
def test_maxlen_dead_letters_through_a_dead_letter_exchange(
    adm: httpx.Client, overflow: str
) -> None:
    """The length rule dead-letters through the retry path's one dead-lettering, so a
    dead-letter exchange (with its routing key) receives what drop-head drops and what
    reject-publish-dlx rejects, with x-death reason maxlen."""
    dlx, dead, q = fresh("dlx"), fresh("dead"), fresh()
    r = adm.put(f"/exchanges/{dlx}", json={"type": "direct"})
    assert r.status_code == 201, r.text
    declare_queue(adm, dead)
    bind(adm, dlx, dead, "overflowed")
    arguments = {
        "x-max-length": 1,
        "x-overflow": overflow,
        "x-dead-letter-exchange": dlx,
        "x-dead-letter-routing-key": "overflowed",
    }
    declare_queue(adm, q, arguments=arguments)
    for i in range(3):
        publish(adm, q, i)
    kept, left = ([2], [0, 1]) if overflow == "drop-head" else ([0], [1, 2])
    assert bodies(adm, q) == kept
    moved = browse(adm, dead)
    assert [m["body"] for m in moved] == left
    for m in moved:
        death = m["headers"]["x-death"][0]
        assert (death["queue"], death["reason"]) == (q, "maxlen")
        assert m["routing_key"] == "overflowed"


def test_a_dead_letter_exchange_into_a_limited_queue_keeps_its_limit(adm: httpx.Client) -> None:
    """Copies dropped by one queue's length rule and routed by its dead-letter exchange into
    another limited queue make that one drop its head too, in the same commit."""
    dlx, full, q = fresh("dlx"), fresh("full"), fresh()
    r = adm.put(f"/exchanges/{dlx}", json={"type": "fanout"})
    assert r.status_code == 201, r.text
    declare_queue(adm, full, arguments={"x-max-length": 2})
    bind(adm, dlx, full, "")
    declare_queue(adm, q, arguments={"x-max-length": 1, "x-dead-letter-exchange": dlx})
    for i in range(6):
        publish(adm, q, i)
        assert len(browse(adm, full)) <= 2
    assert bodies(adm, q) == [5]
    assert bodies(adm, full) == [3, 4]
