"""Contract §13 through the real server: TTL (x-message-ttl, expiration), the expiry sweep,
dead-lettering through an exchange (x-dead-letter-exchange / -routing-key), the cycle rule
and queue expiry (x-expires)."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from datetime import datetime
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from app.storage.dsn import asyncpg_dsn
from tests.support import LiveServer, metric, wait_for
from tests.wsclient import WsClient, bind, browse, declare_queue, publish

#: settings of this module's shared server (the ``srv`` fixture in tests/conftest.py)
SERVER_SETTINGS = {"ack_timeout_check_interval_ms": 100}

_names = itertools.count()


def fresh(prefix: str = "q") -> str:
    return f"{prefix}{next(_names)}x{uuid.uuid4().hex[:6]}"


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def ms_between(a: str, b: str) -> float:
    return (parse_time(b) - parse_time(a)).total_seconds() * 1000


def ttls(srv: LiveServer, queue: str) -> dict[str, float | None]:
    """Each stored copy's TTL (expires_at - available_at, ms) by body, read from the table
    (white box: browse shows the contract's fields only)."""

    async def read() -> list[Any]:
        conn = await asyncpg.connect(asyncpg_dsn(srv.database_url))
        try:
            rows: list[Any] = await conn.fetch(
                "SELECT convert_from(m.body, 'UTF8'),"
                " EXTRACT(EPOCH FROM m.expires_at - m.available_at) * 1000"
                " FROM messages AS m JOIN queues AS q ON q.id = m.queue_id WHERE q.name = $1",
                queue,
            )
            return rows
        finally:
            await conn.close()

    found: dict[str, float | None] = {}
    for body, ms in asyncio.run(read()):
        value = orjson.loads(body)
        found[value if isinstance(value, str) else body] = None if ms is None else float(ms)
    return found


def counter(srv: LiveServer, name: str, **labels: str) -> float:
    return metric(httpx.get(f"{srv.base_url}/metrics").text, name, **labels) or 0.0


def declare_exchange(adm: httpx.Client, name: str, type: str = "direct") -> None:
    r = adm.put(f"/exchanges/{name}", json={"type": type})
    assert r.status_code in (200, 201), r.text


def get(adm: httpx.Client, queue: str, **body: Any) -> list[dict[str, Any]]:
    r = adm.post(f"/queues/{queue}/get", json=body)
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def gone_within(adm: httpx.Client, queue: str, seconds: float) -> None:
    wait_for(lambda: browse(adm, queue) == [], seconds, message=f"{queue} emptied")


# -- TTL -------------------------------------------------------------------------------------


def test_a_ttl_copy_is_dead_lettered_through_an_exchange_with_reason_expired(
    srv: LiveServer, adm: httpx.Client
) -> None:
    dlx, q, target, other = fresh("dlx"), fresh(), fresh("t"), fresh("o")
    declare_exchange(adm, dlx)
    declare_queue(adm, target)
    declare_queue(adm, other)
    bind(adm, dlx, target, q)  # the copy's own routing key (its queue's name) by default
    bind(adm, dlx, other, "something else")
    declare_queue(adm, q, arguments={"x-message-ttl": 300, "x-dead-letter-exchange": dlx})
    before = counter(srv, "messagex_messages_expired_total", outcome="dead_lettered")
    sent = publish(
        adm, q, {"n": 1}, headers={"tenant": "acme"}, properties={"correlation_id": "c1"}
    )
    [stored] = browse(adm, q)
    assert list(ttls(srv, q).values()) == [pytest.approx(300, abs=1)]
    start = time.monotonic()
    wait_for(lambda: browse(adm, target) != [], 5, message="dead-lettered to the target")
    # within 1 s of its expiry (300 ms), with slack for a busy machine
    assert time.monotonic() - start < 2.5
    assert browse(adm, q) == []
    assert browse(adm, other) == []
    [dead] = browse(adm, target)
    assert dead["message_id"] == sent["message_id"]
    assert dead["status"] == "ready"
    assert dead["delivery_count"] == 0
    assert dead["body"] == {"n": 1}
    assert dead["headers"]["tenant"] == "acme"
    assert dead["properties"]["correlation_id"] == "c1"
    assert dead["created_at"] == stored["created_at"]
    assert dead["exchange"] == dlx
    assert dead["routing_key"] == q
    assert list(ttls(srv, target).values()) == [None]  # the target has no TTL
    [death] = dead["headers"]["x-death"]
    assert (death["queue"], death["reason"], death["count"]) == (q, "expired", 1)
    assert (death["exchange"], death["routing_keys"]) == ("", [q])
    assert counter(srv, "messagex_messages_expired_total", outcome="dead_lettered") >= before + 1
    assert counter(srv, "messagex_messages_dead_lettered_total", reason="expired") >= 1
    # and it is delivered from there
    [m] = get(adm, target)
    assert m["message_id"] == sent["message_id"]


def test_an_expired_copy_without_a_target_is_deleted_and_never_delivered(
    srv: LiveServer, adm: httpx.Client
) -> None:
    q = fresh()
    declare_queue(adm, q, arguments={"x-message-ttl": 200})
    before = counter(srv, "messagex_messages_expired_total", outcome="discarded")
    publish(adm, q, "old")
    time.sleep(0.25)  # past its expiry: even before the sweep, a claim must skip it
    assert get(adm, q) == []
    gone_within(adm, q, 3)
    assert counter(srv, "messagex_messages_expired_total", outcome="discarded") == before + 1


def test_the_smaller_of_expiration_and_x_message_ttl_wins(
    srv: LiveServer, adm: httpx.Client
) -> None:
    long_q, short_q, plain = fresh("long"), fresh("short"), fresh("plain")
    declare_queue(adm, long_q, arguments={"x-message-ttl": 60_000})
    declare_queue(adm, short_q, arguments={"x-message-ttl": 250})
    declare_queue(adm, plain)
    publish(adm, long_q, "a", properties={"expiration": "250"})  # expiration wins
    publish(adm, long_q, "b")  # queue TTL only: a minute
    publish(adm, short_q, "c", properties={"expiration": "60000"})  # queue TTL wins
    publish(adm, plain, "d", properties={"expiration": "250"})  # expiration alone
    publish(adm, plain, "e")  # neither: never
    ttl = ttls(srv, long_q) | ttls(srv, short_q) | ttls(srv, plain)
    assert ttl.pop("e") is None
    assert ttl == pytest.approx({"a": 250, "b": 60_000, "c": 250, "d": 250}, abs=1)
    wait_for(
        lambda: (
            [r["body"] for r in browse(adm, long_q) + browse(adm, short_q) + browse(adm, plain)]
            == ["b", "e"]
        ),
        5,
        message="the short-lived copies expired",
    )


def test_a_requeue_of_a_copy_past_its_expiry_expires_it(srv: LiveServer, adm: httpx.Client) -> None:
    dlq, with_target, without = fresh("dlq"), fresh(), fresh()
    declare_queue(adm, dlq)
    declare_queue(adm, with_target, dead_letter_queue=dlq, arguments={"x-message-ttl": 300})
    declare_queue(adm, without, arguments={"x-message-ttl": 300})
    publish(adm, with_target, "a")
    publish(adm, without, "b")
    [a] = get(adm, with_target)
    [b] = get(adm, without)
    time.sleep(0.5)  # in flight it never expires ...
    assert [r["status"] for r in browse(adm, with_target) + browse(adm, without)] == [
        "in_flight",
        "in_flight",
    ]
    # ... but a requeue of it, past its expiry, expires it instead
    r = adm.post(f"/deliveries/{a['delivery_tag']}/nack", json={"requeue": True})
    assert r.status_code == 200, r.text
    assert r.json()["outcome"] == "dead_lettered"
    r = adm.post(f"/deliveries/{b['delivery_tag']}/nack", json={"requeue": True})
    assert r.status_code == 200, r.text
    assert r.json()["outcome"] == "discarded"
    assert browse(adm, with_target) == []
    assert browse(adm, without) == []
    [dead] = browse(adm, dlq)
    assert dead["headers"]["x-death"][0]["reason"] == "expired"
    assert dead["headers"]["x-death"][0]["queue"] == with_target


def test_a_websocket_nack_and_a_disconnect_expire_a_copy_past_its_expiry(
    srv: LiveServer, adm: httpx.Client
) -> None:
    q = fresh()
    declare_queue(adm, q, arguments={"x-message-ttl": 800})
    publish(adm, q, "one")
    publish(adm, q, "two")
    # both copies became available before this instant: 800 ms later both are past expiry
    published = time.monotonic()
    with WsClient.admin(srv.ws_url) as ws:
        ws.subscribe(q, 2)
        first, _second = ws.deliveries_n(2)
        time.sleep(max(0.0, published + 0.9 - time.monotonic()))
        assert ws.nack(first["delivery_tag"])["outcome"] == "discarded"
    # the disconnect released "two" past its expiry: it expired rather than returning
    wait_for(lambda: browse(adm, q) == [], 3, message="released copy expired")
    assert get(adm, q) == []


def test_an_ack_timeout_of_a_copy_past_its_expiry_expires_it(
    srv: LiveServer, adm: httpx.Client
) -> None:
    dlq, with_target, without = fresh("dlq"), fresh(), fresh()
    declare_queue(adm, dlq)
    lease = {"ack_timeout_seconds": 1, "arguments": {"x-message-ttl": 300}}
    declare_queue(adm, with_target, dead_letter_queue=dlq, **lease)
    declare_queue(adm, without, **lease)

    def released(outcome: str) -> float:
        return counter(
            srv, "messagex_deliveries_released_total", reason="ack_timeout", outcome=outcome
        )

    before = {o: released(o) for o in ("requeued", "dead_lettered", "discarded")}
    publish(adm, with_target, "a")
    publish(adm, without, "b")
    [a] = get(adm, with_target)
    [b] = get(adm, without)

    # in flight it never expires; once its lease runs out (1 s, well past the 300 ms TTL) the
    # release expires it instead of requeueing it: it is never ready here again
    def expired_on_release() -> bool:
        rows = browse(adm, with_target) + browse(adm, without)
        assert all(r["status"] == "in_flight" for r in rows), rows
        return rows == []

    wait_for(expired_on_release, 5, message="the ack timeout to release both copies")
    [dead] = browse(adm, dlq)
    assert dead["message_id"] == a["message_id"]
    assert dead["status"] == "ready"
    [death] = dead["headers"]["x-death"]
    assert (death["queue"], death["reason"], death["count"]) == (with_target, "expired", 1)
    assert released("dead_lettered") == before["dead_lettered"] + 1
    assert released("discarded") == before["discarded"] + 1
    assert released("requeued") == before["requeued"]
    # the leases are gone with them: a late settlement is of an unknown delivery
    for m in (a, b):
        assert adm.post(f"/deliveries/{m['delivery_tag']}/ack").status_code == 404
    assert get(adm, with_target) == get(adm, without) == []


def test_ttl_zero_is_delivered_only_to_a_waiting_subscriber(
    adm: httpx.Client, srv: LiveServer
) -> None:
    q = fresh()
    declare_queue(adm, q, arguments={"x-message-ttl": 0})
    dispatcher = srv.services.delivery.dispatcher
    with WsClient.admin(srv.ws_url) as ws:
        ws.subscribe(q, 5)
        # idle: its dispatcher is not claiming (white box), so the publish can hand it off
        wait_for(
            lambda: not any(lock.locked() for lock in dispatcher._locks.values()),
            3,
            message="the subscriber to be idle",
        )
        publish(adm, q, "taken")
        d = ws.delivery()
        assert d["body"] == "taken"
        assert ws.ack(d["delivery_tag"])["type"] == "ACKED"
    # nobody waiting: it expires at once and a later subscriber never sees it
    publish(adm, q, "lost")
    assert get(adm, q) == []
    with WsClient.admin(srv.ws_url) as ws:
        ws.subscribe(q, 5)
        assert ws.quiet(0.5) == []
    gone_within(adm, q, 3)


def test_a_delayed_copy_expires_counting_from_its_available_at(
    srv: LiveServer, adm: httpx.Client
) -> None:
    q = fresh()
    declare_queue(adm, q, arguments={"x-message-ttl": 400})
    publish(adm, q, "later", delay_ms=600)
    [row] = browse(adm, q)
    assert row["status"] == "delayed"
    assert ttls(srv, q) == {"later": pytest.approx(400, abs=1)}
    time.sleep(0.45)  # longer than the TTL since publish, but not since it became available
    [m] = get(adm, q, wait_ms=2000)
    assert m["body"] == "later"


# -- dead-letter exchanges --------------------------------------------------------------------


def test_dead_letter_routing_key_override_and_fan_out(adm: httpx.Client) -> None:
    dlx, q, t1, t2 = fresh("dlx"), fresh(), fresh("t"), fresh("t")
    declare_exchange(adm, dlx, "topic")
    for t in (t1, t2):
        declare_queue(adm, t)
    bind(adm, dlx, t1, "dead.#")
    bind(adm, dlx, t2, "#.letter")
    declare_queue(
        adm,
        q,
        arguments={
            "x-dead-letter-exchange": dlx,
            "x-dead-letter-routing-key": "dead.letter",
        },
    )
    publish(adm, q, "rejected")
    [m] = get(adm, q)
    r = adm.post(f"/deliveries/{m['delivery_tag']}/nack", json={"requeue": False})
    assert r.json()["outcome"] == "dead_lettered"
    [c1], [c2] = browse(adm, t1), browse(adm, t2)
    assert c1["message_id"] == c2["message_id"] == m["message_id"]
    assert c1["id"] != c2["id"]  # a new copy in every matched queue
    for c in (c1, c2):
        assert c["routing_key"] == "dead.letter"
        assert c["exchange"] == dlx
        assert c["headers"]["x-death"][0]["reason"] == "rejected"
        assert c["headers"]["x-death"][0]["routing_keys"] == [q]


def test_a_dead_letter_exchange_matching_no_queue_drops_the_copy(
    srv: LiveServer, adm: httpx.Client
) -> None:
    dlx, q = fresh("dlx"), fresh()
    declare_exchange(adm, dlx)
    declare_queue(adm, q, arguments={"x-dead-letter-exchange": dlx, "x-message-ttl": 100})
    before = counter(srv, "messagex_dead_letters_dropped_total", reason="expired")
    publish(adm, q, "nowhere")
    gone_within(adm, q, 3)
    wait_for(
        lambda: counter(srv, "messagex_dead_letters_dropped_total", reason="expired") == before + 1,
        3,
        message="counted as dropped",
    )


def test_the_cycle_rule_drops_a_copy_going_back_where_it_expired(
    srv: LiveServer, adm: httpx.Client
) -> None:
    # a expires into b through the exchange, b expires back into a: a already has an x-death
    # entry (a, expired), so the copy is dropped rather than circling for ever
    dlx, a, b = fresh("dlx"), fresh("a"), fresh("b")
    declare_exchange(adm, dlx)
    declare_queue(
        adm,
        a,
        arguments={
            "x-message-ttl": 150,
            "x-dead-letter-exchange": dlx,
            "x-dead-letter-routing-key": "to-b",
        },
    )
    declare_queue(
        adm,
        b,
        arguments={
            "x-message-ttl": 150,
            "x-dead-letter-exchange": dlx,
            "x-dead-letter-routing-key": "to-a",
        },
    )
    bind(adm, dlx, a, "to-a")
    bind(adm, dlx, b, "to-b")
    dropped = counter(srv, "messagex_dead_letters_dropped_total", reason="expired")
    publish(adm, a, "round")
    wait_for(
        lambda: (
            counter(srv, "messagex_dead_letters_dropped_total", reason="expired") == dropped + 1
        ),
        5,
        message="dropped by the cycle rule",
    )
    assert browse(adm, a) == []
    assert browse(adm, b) == []


def test_the_cycle_rule_spares_rejections(adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q, arguments={"x-dead-letter-exchange": "amq.direct"})
    bind(adm, "amq.direct", q, q)  # dead-letters back into itself
    publish(adm, q, "again")
    for count in (1, 2):
        [m] = get(adm, q)
        r = adm.post(f"/deliveries/{m['delivery_tag']}/nack", json={"requeue": False})
        assert r.json()["outcome"] == "dead_lettered"
        [back] = browse(adm, q)
        [death] = back["headers"]["x-death"]
        assert (death["queue"], death["reason"], death["count"]) == (q, "rejected", count)


def test_a_dead_letter_exchange_must_exist_and_cannot_be_deleted(adm: httpx.Client) -> None:
    dlx, q1, q2 = fresh("dlx"), fresh("b"), fresh("a")
    r = adm.put(f"/queues/{q1}", json={"arguments": {"x-dead-letter-exchange": dlx}})
    assert r.status_code == 404, r.text
    assert adm.get(f"/queues/{q1}").status_code == 404
    declare_exchange(adm, dlx)
    declare_queue(adm, q1, arguments={"x-dead-letter-exchange": dlx})
    declare_queue(adm, q2, arguments={"x-dead-letter-exchange": dlx})
    r = adm.delete(f"/exchanges/{dlx}")
    assert r.status_code == 409, r.text
    assert q1 in r.json()["detail"]
    assert q2 in r.json()["detail"]
    assert adm.get(f"/exchanges/{dlx}").status_code == 200
    for q in (q1, q2):
        assert adm.delete(f"/queues/{q}").status_code == 204
    assert adm.delete(f"/exchanges/{dlx}").status_code == 204


def test_both_dead_letter_targets_is_422(adm: httpx.Client) -> None:
    dlq, q = fresh("dlq"), fresh()
    declare_queue(adm, dlq)
    r = adm.put(
        f"/queues/{q}",
        json={"dead_letter_queue": dlq, "arguments": {"x-dead-letter-exchange": "amq.direct"}},
    )
    assert r.status_code == 422
    assert "x-dead-letter-exchange" in r.text
    assert adm.get(f"/queues/{q}").status_code == 404


# -- queue expiry -----------------------------------------------------------------------------


def test_x_expires_deletes_an_unused_queue_and_not_a_used_one(
    srv: LiveServer, adm: httpx.Client
) -> None:
    unused, subscribed, pulled, redeclared = fresh("u"), fresh("s"), fresh("p"), fresh("r")
    args = {"x-expires": 1000}
    for q in (unused, subscribed, pulled, redeclared):
        declare_queue(adm, q, arguments=args)
    with WsClient.admin(srv.ws_url) as ws:
        ws.subscribe(subscribed, 1)
        deadline = time.monotonic() + 4  # x-expires + the check interval + slack
        while adm.get(f"/queues/{unused}").status_code == 200:
            assert time.monotonic() < deadline, "the unused queue did not expire"
            assert get(adm, pulled) == []
            declare_queue(adm, redeclared, arguments=args)
            time.sleep(0.2)  # a user of the queues, every 200 ms
        for q in (subscribed, pulled, redeclared):
            assert adm.get(f"/queues/{q}").status_code == 200, q
    # the subscription ended: from then on it expires too (its idle time starts again)
    wait_for(lambda: adm.get(f"/queues/{subscribed}").status_code == 404, 4, message="idle")


def test_an_expiring_queue_goes_the_way_delete_does(srv: LiveServer, adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q, arguments={"x-expires": 1000})
    bind(adm, "amq.direct", q, q)
    publish(adm, q, "goes with it")
    wait_for(lambda: adm.get(f"/queues/{q}").status_code == 404, 4, message="expired")
    r = adm.get("/bindings", params={"queue": q})
    assert r.status_code == 200
    assert r.json()["items"] == []


def test_an_auto_delete_exchange_named_as_dead_letter_exchange_stays(adm: httpx.Client) -> None:
    dlx, q, bound = fresh("dlx"), fresh(), fresh("b")
    r = adm.put(f"/exchanges/{dlx}", json={"type": "direct", "auto_delete": True})
    assert r.status_code == 201, r.text
    declare_queue(adm, bound)
    bind(adm, dlx, bound, "k")
    declare_queue(adm, q, arguments={"x-dead-letter-exchange": dlx})
    # its last binding goes with the queue: an auto-delete exchange would go too, but q names it
    assert adm.delete(f"/queues/{bound}").status_code == 204
    assert adm.get(f"/exchanges/{dlx}").status_code == 200


def test_dead_lettering_routes_on_through_exchange_bindings_and_alternates(
    adm: httpx.Client,
) -> None:
    """A dead-letter exchange routes with full routing (§13 via §14): on through an
    exchange-to-exchange binding, and through an alternate exchange when it matches nothing."""
    first, onward, fallback = fresh("dlx"), fresh("dlx"), fresh("alt")
    via_binding, via_alternate, q = fresh("dead"), fresh("dead"), fresh()
    declare_exchange(adm, fallback, "fanout")
    r = adm.put(
        f"/exchanges/{first}",
        json={"type": "direct", "arguments": {"alternate-exchange": fallback}},
    )
    assert r.status_code == 201, r.text
    declare_exchange(adm, onward, "fanout")
    declare_queue(adm, via_binding)
    declare_queue(adm, via_alternate)
    bind(adm, onward, via_binding)
    bind(adm, fallback, via_alternate)
    r = adm.post(
        "/bindings",
        json={"exchange": first, "destination_exchange": onward, "routing_key": "to-onward"},
    )
    assert r.status_code == 201, r.text
    other = fresh()
    for queue, key in ((q, "to-onward"), (other, "nothing-matches")):
        arguments = {"x-dead-letter-exchange": first, "x-dead-letter-routing-key": key}
        declare_queue(adm, queue, arguments=arguments)
    publish(adm, q, "on", properties={"expiration": "0"})
    publish(adm, other, "alt", properties={"expiration": "0"})
    wait_for(
        lambda: (
            [m["body"] for m in browse(adm, via_binding)] == ["on"]
            and [m["body"] for m in browse(adm, via_alternate)] == ["alt"]
        ),
        5,
        message="dead-lettered through the exchange graph",
    )
    for queue, source in ((via_binding, q), (via_alternate, other)):
        [dead] = browse(adm, queue)
        assert dead["headers"]["x-death"][0]["reason"] == "expired"
        assert dead["headers"]["x-death"][0]["queue"] == source
    assert browse(adm, q) == browse(adm, other) == []
