"""Diagnosis (contract §19) through the real server: each finding from its real situation —
a consumer holding its full prefetch without settling, a copy delivered three times, a
blocked group, a length limit reached, a growing dead-letter queue, copies expiring, a queue
without subscribers, a snapshot held open on the broker's database, a broker process whose
heartbeat stopped, a LISTEN connection killed.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import pytest

from app.storage.dsn import asyncpg_dsn
from tests.api.test_multiprocess import _sql
from tests.support import LiveServer, wait_for
from tests.wsclient import WsClient, declare_queue, make_user, publish

SERVER_SETTINGS = {"ack_timeout_check_interval_ms": 100}
_names = itertools.count()


def fresh(prefix: str = "dq") -> str:
    return f"{prefix}{next(_names)}x{uuid.uuid4().hex[:6]}"


def diagnose(adm: httpx.Client, queue: str) -> dict[str, Any]:
    r = adm.get(f"/queues/{queue}/diagnosis")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def codes(d: dict[str, Any]) -> list[str]:
    return [f["code"] for f in d["findings"]]


def finding(adm: httpx.Client, queue: str, code: str, timeout: float = 8.0) -> dict[str, Any]:
    """Poll the queue's diagnosis until it has a finding ``code``; returns the diagnosis."""

    def found() -> dict[str, Any] | None:
        d = diagnose(adm, queue)
        return d if code in codes(d) else None

    result: dict[str, Any] = wait_for(found, timeout, 0.1, f"finding {code} on {queue}")
    return result


def message_of(d: dict[str, Any], code: str) -> str:
    message: str = next(f["message"] for f in d["findings"] if f["code"] == code)
    return message


def test_a_calm_queue_has_no_findings_and_404_for_none(srv: LiveServer, adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q)
    d = diagnose(adm, q)
    assert d["queue"] == q
    assert d["head"] is None
    assert d["oldest_in_flight"] is None
    assert d["consumers"] == []
    assert d["findings"] == []
    assert adm.get(f"/queues/{fresh()}/diagnosis").status_code == 404


def test_read_permission_is_needed(srv: LiveServer, adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q)
    user = fresh("u")
    make_user(adm, user, read="^$")
    with httpx.Client(base_url=srv.base_url + "/api/v1", auth=(user, "user-password-1")) as c:
        assert c.get(f"/queues/{q}/diagnosis").status_code == 403
        assert c.get("/diagnosis").status_code == 403


def test_consumer_stalled_holder_and_last_ack(srv: LiveServer, adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q, ack_timeout_seconds=4)
    for i in range(3):
        publish(adm, q, i)
    with WsClient.admin(srv.ws_url) as ws:
        ws.subscribe(q, 2)
        first, _second = ws.deliveries_n(2)
        ws.ack(first["delivery_tag"])
        ws.delivery()  # the third fills the prefetch again
        # the ACK reaches the subscriptions table with the next heartbeat (2 s)
        d = wait_for(lambda: (x := diagnose(adm, q))["consumers"][0]["last_ack_at"] and x, 5, 0.1)
        (c,) = d["consumers"]
        assert c["username"] == "admin"
        assert c["prefetch"] == 2
        assert c["unacked"] == 2
        assert c["active"] is True
        assert c["process"] == srv.services.delivery.process_id
        held = d["oldest_in_flight"]
        assert held["holder"] == {
            "connection_id": c["connection_id"],
            "username": "admin",
            "process": c["process"],
            "kind": "websocket",
        }
        assert held["delivery_count"] == 1
        assert "delivery_tag" not in json.dumps(d)
        assert d["head"] is None
        # half the ack timeout (2 s) without a settlement
        d = finding(adm, q, "consumer_stalled")
        assert c["connection_id"] in message_of(d, "consumer_stalled")
        assert d["findings"][0]["severity"] == "warning"


def test_poison_message(srv: LiveServer, adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q)
    publish(adm, q, "bad")
    with WsClient.admin(srv.ws_url) as ws:
        ws.subscribe(q, 1)
        for _ in range(2):
            assert ws.nack(ws.delivery()["delivery_tag"])["outcome"] == "requeued"
        ws.delivery()  # the third delivery, held
        d = finding(adm, q, "poison_message", 3)
        assert d["oldest_in_flight"]["delivery_count"] == 3
        assert f"id {d['oldest_in_flight']['id']} (3 deliveries)" in message_of(d, "poison_message")


def test_blocked_group_and_pull_holder(srv: LiveServer, adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q, arguments={"x-message-groups": True})
    for i in range(3):
        publish(adm, q, i)
    # the copies' group, as a publish with properties.group_id stores it (contract §16)
    _sql(
        srv.database_url,
        "UPDATE messages SET group_id = 'g1' WHERE queue_id = (SELECT id FROM queues"
        " WHERE name = $1)",
        q,
    )
    r = adm.post(f"/queues/{q}/get", json={"max_messages": 1})
    assert r.status_code == 200, r.text
    assert len(r.json()["messages"]) == 1
    d = diagnose(adm, q)
    head = d["head"]
    assert head["blocked_by"] == "group"
    assert head["blocking_group"] == "g1"
    assert head["group_id"] == "g1"
    assert head["status"] == "ready"
    assert "group_blocked" in codes(d)
    assert "'g1'" in message_of(d, "group_blocked")
    holder = d["oldest_in_flight"]["holder"]
    assert holder["kind"] == "pull"
    assert holder["username"] == "admin"
    assert holder["connection_id"] is None


def test_blocked_by_delay_and_credit(srv: LiveServer, adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q)
    publish(adm, q, "later", delay_ms=60_000)
    assert diagnose(adm, q)["head"]["blocked_by"] == "delay"
    assert diagnose(adm, q)["head"]["status"] == "delayed"
    publish(adm, q, "now")
    assert diagnose(adm, q)["head"]["blocked_by"] == "no_subscriber_with_credit"


def test_single_active_consumers_active_and_waiting(srv: LiveServer, adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q, arguments={"x-single-active-consumer": True})
    with WsClient.admin(srv.ws_url) as first, WsClient.admin(srv.ws_url) as second:
        assert first.subscribe(q, 1)["active"] is True
        assert second.subscribe(q, 1)["active"] is False
        consumers = diagnose(adm, q)["consumers"]
        assert [c["active"] for c in consumers] == [True, False]
        assert consumers[0]["since"] <= consumers[1]["since"]


def test_length_limit_reached(srv: LiveServer, adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q, arguments={"x-max-length": 3})
    for i in range(2):
        publish(adm, q, i)
    assert "length_limit_reached" not in codes(diagnose(adm, q))
    for i in range(3):
        publish(adm, q, i)
    d = diagnose(adm, q)
    assert "length_limit_reached" in codes(d)
    assert "x-max-length 3" in message_of(d, "length_limit_reached")


def test_dead_letters_growing_and_expiring(srv: LiveServer, adm: httpx.Client) -> None:
    dlq, q = fresh("dlq"), fresh()
    declare_queue(adm, dlq)
    declare_queue(adm, q, dead_letter_queue=dlq, arguments={"x-message-ttl": 1500})
    for i in range(3):
        publish(adm, q, i)
    d = finding(adm, q, "expiring", 3)  # half of the 1.5 s TTL waited
    assert "time to live" in message_of(d, "expiring")
    d = finding(adm, q, "dead_letters_growing", 5)
    assert message_of(d, "dead_letters_growing").startswith("3 copies of this queue were")
    assert f"'{dlq}'" in message_of(d, "dead_letters_growing")
    d = finding(adm, dlq, "dead_letters_growing", 2)
    assert message_of(d, "dead_letters_growing").startswith("3 dead-lettered copies")


def test_no_consumers_for_30_seconds(srv: LiveServer, adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q)
    publish(adm, q, "waits")
    assert "no_consumers" not in codes(diagnose(adm, q))  # declared just now
    backdate = "UPDATE queues SET created_at = now() - interval '31 seconds' WHERE name = $1"
    _sql(srv.database_url, backdate, q)
    assert "no_consumers" in codes(diagnose(adm, q))
    with WsClient.admin(srv.ws_url) as ws:
        ws.subscribe(q, 1)
        ws.delivery()
        assert "no_consumers" not in codes(diagnose(adm, q))
    # the subscription ended just now: no subscriber for 0 s, not 30
    wait_for(lambda: diagnose(adm, q)["consumers"] == [], 5, 0.05)
    wait_for(lambda: diagnose(adm, q)["head"] is not None, 5, 0.05)
    assert "no_consumers" not in codes(diagnose(adm, q))


# -- the database's side ---------------------------------------------------------------------


@pytest.fixture
def snapshot_holder(srv: LiveServer) -> Iterator[int]:
    """A session on the broker's database holding a REPEATABLE READ snapshot open (idle in
    transaction); yields its backend pid."""
    ready = threading.Event()
    stop = threading.Event()
    pid: list[int] = []

    async def hold() -> None:
        conn = await asyncpg.connect(
            asyncpg_dsn(srv.database_url), server_settings={"application_name": "forgotten"}
        )
        try:
            pid.append(conn.get_server_pid())
            await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            await conn.fetchval("SELECT count(*) FROM queues")
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            await conn.execute("ROLLBACK")
        finally:
            await conn.close()

    thread = threading.Thread(target=lambda: asyncio.run(hold()), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield pid[0]
    finally:
        stop.set()
        thread.join(10)


def database_diagnosis(adm: httpx.Client) -> dict[str, Any]:
    r = adm.get("/diagnosis")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_database_side(srv: LiveServer, adm: httpx.Client, snapshot_holder: int) -> None:
    me = srv.services.delivery.process_id

    def reported() -> dict[str, Any] | None:
        """The diagnosis once this process's heartbeat has reported its pool (every 2 s)."""
        found = database_diagnosis(adm)
        mine = [p for p in found["processes"] if p["id"] == me]
        return found if mine and mine[0]["pool_size"] is not None else None

    d = wait_for(reported, 10, 0.1, "the process's pool use reported")
    assert d["bloat"]["live_tuples"] >= 0
    assert 0 <= d["notify_queue_usage"] < 0.5
    (proc,) = [p for p in d["processes"] if p["id"] == me]
    assert proc["listening"] is True
    assert proc["pool_size"] > 0
    held = [x for x in d["xmin_held"] if x["pid"] == snapshot_holder]
    assert held
    assert held[0]["application_name"] == "forgotten"
    assert held[0]["state"] == "idle in transaction"

    # a broker process whose heartbeat stopped 8 s ago (reaped only after 15 s)
    ghost = str(uuid.uuid4())
    _sql(
        srv.database_url,
        "INSERT INTO broker_processes (id, hostname, pid, heartbeat_at)"
        " VALUES ($1, 'ghost-host', 4242, now() - interval '8 seconds')",
        uuid.UUID(ghost),
    )
    d = database_diagnosis(adm)
    stale = [f for f in d["findings"] if f["code"] == "process_stale"]
    assert len(stale) == 1
    assert ghost in stale[0]["message"]
    assert "4242" in stale[0]["message"]
    assert stale[0]["severity"] == "warning"
    assert not any(ghost in f["message"] for f in d["findings"] if f["code"] == "listen_down")
    _sql(srv.database_url, "DELETE FROM broker_processes WHERE id = $1", uuid.UUID(ghost))

    # LISTEN down: its backend killed; seen until the process reconnects and reports it
    def listen_down() -> bool:
        pid = srv.services.delivery.cluster.listener.backend_pid
        if pid is None:
            return False
        _sql(srv.database_url, "SELECT pg_terminate_backend($1)", pid)
        for _ in range(20):
            found = database_diagnosis(adm)
            if any(f["code"] == "listen_down" and me in f["message"] for f in found["findings"]):
                return True
        return False

    wait_for(listen_down, 15, 0.5, "listen_down")
    wait_for(
        lambda: not any(f["code"] == "listen_down" for f in database_diagnosis(adm)["findings"]),
        10,
        0.2,
        "the LISTEN connection back",
    )

    # the snapshot, once 10 s old, is a finding naming its pid and age
    def xmin_finding() -> dict[str, Any] | None:
        found = database_diagnosis(adm)
        return next(
            (
                f
                for f in found["findings"]
                if f["code"] == "xmin_held" and f"pid {snapshot_holder}" in f["message"]
            ),
            None,
        )

    f = wait_for(xmin_finding, 15, 0.5, "xmin_held")
    assert f["severity"] == "info"
    assert "forgotten" in f["message"]
    assert "pg_terminate_backend" in f["message"]
