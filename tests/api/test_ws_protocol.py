"""WebSocket protocol (contract §8, §12) through a real server and a real client.

Most tests share one server per module (each with its own queue names, so they cannot see
each other's messages); tests that need other settings start their own.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import time
import uuid
from collections import Counter
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from tests.support import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    LiveServer,
    PgCluster,
    client,
    login,
    running_server,
    wait_for,
)
from tests.support import test_settings as settings_for
from tests.wsclient import (
    WsClient,
    _masked,
    basic,
    bearer,
    bind,
    browse,
    declare_queue,
    make_user,
    publish,
    refused_status,
    stats,
)

_names = itertools.count()


@pytest.fixture
def url(srv: LiveServer) -> str:
    return srv.ws_url


@pytest.fixture
def q(adm: httpx.Client, request: pytest.FixtureRequest) -> str:
    """A fresh queue of this test's own, bound to amq.direct with its name as key."""
    name = re.sub(r"[^A-Za-z0-9_.:-]", "_", request.node.name)[:200] + f".{next(_names)}"
    declare_queue(adm, name)
    bind(adm, "amq.direct", name, name)
    return name


def fresh(prefix: str = "n") -> str:
    return f"{prefix}{next(_names)}x{uuid.uuid4().hex[:6]}"


# -- authentication ---------------------------------------------------------------------


def test_header_basic_auth_sends_connected(url: str) -> None:
    with WsClient.open(url, basic()) as ws:
        frame = ws.recv_json()
        assert frame["type"] == "CONNECTED"
        assert uuid.UUID(frame["connection_id"])
        assert frame["user"] == {"username": ADMIN_USER, "role": "admin"}
        assert "id" not in frame


def test_header_bearer_auth_sends_connected(srv: LiveServer) -> None:
    token = login(srv.base_url, ADMIN_USER, ADMIN_PASSWORD)
    with WsClient.open(srv.ws_url, bearer(token)) as ws:
        assert ws.expect("CONNECTED")["user"]["username"] == ADMIN_USER


def test_each_connection_has_its_own_id(url: str) -> None:
    with WsClient.admin(url) as a, WsClient.admin(url) as b:
        assert a.connected
        assert b.connected
        assert a.connected["connection_id"] != b.connected["connection_id"]


def test_auth_frame_with_token_carries_its_id(srv: LiveServer) -> None:
    token = login(srv.base_url, ADMIN_USER, ADMIN_PASSWORD)
    with WsClient.open(srv.ws_url) as ws:
        ws.send_json({"type": "AUTH", "token": token, "id": 7})
        frame = ws.recv_json()
        assert frame["type"] == "CONNECTED"
        assert frame["id"] == 7
        assert frame["user"] == {"username": ADMIN_USER, "role": "admin"}
        assert uuid.UUID(frame["connection_id"])


def test_auth_frame_with_username_and_password(url: str, adm: httpx.Client) -> None:
    name = fresh("u")
    make_user(adm, name, "pw-of-the-user")
    with WsClient.open(url) as ws:
        ws.send_json({"type": "AUTH", "username": name, "password": "pw-of-the-user", "id": "a-1"})
        frame = ws.recv_json()
        assert frame["type"] == "CONNECTED"
        assert frame["id"] == "a-1"
        assert frame["user"] == {"username": name, "role": "user"}
    with WsClient.open(url) as ws:
        ws.send_json({"type": "AUTH", "username": name, "password": "pw-of-the-user"})
        frame = ws.recv_json()
        assert frame["type"] == "CONNECTED"
        assert "id" not in frame


def test_bad_header_credentials_are_refused_before_the_upgrade(url: str) -> None:
    assert refused_status(url, basic(ADMIN_USER, "wrong-password")) == 401
    assert refused_status(url, basic("nobody-" + fresh(), "x")) == 401
    assert refused_status(url, bearer("not-a-real-token-" + "x" * 40)) == 401
    assert refused_status(url, {"Authorization": "Digest abc"}) == 401


@pytest.mark.parametrize(
    "auth",
    [
        {"username": ADMIN_USER, "password": "wrong-password"},
        {"token": "not-a-real-token-" + "y" * 40},
        {"username": ADMIN_USER},
        {"password": ADMIN_PASSWORD},
        {},
    ],
    ids=["bad-password", "bad-token", "no-password", "no-username", "nothing"],
)
def test_auth_frame_with_bad_credentials_closes_4401(url: str, auth: dict[str, Any]) -> None:
    with WsClient.open(url) as ws:
        ws.send_json({"type": "AUTH", "id": 1, **auth})
        code, frames = ws.expect_close()
        assert code == 4401
        assert all(f["type"] == "ERROR" for f in frames), frames


def test_auth_frame_with_token_and_username_closes_4401(srv: LiveServer) -> None:
    token = login(srv.base_url, ADMIN_USER, ADMIN_PASSWORD)
    with WsClient.open(srv.ws_url) as ws:
        ws.send_json(
            {"type": "AUTH", "token": token, "username": ADMIN_USER, "password": ADMIN_PASSWORD}
        )
        code, frames = ws.expect_close()
        assert code == 4401
        assert not any(f["type"] == "CONNECTED" for f in frames)


def test_no_auth_within_ten_seconds_closes_4401(url: str) -> None:
    """The one slow test: the deadline is 10 s and PINGs do not extend it."""
    with WsClient.open(url) as ws:
        started = time.monotonic()
        ws.send_json({"type": "PING", "id": "p"})
        assert ws.recv_json() == {"type": "PONG", "id": "p"}
        code, frames = ws.expect_close(timeout=14)
        elapsed = time.monotonic() - started
        assert code == 4401
        assert all(f["type"] == "ERROR" for f in frames), frames
        assert 9.0 <= elapsed <= 13.0, elapsed


def test_rate_limited_upgrade_is_429_and_rate_limited_auth_frame_closes_4429(
    srv: LiveServer, adm: httpx.Client
) -> None:
    name = fresh("u")
    make_user(adm, name, "pw-of-the-user")
    for _ in range(10):
        r = httpx.post(
            f"{srv.base_url}/api/v1/auth/login", json={"username": name, "password": "wrong"}
        )
        assert r.status_code == 401
    # now even the right password is refused, for this username only
    assert refused_status(srv.ws_url, basic(name, "pw-of-the-user")) == 429
    with WsClient.open(srv.ws_url) as ws:
        ws.send_json({"type": "AUTH", "username": name, "password": "pw-of-the-user", "id": 1})
        code, frames = ws.expect_close()
        assert code == 4429
        assert all(f["type"] == "ERROR" and f["code"] == "rate_limited" for f in frames), frames
    with WsClient.admin(srv.ws_url) as ws:
        assert ws.request({"type": "PING"})["type"] == "PONG"


def test_frames_before_auth_are_unauthorized_and_do_nothing(
    url: str, adm: httpx.Client, q: str
) -> None:
    publish(adm, q, "waiting")
    with WsClient.open(url) as ws:
        ws.send_json({"type": "SUBSCRIBE", "queue": q, "id": "s"})
        ws.send_json({"type": "PUBLISH", "queue": q, "body": "sneaky", "id": "p"})
        ws.send_json({"type": "ACK", "delivery_tag": "1." + "0" * 32, "id": "a"})
        ws.send_json({"type": "UNSUBSCRIBE", "queue": q})
        replies = [ws.recv_json() for _ in range(4)]
        for reply, frame_id in zip(replies, ["s", "p", "a", None], strict=True):
            assert reply["type"] == "ERROR", reply
            assert reply["code"] == "unauthorized", reply
            assert reply.get("id") == frame_id
        assert stats(adm, q)["ready"] == 1  # the PUBLISH stored nothing
        # Still waiting for AUTH: it works now, and the SUBSCRIBE above did not take effect.
        ws.send_json({"type": "AUTH", "username": ADMIN_USER, "password": ADMIN_PASSWORD})
        assert ws.recv_json()["type"] == "CONNECTED"
        assert ws.quiet(0.4) == []
        assert stats(adm, q)["consumers"] == 0


def test_ping_pong_before_and_after_auth(url: str) -> None:
    with WsClient.open(url) as ws:
        ws.send_json({"type": "PING"})
        assert ws.recv_json() == {"type": "PONG"}
        ws.send_json({"type": "PING", "id": 1})
        assert ws.recv_json() == {"type": "PONG", "id": 1}
        ws.send_json({"type": "AUTH", "username": ADMIN_USER, "password": ADMIN_PASSWORD})
        assert ws.recv_json()["type"] == "CONNECTED"
        ws.send_json({"type": "PING"})
        assert ws.recv_json() == {"type": "PONG"}
        ws.send_json({"type": "PING", "id": "x" * 64})
        assert ws.recv_json() == {"type": "PONG", "id": "x" * 64}


def test_second_auth_is_bad_frame_and_keeps_the_connection(url: str) -> None:
    with WsClient.admin(url) as ws:
        reply = ws.request({"type": "AUTH", "username": ADMIN_USER, "password": ADMIN_PASSWORD})
        assert reply["type"] == "ERROR"
        assert reply["code"] == "bad_frame"
        assert ws.request({"type": "PING"})["type"] == "PONG"


# -- SUBSCRIBE / UNSUBSCRIBE ------------------------------------------------------------


def test_subscribed_comes_before_any_delivery(url: str, adm: httpx.Client, q: str) -> None:
    for i in range(5):
        publish(adm, q, i)
    with WsClient.admin(url) as ws:
        ws.send_json({"type": "SUBSCRIBE", "queue": q, "prefetch": 5, "id": 42})
        first = ws.recv_json()
        assert first == {"type": "SUBSCRIBED", "queue": q, "prefetch": 5, "active": True, "id": 42}
        bodies = [ws.recv_json()["body"] for _ in range(5)]
        assert bodies == [0, 1, 2, 3, 4]


def test_subscribed_is_sent_without_id_and_prefetch_defaults_to_one(
    url: str, adm: httpx.Client, q: str
) -> None:
    publish(adm, q, "a")
    publish(adm, q, "b")
    with WsClient.admin(url) as ws:
        ws.send_json({"type": "SUBSCRIBE", "queue": q})
        assert ws.recv_json() == {"type": "SUBSCRIBED", "queue": q, "prefetch": 1, "active": True}
        assert ws.recv_json()["body"] == "a"
        assert ws.quiet(0.3) == []  # prefetch 1: the second waits for the ack


@pytest.mark.parametrize("prefetch", [0, -1, 1001, "5", 1.5, None, True])
def test_prefetch_out_of_range_is_bad_frame(url: str, q: str, prefetch: Any) -> None:
    with WsClient.admin(url) as ws:
        reply = ws.request({"type": "SUBSCRIBE", "queue": q, "prefetch": prefetch})
        assert reply["type"] == "ERROR"
        assert reply["code"] == "bad_frame"
        # nothing was subscribed: a valid SUBSCRIBE now works
        assert ws.subscribe(q, 1)["prefetch"] == 1


def test_prefetch_bounds_are_accepted(url: str, adm: httpx.Client, q: str) -> None:
    other = fresh("q")
    declare_queue(adm, other)
    with WsClient.admin(url) as ws:
        assert ws.subscribe(q, 1000)["prefetch"] == 1000
        assert ws.subscribe(other, 1)["prefetch"] == 1


def test_second_subscribe_is_already_subscribed(url: str, adm: httpx.Client, q: str) -> None:
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 3)
        reply = ws.request({"type": "SUBSCRIBE", "queue": q, "prefetch": 1})
        assert reply["type"] == "ERROR"
        assert reply["code"] == "already_subscribed"
        # the first subscription is intact, with its prefetch
        for i in range(3):
            publish(adm, q, i)
        assert len(ws.deliveries_n(3)) == 3
    with WsClient.admin(url) as other:
        other.subscribe(q)  # another connection may subscribe to the same queue


def test_subscribe_to_a_missing_queue_is_not_found(url: str) -> None:
    with WsClient.admin(url) as ws:
        reply = ws.request({"type": "SUBSCRIBE", "queue": fresh("missing")})
        assert reply["type"] == "ERROR"
        assert reply["code"] == "not_found"


def test_subscribe_without_read_permission_is_forbidden(
    url: str, adm: httpx.Client, q: str
) -> None:
    name = fresh("u")
    make_user(adm, name, "pw-of-the-user", configure=".*", write=".*", read="only-this")
    with WsClient.as_user(url, name, "pw-of-the-user") as ws:
        reply = ws.request({"type": "SUBSCRIBE", "queue": q})
        assert reply["type"] == "ERROR"
        assert reply["code"] == "forbidden"
        assert stats(adm, q)["consumers"] == 0


def test_unsubscribe_stops_deliveries_and_keeps_unsettled_ones(
    url: str, adm: httpx.Client, q: str
) -> None:
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 10)
        publish(adm, q, "first")
        held = ws.delivery()
        reply = ws.request({"type": "UNSUBSCRIBE", "queue": q})
        assert reply["type"] == "UNSUBSCRIBED"
        assert reply["queue"] == q
        publish(adm, q, "second")
        publish(adm, q, "third")
        assert ws.quiet(0.5) == []
        assert not ws.deliveries
        # the unsettled delivery is still owned by this connection
        assert ws.ack(held["delivery_tag"])["type"] == "ACKED"
        assert stats(adm, q)["ready"] == 2


def test_unsubscribed_is_sent_without_id(url: str, q: str) -> None:
    with WsClient.admin(url) as ws:
        ws.subscribe(q)
        ws.send_json({"type": "UNSUBSCRIBE", "queue": q})
        assert ws.recv_json() == {"type": "UNSUBSCRIBED", "queue": q}


def test_unsubscribe_when_not_subscribed(url: str, q: str) -> None:
    with WsClient.admin(url) as ws:
        reply = ws.request({"type": "UNSUBSCRIBE", "queue": q})
        assert reply["type"] == "ERROR"
        assert reply["code"] == "not_subscribed"
        ws.subscribe(q)
        assert ws.request({"type": "UNSUBSCRIBE", "queue": q})["type"] == "UNSUBSCRIBED"
        assert ws.request({"type": "UNSUBSCRIBE", "queue": q})["code"] == "not_subscribed"
        # and subscribing again works after an unsubscribe
        assert ws.subscribe(q)["type"] == "SUBSCRIBED"


# -- ACK / NACK -------------------------------------------------------------------------


def test_ack_with_id_is_acked_and_deletes_the_message(url: str, adm: httpx.Client, q: str) -> None:
    publish(adm, q, {"n": 1})
    with WsClient.admin(url) as ws:
        ws.subscribe(q)
        d = ws.delivery()
        assert d["body"] == {"n": 1}
        reply = ws.ack(d["delivery_tag"])
        assert reply == {"type": "ACKED", "delivery_tag": d["delivery_tag"], "id": reply["id"]}
        assert browse(adm, q) == []


def test_ack_without_id_gets_no_reply(url: str, adm: httpx.Client, q: str) -> None:
    publish(adm, q, 1)
    with WsClient.admin(url) as ws:
        ws.subscribe(q)
        d = ws.delivery()
        ws.send_json({"type": "ACK", "delivery_tag": d["delivery_tag"]})
        wait_for(lambda: browse(adm, q) == [], 3, message="the ack to delete the message")
        assert ws.quiet(0.3) == []


def _error(reply: dict[str, Any], code: str) -> dict[str, Any]:
    assert reply["type"] == "ERROR", reply
    assert reply["code"] == code, reply
    return reply


def test_double_ack_is_unknown_delivery_tag(url: str, adm: httpx.Client, q: str) -> None:
    publish(adm, q, 1)
    publish(adm, q, 2)
    with WsClient.admin(url) as ws:
        ws.subscribe(q)
        d = ws.delivery()
        assert ws.ack(d["delivery_tag"])["type"] == "ACKED"
        second = ws.deliveries_n(1)[0]
        err = _error(ws.ack(d["delivery_tag"]), "unknown_delivery_tag")
        assert err["delivery_tag"] == d["delivery_tag"]
        # without id: still an ERROR carrying the tag
        ws.send_json({"type": "ACK", "delivery_tag": d["delivery_tag"]})
        err = ws.expect("ERROR")
        assert err["code"] == "unknown_delivery_tag"
        assert err["delivery_tag"] == d["delivery_tag"]
        assert "id" not in err
        # nothing changed: the second delivery is still in flight and ackable
        assert [m["status"] for m in browse(adm, q)] == ["in_flight"]
        assert ws.ack(second["delivery_tag"])["type"] == "ACKED"


def test_another_connections_tag_is_unknown(url: str, adm: httpx.Client, q: str) -> None:
    publish(adm, q, "mine")
    with WsClient.admin(url) as owner, WsClient.admin(url) as thief:
        owner.subscribe(q)
        d = owner.delivery()
        err = _error(thief.ack(d["delivery_tag"]), "unknown_delivery_tag")
        assert err["delivery_tag"] == d["delivery_tag"]
        err = _error(thief.nack(d["delivery_tag"], requeue=False), "unknown_delivery_tag")
        assert err["delivery_tag"] == d["delivery_tag"]
        assert [m["status"] for m in browse(adm, q)] == ["in_flight"]
        assert owner.ack(d["delivery_tag"])["type"] == "ACKED"


@pytest.mark.parametrize(
    "tag",
    [
        "garbage",
        "1",
        "1.",
        "1." + "0" * 32,
        "99999999999999999999." + "a" * 32,
        "9999999999999999999." + "a" * 32,  # 19 digits, beyond bigint
        "9223372036854775808." + "a" * 32,  # 2**63
        "1." + "\x00" * 32,
        "1." + "A" * 32,
        "\u0661." + "a" * 32,  # ARABIC-INDIC DIGIT ONE: a digit, but not ASCII
        "-1." + "a" * 32,
        "x" * 128,
        "ünïcødé",
    ],
)
def test_garbage_tag_is_unknown_delivery_tag(url: str, adm: httpx.Client, q: str, tag: str) -> None:
    publish(adm, q, 1)
    with WsClient.admin(url) as ws:
        ws.subscribe(q)
        d = ws.delivery()
        for frame_type in ("ACK", "NACK"):
            err = _error(
                ws.request({"type": frame_type, "delivery_tag": tag}), "unknown_delivery_tag"
            )
            assert err["delivery_tag"] == tag
        # a real tag with its random part altered
        forged = d["delivery_tag"][:-1] + ("0" if d["delivery_tag"][-1] != "0" else "1")
        _error(ws.ack(forged), "unknown_delivery_tag")
        assert ws.ack(d["delivery_tag"])["type"] == "ACKED"


def test_a_malformed_tag_never_spoils_the_other_acks_of_its_batch(
    url: str, adm: httpx.Client, q: str
) -> None:
    """ACKs that arrive together are settled in one statement: a tag that made that statement
    fail would fail everyone's ACKs (no reply, nothing deleted)."""
    for i in range(3):
        publish(adm, q, i)
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 3)
        tags = [d["delivery_tag"] for d in ws.deliveries_n(3)]
        bad = ["9999999999999999999." + "a" * 32, "1." + "\x00" * 32]
        ws.burst([{"type": "ACK", "delivery_tag": t, "id": t} for t in [*bad, *tags]])
        replies = {f["id"]: f for f in ws.quiet(1.0)}
        assert set(replies) == {*bad, *tags}
        for t in bad:
            assert replies[t]["code"] == "unknown_delivery_tag"
        for t in tags:
            assert replies[t]["type"] == "ACKED", replies[t]
    assert browse(adm, q) == []


def test_empty_or_non_string_tag_is_bad_frame(url: str) -> None:
    with WsClient.admin(url) as ws:
        for tag in ("", 5, None, ["a"]):
            _error(ws.request({"type": "ACK", "delivery_tag": tag}), "bad_frame")
        _error(ws.request({"type": "ACK"}), "bad_frame")
        _error(ws.request({"type": "NACK", "delivery_tag": "1.x", "requeue": "yes"}), "bad_frame")


# -- ACK of several tags in one frame (a MessageX addition, docs/decisions.md) ------------


def test_ack_of_several_tags_settles_each_and_frees_their_slots(
    url: str, adm: httpx.Client, q: str
) -> None:
    for i in range(6):
        publish(adm, q, i)
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 3)
        first = ws.deliveries_n(3)
        assert ws.quiet(0.3) == []
        tags = [d["delivery_tag"] for d in first]
        reply = ws.request({"type": "ACK", "delivery_tags": tags})
        assert reply == {"type": "ACKED", "delivery_tags": tags, "id": reply["id"]}
        nxt = ws.deliveries_n(3)  # three slots back
        assert [d["body"] for d in nxt] == [3, 4, 5]
        assert [m["body"] for m in browse(adm, q)] == [3, 4, 5]
        # without id: no reply
        ws.send_json({"type": "ACK", "delivery_tags": [d["delivery_tag"] for d in nxt]})
        wait_for(lambda: browse(adm, q) == [], 3, message="the acks to delete the messages")
        assert ws.quiet(0.3) == []


def test_a_stale_tag_acked_with_the_live_one_is_the_unknown_one(
    url: str, adm: httpx.Client, q: str
) -> None:
    """Two tags of one message (the tag of an earlier delivery, and the live one) in one
    batched statement: the reply names the stale one, whichever comes first."""
    publish(adm, q, "only")
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 1)
        stale = ws.delivery()["delivery_tag"]
        assert ws.nack(stale)["outcome"] == "requeued"
        live = ws.delivery()["delivery_tag"]
        err = _error(
            ws.request({"type": "ACK", "delivery_tags": [stale, live]}), "unknown_delivery_tag"
        )
        assert err["delivery_tags"] == [stale]
        assert browse(adm, q) == []


def test_ack_of_several_tags_names_only_the_unknown_ones(
    url: str, adm: httpx.Client, q: str
) -> None:
    """Each tag settles as if acked alone: unknown ones change nothing and the others are
    acknowledged; one ERROR names the unknown ones (with or without id)."""
    for i in range(3):
        publish(adm, q, i)
    with WsClient.admin(url) as owner, WsClient.admin(url) as other:
        owner.subscribe(q, 2)
        a, b = owner.deliveries_n(2)
        other.subscribe(q, 1)
        c = other.delivery()
        assert owner.ack(a["delivery_tag"])["type"] == "ACKED"
        bogus = "garbage"
        tags = [a["delivery_tag"], b["delivery_tag"], c["delivery_tag"], bogus]
        err = _error(owner.request({"type": "ACK", "delivery_tags": tags}), "unknown_delivery_tag")
        # acked before, another connection's, not a tag at all
        assert err["delivery_tags"] == [a["delivery_tag"], c["delivery_tag"], bogus]
        assert "delivery_tag" not in err
        assert [m["body"] for m in browse(adm, q)] == [2]  # b acked, c still in flight
        owner.send_json({"type": "ACK", "delivery_tags": [bogus]})
        err = owner.expect("ERROR")
        assert (err["code"], err["delivery_tags"], "id" in err) == (
            "unknown_delivery_tag",
            [bogus],
            False,
        )
        assert other.ack(c["delivery_tag"])["type"] == "ACKED"
    assert browse(adm, q) == []


def test_a_burst_of_ack_frames_is_answered_frame_by_frame(
    url: str, adm: httpx.Client, q: str
) -> None:
    """ACK frames read together settle together (api/ws/connection.py, _flush_acks), and
    each is still answered as if it had come alone, in order with the frames around it."""
    for i in range(5):
        publish(adm, q, i)
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 4)
        d = [x["delivery_tag"] for x in ws.deliveries_n(4)]
        ws.burst(
            [
                {"type": "ACK", "delivery_tag": d[0], "id": "a"},
                {"type": "ACK", "delivery_tag": d[0], "id": "twice"},
                {"type": "ACK", "delivery_tag": "9.nope", "id": "bogus"},
                {"type": "ACK", "delivery_tag": d[1]},
                {"type": "ACK", "delivery_tags": [d[2], d[2], "junk"], "id": "many"},
                {"type": "PING", "id": "p"},
                {"type": "ACK", "delivery_tag": d[3], "id": "last"},
            ]
        )
        by_id: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + 5
        while len(by_id) < 6:  # ws.expect takes one type at a time; these come in any order
            frame = ws.recv_json(deadline - time.monotonic())
            if frame["type"] == "MESSAGE_DELIVERED":
                ws.deliveries.append(frame)
            else:
                by_id[frame["id"]] = frame
        assert {k: f["type"] for k, f in by_id.items()} == {
            "a": "ACKED",
            "twice": "ERROR",
            "bogus": "ERROR",
            "many": "ERROR",
            "p": "PONG",
            "last": "ACKED",
        }
        assert by_id["a"]["delivery_tag"] == d[0]
        assert by_id["last"]["delivery_tag"] == d[3]
        assert (by_id["twice"]["code"], by_id["twice"]["delivery_tag"]) == (
            "unknown_delivery_tag",
            d[0],
        )
        assert by_id["bogus"]["delivery_tag"] == "9.nope"
        assert (by_id["many"]["code"], by_id["many"]["delivery_tags"]) == (
            "unknown_delivery_tag",
            [d[2], "junk"],
        )
        assert ws.delivery()["body"] == 4  # every slot came back
        assert ws.quiet(0.3) == []
        assert [m["body"] for m in browse(adm, q)] == [4]


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "ACK", "delivery_tags": []},
        {"type": "ACK", "delivery_tags": ["t"] * 1001},
        {"type": "ACK", "delivery_tags": ["ok", ""]},
        {"type": "ACK", "delivery_tags": ["ok", 5]},
        {"type": "ACK", "delivery_tags": "not-a-list"},
        {"type": "ACK", "delivery_tags": None},
        {"type": "ACK", "delivery_tag": "x", "delivery_tags": ["x"]},
        {"type": "ACK", "delivery_tags": ["x" * 129]},
    ],
    ids=["empty", "1001", "empty-tag", "number", "string", "null", "both", "long"],
)
def test_malformed_multi_tag_ack_is_bad_frame_and_changes_nothing(
    url: str, adm: httpx.Client, q: str, frame: dict[str, Any]
) -> None:
    publish(adm, q, 1)
    with WsClient.admin(url) as ws:
        ws.subscribe(q)
        d = ws.delivery()
        if frame.get("delivery_tags") == ["x"]:
            frame = {
                **frame,
                "delivery_tag": d["delivery_tag"],
                "delivery_tags": [d["delivery_tag"]],
            }
        _error(ws.request(frame), "bad_frame")
        assert [m["status"] for m in browse(adm, q)] == ["in_flight"]
        assert ws.request({"type": "ACK", "delivery_tags": [d["delivery_tag"]] * 1})["type"] == (
            "ACKED"
        )


def test_ack_of_a_thousand_tags_is_accepted(url: str) -> None:
    with WsClient.admin(url) as ws:
        tags = [f"{i}.{'a' * 32}" for i in range(1, 1001)]
        err = _error(ws.request({"type": "ACK", "delivery_tags": tags}), "unknown_delivery_tag")
        assert err["delivery_tags"] == tags


def test_nack_requeue_redelivers(url: str, adm: httpx.Client, q: str) -> None:
    publish(adm, q, "again")
    with WsClient.admin(url) as ws:
        ws.subscribe(q)
        d1 = ws.delivery()
        assert d1["redelivered"] is False
        assert d1["delivery_count"] == 1
        reply = ws.nack(d1["delivery_tag"])
        assert reply["type"] == "NACKED"
        assert reply["delivery_tag"] == d1["delivery_tag"]
        assert reply["outcome"] == "requeued"
        d2 = ws.delivery()
        assert d2["message_id"] == d1["message_id"]
        assert d2["delivery_tag"] != d1["delivery_tag"]
        assert d2["redelivered"] is True
        assert d2["delivery_count"] == 2
        # requeue defaults to true
        reply = ws.request({"type": "NACK", "delivery_tag": d2["delivery_tag"]})
        assert reply["outcome"] == "requeued"
        assert ws.delivery()["delivery_count"] == 3


def test_nack_without_id_gets_no_reply(url: str, adm: httpx.Client, q: str) -> None:
    publish(adm, q, 1)
    with WsClient.admin(url) as ws:
        ws.subscribe(q)
        d = ws.delivery()
        ws.send_json({"type": "NACK", "delivery_tag": d["delivery_tag"], "requeue": False})
        wait_for(lambda: browse(adm, q) == [], 3, message="the nack to discard the message")
        assert ws.quiet(0.3) == []


def test_nack_outcomes(url: str, adm: httpx.Client) -> None:
    dlq = fresh("dlq")
    declare_queue(adm, dlq)
    with_dlq = fresh("q")
    declare_queue(adm, with_dlq, dead_letter_queue=dlq, max_delivery_count=1)
    plain = fresh("q")
    declare_queue(adm, plain, max_delivery_count=1)
    unlimited = fresh("q")
    declare_queue(adm, unlimited)
    cases = [
        (unlimited, False, "discarded"),
        (plain, False, "discarded"),
        (with_dlq, False, "dead_lettered"),
        (plain, True, "dead"),
        (with_dlq, True, "dead_lettered"),
        (unlimited, True, "requeued"),
    ]
    with WsClient.admin(url) as ws:
        for queue in (unlimited, plain, with_dlq):
            ws.subscribe(queue)
        for queue, requeue, outcome in cases:
            publish(adm, queue, f"{queue}-{requeue}")
            d = ws.delivery()
            assert d["queue"] == queue
            reply = ws.nack(d["delivery_tag"], requeue=requeue)
            assert reply["type"] == "NACKED", reply
            assert reply["outcome"] == outcome, (queue, requeue, reply)
            if outcome == "requeued":
                assert ws.ack(ws.delivery()["delivery_tag"])["type"] == "ACKED"
    assert [m["status"] for m in browse(adm, plain)] == ["dead"]
    assert sorted(m["body"] for m in browse(adm, dlq)) == [f"{with_dlq}-False", f"{with_dlq}-True"]
    reasons = {m["body"]: m["headers"]["x-death"][0]["reason"] for m in browse(adm, dlq)}
    assert reasons == {f"{with_dlq}-False": "rejected", f"{with_dlq}-True": "delivery_limit"}
    assert browse(adm, unlimited) == []


# -- PUBLISH ----------------------------------------------------------------------------


def test_publish_to_an_exchange(url: str, adm: httpx.Client, q: str) -> None:
    with WsClient.admin(url) as ws:
        ws.subscribe(q)
        reply = ws.request(
            {
                "type": "PUBLISH",
                "exchange": "amq.direct",
                "routing_key": q,
                "body": {"hello": [1, 2.5, None, "x"]},
                "headers": {"h": 1},
                "properties": {"correlation_id": "c-1", "content_type": "application/json"},
            }
        )
        assert reply["type"] == "PUBLISHED"
        assert reply["routed"] is True
        assert reply["queues"] == [q]
        assert uuid.UUID(reply["message_id"])
        d = ws.delivery()
        assert d["type"] == "MESSAGE_DELIVERED"
        assert d["queue"] == q
        assert d["exchange"] == "amq.direct"
        assert d["routing_key"] == q
        assert d["body"] == {"hello": [1, 2.5, None, "x"]}
        assert d["headers"] == {"h": 1}
        # properties as published (the broker may add the message_id it made)
        assert d["properties"] | {"message_id": d["message_id"]} == {
            "correlation_id": "c-1",
            "content_type": "application/json",
            "message_id": d["message_id"],
        }
        assert d["message_id"] == reply["message_id"]
        assert d["delivery_count"] == 1
        assert d["redelivered"] is False
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", d["created_at"])
        expected = {
            "type",
            "queue",
            "exchange",
            "routing_key",
            "body",
            "headers",
            "properties",
            "message_id",
            "delivery_tag",
            "delivery_count",
            "redelivered",
            "created_at",
        }
        assert set(d) == expected


def test_publish_to_a_queue_without_id_still_confirms(url: str, adm: httpx.Client, q: str) -> None:
    with WsClient.admin(url) as ws:
        ws.send_json(
            {
                "type": "PUBLISH",
                "queue": q,
                "body_base64": base64.b64encode(b"\x00\xff").decode(),
                "properties": {"message_id": "my-id-1"},
            }
        )
        reply = ws.expect("PUBLISHED")
        assert reply == {
            "type": "PUBLISHED",
            "routed": True,
            "queues": [q],
            "message_id": "my-id-1",
            "rejected": [],
            "duplicates": [],
        }
        ws.subscribe(q)
        d = ws.delivery()
        assert d["exchange"] == ""
        assert d["routing_key"] == q
        assert d["body_base64"] == "AP8="
        assert "body" not in d
        assert d["message_id"] == "my-id-1"


def test_publish_null_body_and_unrouted(url: str, adm: httpx.Client, q: str) -> None:
    with WsClient.admin(url) as ws:
        reply = ws.request({"type": "PUBLISH", "queue": q, "body": None})
        assert reply["type"] == "PUBLISHED"
        reply = ws.request(
            {"type": "PUBLISH", "exchange": "amq.direct", "routing_key": fresh("nobody"), "body": 1}
        )
        assert reply["type"] == "PUBLISHED"
        assert reply["routed"] is False
        assert reply["queues"] == []
        assert uuid.UUID(reply["message_id"])
        ws.subscribe(q)
        d = ws.delivery()
        assert "body" in d
        assert d["body"] is None


def test_publish_keeps_big_integers_exact(url: str, adm: httpx.Client, q: str) -> None:
    big = 2**70 + 1
    with WsClient.admin(url) as ws:
        ws.send_raw(
            f'{{"type": "PUBLISH", "queue": "{q}", "id": 1, "body": {{"n": {big}, "f": 1.5}},'
            f' "headers": {{"h": {-big}}}}}'
        )
        assert ws.recv_json()["type"] == "PUBLISHED"
        ws.subscribe(q)
        d = ws.delivery()
        assert d["body"] == {"n": big, "f": 1.5}
        assert d["headers"] == {"h": -big}
    [stored] = browse(adm, q)
    assert stored["body"]["n"] == big


def test_publish_errors(url: str, adm: httpx.Client, q: str) -> None:
    nowhere = fresh("nowhere")
    with WsClient.admin(url) as ws:
        _error(ws.request({"type": "PUBLISH", "exchange": nowhere, "body": 1}), "not_found")
        _error(ws.request({"type": "PUBLISH", "queue": nowhere, "body": 1}), "not_found")
        err = _error(
            ws.request(
                {
                    "type": "PUBLISH",
                    "exchange": "amq.direct",
                    "routing_key": nowhere,
                    "mandatory": True,
                    "body": 1,
                }
            ),
            "unroutable",
        )
        assert "id" in err
        bad: list[dict[str, Any]] = [
            {"queue": q, "body": 1, "body_base64": "AA=="},
            {"queue": q},
            {"exchange": "amq.direct", "queue": q, "body": 1},
            {"body": 1},
            {"queue": q, "body_base64": "not base64!"},
            {"queue": q, "body": 1, "delay_ms": -1},
            {"queue": q, "body": 1, "delay_ms": 1.5},
            {"queue": q, "body": 1, "unknown_field": 1},
            {"queue": "bad name!", "body": 1},
        ]
        for frame in bad:
            _error(ws.request({"type": "PUBLISH", **frame}), "bad_frame")
        assert ws.request({"type": "PING"})["type"] == "PONG"
    assert browse(adm, q) == []


def test_publish_without_write_permission_is_forbidden(url: str, adm: httpx.Client, q: str) -> None:
    name = fresh("u")
    make_user(adm, name, "pw-of-the-user", read=".*", write="")
    with WsClient.as_user(url, name, "pw-of-the-user") as ws:
        _error(ws.request({"type": "PUBLISH", "queue": q, "body": 1}), "forbidden")
        _error(ws.request({"type": "PUBLISH", "exchange": "amq.direct", "body": 1}), "forbidden")
    assert browse(adm, q) == []


def test_publish_over_the_size_limit_is_message_too_large(
    pg_cluster: PgCluster, template_db: str
) -> None:
    name = pg_cluster.create_database(template_db)
    try:
        settings = settings_for(pg_cluster.url_for(name), max_message_bytes=1024)
        with (
            running_server(settings) as live,
            client(live.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as adm,
        ):
            declare_queue(adm, "big")
            with WsClient.admin(live.ws_url) as ws:
                # the body's bytes after JSON serialization: a 1022-char string is 1024 bytes
                ok = ws.request({"type": "PUBLISH", "queue": "big", "body": "x" * 1022})
                assert ok["type"] == "PUBLISHED"
                err = _error(
                    ws.request({"type": "PUBLISH", "queue": "big", "body": "x" * 1023}),
                    "message_too_large",
                )
                assert "id" in err
                b64 = base64.b64encode(b"\x01" * 1025).decode()
                _error(
                    ws.request({"type": "PUBLISH", "queue": "big", "body_base64": b64}),
                    "message_too_large",
                )
                assert ws.request({"type": "PING"})["type"] == "PONG"
            assert stats(adm, "big")["ready"] == 1
    finally:
        pg_cluster.drop_database(name)


# -- ids, bad frames, floods ------------------------------------------------------------


def test_every_frame_with_an_id_gets_exactly_one_reply(url: str, adm: httpx.Client, q: str) -> None:
    missing = fresh("missing")
    with WsClient.admin(url) as ws:
        frames: list[dict[str, Any]] = [
            {"type": "PING", "id": 1},
            {"type": "SUBSCRIBE", "queue": q, "prefetch": 2, "id": 2},
            {"type": "SUBSCRIBE", "queue": q, "id": 3},
            {"type": "SUBSCRIBE", "queue": missing, "id": 4},
            {"type": "PUBLISH", "queue": q, "body": "a", "id": 5},
            {"type": "PUBLISH", "queue": q, "body": "b", "id": "six"},
            {"type": "ACK", "delivery_tag": "nope", "id": 7},
            {"type": "NACK", "delivery_tag": "nope", "id": 8},
            {"type": "SUBSCRIBE", "queue": q, "prefetch": 0, "id": 9},
            {"type": "WHATEVER", "id": 10},
            {"type": "UNSUBSCRIBE", "queue": missing, "id": 11},
            {"type": "AUTH", "token": "x", "id": 12},
            {"type": "PING", "id": 0},
            {"type": "PING", "id": ""},
        ]
        for frame in frames:
            ws.send_json(frame)
        received = ws.quiet(1.0)
        by_id = Counter(str(f["id"]) for f in received if "id" in f)
        assert by_id == Counter(str(f["id"]) for f in frames), received
        replies = {str(f["id"]): f["type"] for f in received if "id" in f}
        assert replies["1"] == "PONG"
        assert replies["2"] == "SUBSCRIBED"
        assert replies["5"] == replies["six"] == "PUBLISHED"
        assert [replies[i] for i in ("3", "4", "7", "8", "9", "10", "11", "12")] == ["ERROR"] * 8
        # the two published messages were delivered, and nothing else arrived
        delivered = [f for f in received if f["type"] == "MESSAGE_DELIVERED"]
        assert sorted(d["body"] for d in delivered) == ["a", "b"]
        assert len(received) == len(frames) + 2


@pytest.mark.parametrize(
    "frame",
    [
        "not json",
        "{",
        "[]",
        "42",
        "null",
        '"PING"',
        '{"no_type": 1}',
        '{"type": 5}',
        '{"type": "WHATEVER"}',
        '{"type": "ping"}',
        '{"type": "SUBSCRIBE"}',
        '{"type": "SUBSCRIBE", "queue": "q", "extra": 1}',
        '{"type": "PING", "id": 1.5}',
        '{"type": "PING", "id": true}',
        '{"type": "PING", "id": "' + "x" * 65 + '"}',
        b'{"type": "PING"}',
        b"\x00\x01",
    ],
)
def test_bad_frame_is_an_error_and_keeps_the_connection(url: str, frame: str | bytes) -> None:
    with WsClient.admin(url) as ws:
        ws.send_raw(frame)
        err = ws.recv_json()
        assert err["type"] == "ERROR"
        assert err["code"] == "bad_frame"
        assert err["message"]
        assert ws.request({"type": "PING"})["type"] == "PONG"


def test_a_bad_frame_with_a_valid_id_carries_it(url: str) -> None:
    with WsClient.admin(url) as ws:
        ws.send_json({"type": "WHATEVER", "id": "abc"})
        assert ws.recv_json()["id"] == "abc"
        ws.send_json({"type": "SUBSCRIBE", "id": 9})
        err = ws.recv_json()
        assert (err["type"], err["code"], err["id"]) == ("ERROR", "bad_frame", 9)


def test_fifty_bad_frames_are_tolerated_the_fifty_first_closes_1008(url: str) -> None:
    with WsClient.admin(url) as ws:
        for _ in range(50):
            ws.send_raw("garbage")
        for _ in range(50):
            assert ws.recv_json()["code"] == "bad_frame"
        assert ws.request({"type": "PING"})["type"] == "PONG"  # PINGs are not bad frames
        # only bad_frame errors count: other errors do not
        for _ in range(5):
            _error(ws.request({"type": "UNSUBSCRIBE", "queue": "not-subscribed"}), "not_subscribed")
        ws.send_raw("garbage")
        code, frames = ws.expect_close()
        assert code == 1008
        assert [f["code"] for f in frames] == ["bad_frame"]


def test_bad_frames_before_auth_count_too(url: str) -> None:
    """Before AUTH the frame limit (10 answered, the 11th closes) comes before the flood
    limit of 50 bad frames."""
    with WsClient.open(url) as ws:
        # in one write: sent one by one, a frame after the close would fail on the client
        ws.ws.socket.sendall(b"".join(_masked(1, b"{") for _ in range(51)))
        code, frames = ws.expect_close()
        assert code == 1008
        assert [f["code"] for f in frames] == ["bad_frame"] * 10


# -- Origin -----------------------------------------------------------------------------


def test_foreign_origin_is_refused_403(srv: LiveServer) -> None:
    url = srv.ws_url
    assert refused_status(url, basic(), origin="http://evil.example") == 403
    assert refused_status(url, basic(), origin=f"http://127.0.0.1:{srv.port + 1}") == 403
    assert refused_status(url, basic(), origin="null") == 403
    # refused before credentials are even looked at
    assert refused_status(url, basic(ADMIN_USER, "wrong"), origin="http://evil.example") == 403
    r = httpx.get(
        url.replace("ws://", "http://"),
        headers={
            "Origin": "http://evil.example",
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": base64.b64encode(b"0123456789abcdef").decode(),
            **basic(),
        },
    )
    assert r.status_code == 403
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == "forbidden"


def test_same_origin_and_no_origin_are_allowed(srv: LiveServer) -> None:
    for origin in (f"http://127.0.0.1:{srv.port}", f"HTTP://127.0.0.1:{srv.port}/", None):
        with WsClient.open(srv.ws_url, basic(), origin=origin) as ws:
            assert ws.recv_json()["type"] == "CONNECTED"


def test_allowed_origins_list_and_star(pg_cluster: PgCluster, template_db: str) -> None:
    name = pg_cluster.create_database(template_db)
    try:
        url = pg_cluster.url_for(name)
        listed = "https://app.example.com, http://localhost:3000/"
        with running_server(settings_for(url, allowed_origins=listed)) as live:
            for origin in ("https://app.example.com", "http://localhost:3000", None):
                with WsClient.open(live.ws_url, basic(), origin=origin) as ws:
                    assert ws.recv_json()["type"] == "CONNECTED", origin
            # when the list is set, only its entries are allowed: not even the same origin
            for origin in (
                f"http://127.0.0.1:{live.port}",
                "http://localhost:3001",
                "http://app.example.com",
            ):
                assert refused_status(live.ws_url, basic(), origin=origin) == 403, origin
        with running_server(settings_for(url, allowed_origins="*")) as live:
            for origin in ("http://evil.example", f"http://127.0.0.1:{live.port}", None):
                with WsClient.open(live.ws_url, basic(), origin=origin) as ws:
                    assert ws.recv_json()["type"] == "CONNECTED", origin
    finally:
        pg_cluster.drop_database(name)


# -- compression (MESSAGEX_WS_COMPRESSION, docs/decisions.md) ------------------------------


def _offer_deflate(ws_url: str) -> tuple[str | None, dict[str, Any]]:
    """Connect offering permessage-deflate, as browsers do; the extension the server agreed
    to, and the reply to AUTH + PING."""
    with ws_connect(ws_url, compression="deflate", open_timeout=10) as ws:
        assert ws.response is not None
        agreed = ws.response.headers.get("Sec-WebSocket-Extensions")
        ws.send(json.dumps({"type": "AUTH", "username": ADMIN_USER, "password": ADMIN_PASSWORD}))
        assert json.loads(ws.recv(timeout=5))["type"] == "CONNECTED"
        ws.send(json.dumps({"type": "PING", "id": "p"}))
        return agreed, json.loads(ws.recv(timeout=5))


def test_compression_is_declined_unless_configured(url: str, database_url: str) -> None:
    agreed, reply = _offer_deflate(url)
    assert agreed is None  # frames go uncompressed
    assert reply == {"type": "PONG", "id": "p"}
    with running_server(settings_for(database_url, ws_compression=True)) as live:
        agreed, reply = _offer_deflate(live.ws_url)
        assert agreed is not None
        assert agreed.startswith("permessage-deflate")
        assert reply == {"type": "PONG", "id": "p"}
