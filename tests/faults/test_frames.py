"""Frame abuse on the WebSocket: bounded floods, invalid JSON, wrong schema, binary frames,
NUL bytes, invalid UTF-8, double and foreign ACKs. Every one ends in an ERROR frame or a
close with 1003/1007/1008 — never 1011, never a crash: the server keeps serving afterwards.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import httpx
import pytest

from tests.support import LiveServer, wait_for
from tests.wsclient import WsClient, _masked, declare_queue, publish

BAD_FRAMES: list[tuple[str, str | bytes]] = [
    ("not json", "hello"),
    ("truncated json", '{"type": "PING"'),
    ("json array", "[1, 2, 3]"),
    ("json scalar", "42"),
    ("no type", '{"id": "x1"}'),
    ("type not a string", '{"type": 7, "id": "x2"}'),
    ("unknown type", '{"type": "FLY", "id": "x3"}'),
    ("lower-case type", '{"type": "ping", "id": "x4"}'),
    ("unknown field", '{"type": "PING", "id": "x5", "extra": 1}'),
    ("missing queue", '{"type": "SUBSCRIBE", "id": "x6"}'),
    ("bad queue name", '{"type": "SUBSCRIBE", "queue": "no spaces", "id": "x7"}'),
    ("prefetch 0", '{"type": "SUBSCRIBE", "queue": "q", "prefetch": 0, "id": "x8"}'),
    ("prefetch too big", '{"type": "SUBSCRIBE", "queue": "q", "prefetch": 1001, "id": "x9"}'),
    ("prefetch a string", '{"type": "SUBSCRIBE", "queue": "q", "prefetch": "5", "id": "x10"}'),
    ("requeue a string", '{"type": "NACK", "delivery_tag": "t", "requeue": "no", "id": "x11"}'),
    ("empty tag", '{"type": "ACK", "delivery_tag": "", "id": "x12"}'),
    ("huge tag", '{"type": "ACK", "delivery_tag": "' + "9" * 5000 + '", "id": "x13"}'),
    ("id too long", '{"type": "PING", "id": "' + "i" * 65 + '"}'),
    ("id an object", '{"type": "PING", "id": {"a": 1}}'),
    ("NUL in queue", '{"type": "SUBSCRIBE", "queue": "q\\u0000", "id": "x14"}'),
    ("raw NUL", '{"type": "PING", "id": "x15"}\x00'),
    ("NUL in header", '{"type": "PUBLISH", "queue": "q", "body": 1, "headers": {"a": "\\u0000"}}'),
    ("surrogate key", '{"type": "PUBLISH", "queue": "q", "body": 1, "headers": {"\\ud800": 1}}'),
    ("both targets", '{"type": "PUBLISH", "queue": "q", "exchange": "amq.direct", "body": 1}'),
    ("both bodies", '{"type": "PUBLISH", "queue": "q", "body": 1, "body_base64": "AA=="}'),
    (
        "deep nesting",
        '{"type": "PUBLISH", "queue": "q", "body": ' + "[" * 100_000 + "]" * 100_000 + "}",
    ),
    ("NaN", '{"type": "PUBLISH", "queue": "q", "body": NaN}'),
    ("AUTH again", '{"type": "AUTH", "token": "x", "id": "x16"}'),
    ("binary frame", b'{"type": "PING", "id": "b1"}'),
    ("binary garbage", bytes(range(256))),
]


@pytest.fixture
def server(mserver: LiveServer) -> LiveServer:
    """One server for the module: abuse must not hurt the tests that come after it."""
    return mserver


@pytest.fixture
def admin(madmin: httpx.Client) -> httpx.Client:
    return madmin


@pytest.fixture
def no_crash(caplog: pytest.LogCaptureFixture) -> Any:
    caplog.set_level(logging.ERROR)
    yield caplog
    crashes = [
        r
        for r in caplog.records
        if r.levelno >= logging.ERROR and ("ASGI" in r.getMessage() or r.exc_info)
    ]
    assert not crashes, [r.getMessage() for r in crashes]


def parses(frame: str | bytes) -> bool:
    try:
        json.loads(frame)
    except ValueError:
        return False
    return True


def alive(server: LiveServer) -> None:
    with WsClient.admin(server.ws_url) as ws:
        assert ws.request({"type": "PING"})["type"] == "PONG"
    assert httpx.get(f"{server.base_url}/healthz").status_code == 200


@pytest.mark.parametrize(("what", "frame"), BAD_FRAMES, ids=[w for w, _ in BAD_FRAMES])
def test_a_bad_frame_gets_an_error_and_the_connection_stays_open(
    server: LiveServer, admin: httpx.Client, no_crash: Any, what: str, frame: str | bytes
) -> None:
    declare_queue(admin, "q")
    with WsClient.admin(server.ws_url) as ws:
        ws.send_raw(frame)
        error = ws.expect("ERROR")
        assert error["code"] == "bad_frame", (what, error)
        # a valid id is echoed even on a bad frame; an invalid one is not
        if '"id": "x' in str(frame) and parses(frame):
            assert error["id"].startswith("x")
        assert "id" not in error or isinstance(error["id"], str)
        # nothing happened, and the connection still works
        assert ws.request({"type": "PING"})["type"] == "PONG"
    assert admin.get("/queues/q").json()["stats"]["ready"] == 0
    alive(server)


def close_code(server: LiveServer, data: bytes) -> int | None:
    """Send ``data`` as it is on a new authenticated WebSocket: the code of the close that
    answers it."""
    with WsClient.admin(server.ws_url) as ws:
        ws.ws.socket.sendall(data)
        code, _ = ws.expect_close()
    return code


def test_invalid_utf8_closes_1007(server: LiveServer, no_crash: Any) -> None:
    assert close_code(server, _masked(1, b'{"type": "PING", "x": "\xff\xfe"}')) == 1007
    alive(server)


def test_frames_of_one_read_keep_their_order_around_a_binary_one(
    server: LiveServer, no_crash: Any
) -> None:
    """Text frames read together reach the app as one batch (app/server.py, RECEIVE_MANY);
    a binary frame between them is still answered in its place."""
    with WsClient.admin(server.ws_url) as ws:
        ping = [_masked(1, json.dumps({"type": "PING", "id": i}).encode()) for i in "abc"]
        ws.ws.socket.sendall(ping[0] + ping[1] + _masked(2, b"\x00") + ping[2])
        frames = [ws.recv_json() for _ in range(4)]
        assert [(f["type"], f.get("id"), f.get("code")) for f in frames] == [
            ("PONG", "a", None),
            ("PONG", "b", None),
            ("ERROR", None, "bad_frame"),
            ("PONG", "c", None),
        ]
    alive(server)


def test_an_ack_read_with_an_invalid_frame_takes_effect_before_the_1007(
    server: LiveServer, admin: httpx.Client, no_crash: Any
) -> None:
    """The invalid UTF-8 frame closes the connection, but the ACK read before it in the same
    read still settles: the message is gone, not released for redelivery."""
    declare_queue(admin, "q")
    publish(admin, "q", "x")
    with WsClient.admin(server.ws_url) as ws:
        ws.subscribe("q")
        tag = ws.delivery()["delivery_tag"]
        ack = json.dumps({"type": "ACK", "delivery_tag": tag}).encode()
        ws.ws.socket.sendall(_masked(1, ack) + _masked(1, b'{"type": "PING", "x": "\xff"}'))
        code, _ = ws.expect_close()
        assert code == 1007

    def settled() -> dict[str, Any] | None:
        stats: dict[str, Any] = admin.get("/queues/q").json()["stats"]
        return stats if stats["consumers"] == 0 and stats["in_flight"] == 0 else None

    assert wait_for(settled)["ready"] == 0
    alive(server)


def test_a_flood_of_bad_frames_closes_1008_never_1011(server: LiveServer, no_crash: Any) -> None:
    with WsClient.admin(server.ws_url) as ws:
        ws.ws.socket.sendall(b"".join(_masked(1, b"nope") for _ in range(500)))
        code, frames = ws.expect_close(10)
        assert code == 1008
        errors = [f for f in frames if f["type"] == "ERROR"]
        assert 50 < len(errors) <= 500
    alive(server)


def test_a_flood_of_valid_frames_is_answered_in_order_with_bounded_buffering(
    server: LiveServer, no_crash: Any
) -> None:
    """20,000 PINGs in one burst while the client does not read: the server stops reading
    when its outbox is full (backpressure) and answers every one, in order, once read."""
    n = 20_000
    with WsClient.admin(server.ws_url) as ws:
        ws.burst([{"type": "PING", "id": i} for i in range(n)])
        time.sleep(0.5)  # the client reads nothing meanwhile
        ids = [ws.expect("PONG", 30)["id"] for _ in range(n)]
        assert ids == list(range(n))
    alive(server)


def test_double_and_foreign_acks_are_unknown_delivery_tag(
    server: LiveServer, admin: httpx.Client, no_crash: Any
) -> None:
    declare_queue(admin, "acks")
    publish(admin, "acks", "one")
    publish(admin, "acks", "two")
    with WsClient.admin(server.ws_url) as owner, WsClient.admin(server.ws_url) as stranger:
        owner.subscribe("acks", 2)
        first, second = owner.deliveries_n(2)
        # foreign: another connection's tag
        reply = stranger.ack(first["delivery_tag"])
        assert reply["type"] == "ERROR"
        assert reply["code"] == "unknown_delivery_tag"
        assert reply["delivery_tag"] == first["delivery_tag"]
        reply = stranger.nack(second["delivery_tag"])
        assert reply["code"] == "unknown_delivery_tag"
        # forged: a well-formed tag of a real message with another random part
        forged = first["delivery_tag"].split(".")[0] + "." + "0" * 32
        assert owner.ack(forged)["code"] == "unknown_delivery_tag"
        # the owner's own ack still works once, not twice
        assert owner.ack(first["delivery_tag"])["type"] == "ACKED"
        assert owner.ack(first["delivery_tag"])["code"] == "unknown_delivery_tag"
        assert owner.nack(second["delivery_tag"], requeue=False)["type"] == "NACKED"
        assert owner.nack(second["delivery_tag"])["code"] == "unknown_delivery_tag"
        # a storm of double acks in one burst: every one answered, none changes anything
        owner.burst(
            [{"type": "ACK", "delivery_tag": first["delivery_tag"], "id": i} for i in range(300)]
        )
        replies = [owner.expect("ERROR", 10) for _ in range(300)]
        assert {r["code"] for r in replies} == {"unknown_delivery_tag"}
    final = {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 0, "consumers": 0}
    wait_for(lambda: admin.get("/queues/acks").json()["stats"] == final, 5)


# -- the server's fast path for plain text frames (app/server.py, ``plain_texts``) and what it
# leaves to websockets' parser: each read below is built so that the fast path must give it up


def _frame(
    opcode: int,
    payload: bytes,
    *,
    fin: bool = True,
    masked: bool = True,
    mask: bytes = b"\x01\x02\x03\x04",
) -> bytes:
    """One client frame, final or not, masked or not (``_masked`` makes final masked ones)."""
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    flag = 0x80 if masked else 0
    if n < 126:
        head += bytes([flag | n])
    else:
        head += bytes([flag | 126]) + n.to_bytes(2, "big")
    if not masked:
        return head + payload
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def _ping(frame_id: str, pad: int = 0) -> bytes:
    """A PING text frame's payload, padded with JSON whitespace to a length of choice."""
    return json.dumps({"type": "PING", "id": frame_id}).encode() + b" " * pad


def pong_ids(ws: WsClient, n: int) -> list[str]:
    return [ws.expect("PONG")["id"] for _ in range(n)]


def test_a_frame_split_over_two_reads_is_read_whole(server: LiveServer, no_crash: Any) -> None:
    """The first read ends inside a frame: the parser holds its start, so the next read (the
    rest, then a whole frame) is the parser's too; then plain reads take the fast path.

    The rest of "b" is made to look like a whole frame of its own (an empty masked text
    frame: its payload's last 6 bytes are spaces, masked to 81 80 20 20 81 80), so a
    server that read it as the start of a frame would answer it with an ERROR."""
    with WsClient.admin(server.ws_url) as ws:
        payload = _ping("b").ljust(28) + b" " * 6  # "b" padded to 28, then the 6 bytes
        split = _frame(1, payload, mask=b"\xa1\xa0\x00\x00")
        assert split[-6:] == b"\x81\x80\x20\x20\x81\x80"
        ws.ws.socket.sendall(_masked(1, _ping("a")) + split[:-6])
        assert pong_ids(ws, 1) == ["a"]  # the server has read the start of "b"
        ws.ws.socket.sendall(split[-6:] + _masked(1, _ping("c")))
        replies = [ws.recv_json() for _ in range(2)]
        assert [(f["type"], f.get("id")) for f in replies] == [("PONG", "b"), ("PONG", "c")]
        long = _masked(1, _ping("e", 200))  # 16-bit length
        ws.ws.socket.sendall(_masked(1, _ping("d")) + long)
        assert pong_ids(ws, 2) == ["d", "e"]
    alive(server)


def test_a_text_frame_inside_a_fragmented_message_closes_1002(
    server: LiveServer, no_crash: Any
) -> None:
    """A message's first fragment, then (in the next read) a whole text frame where a
    continuation is due: a protocol error, which only the parser knows of."""
    with WsClient.admin(server.ws_url) as ws:
        first = _frame(1, _ping("x")[:10], fin=False)
        ws.ws.socket.sendall(_masked(1, _ping("a")) + first)
        assert pong_ids(ws, 1) == ["a"]  # the server has read the fragment
        ws.ws.socket.sendall(_masked(1, _ping("b")))
        code, frames = ws.expect_close()
        assert code == 1002
        assert not frames, frames
    alive(server)


def test_a_fragmented_message_with_a_ping_between_its_fragments(
    server: LiveServer, no_crash: Any
) -> None:
    """A text message in two fragments, a control frame (a WebSocket ping) between them, over
    two reads: the second read starts inside a message, so the parser takes it."""
    with WsClient.admin(server.ws_url) as ws:
        payload = _ping("frag")
        first = _frame(1, payload[:10], fin=False)
        ws.ws.socket.sendall(_masked(1, _ping("a")) + first + _frame(9, b"hi"))
        assert pong_ids(ws, 1) == ["a"]
        ws.ws.socket.sendall(_frame(0, payload[10:]) + _masked(1, _ping("b")))
        assert pong_ids(ws, 2) == ["frag", "b"]
    alive(server)


def test_a_control_frame_among_text_frames_is_answered_in_place(
    server: LiveServer, no_crash: Any
) -> None:
    with WsClient.admin(server.ws_url) as ws:
        ws.ws.socket.sendall(_masked(1, _ping("a")) + _frame(9, b"hi") + _masked(1, _ping("b")))
        assert pong_ids(ws, 2) == ["a", "b"]
        assert ws.request({"type": "PING"})["type"] == "PONG"
    alive(server)


def test_an_unmasked_frame_closes_1002(server: LiveServer, no_crash: Any) -> None:
    with WsClient.admin(server.ws_url) as ws:
        ws.ws.socket.sendall(_masked(1, _ping("a")) + _frame(1, _ping("b"), masked=False))
        code, frames = ws.expect_close()
        assert code == 1002
        assert [f.get("id") for f in frames if f["type"] == "PONG"] in ([], ["a"])
    alive(server)


def test_a_close_frame_after_text_frames_in_one_read(server: LiveServer, no_crash: Any) -> None:
    """The texts before the close reach the app; the close is echoed."""
    close = _frame(8, (1000).to_bytes(2, "big") + b"bye")
    assert close_code(server, _masked(1, _ping("a")) + close) == 1000
    alive(server)


def test_frames_with_reserved_bits_or_a_64_bit_length_take_the_parser(
    server: LiveServer, no_crash: Any
) -> None:
    """An RSV1 bit without compression closes 1002 (the parser's rule); a 64-bit length
    for a small payload is read as usual."""
    with WsClient.admin(server.ws_url) as ws:
        payload = _ping("long")
        mask = b"\x00\x00\x00\x00"
        head = bytes([0x81, 0x80 | 127]) + len(payload).to_bytes(8, "big") + mask
        ws.ws.socket.sendall(head + payload)
        assert pong_ids(ws, 1) == ["long"]
        rsv1 = bytearray(_masked(1, _ping("x")))
        rsv1[0] |= 0x40
        ws.ws.socket.sendall(bytes(rsv1))
        code, _ = ws.expect_close()
        assert code == 1002
    alive(server)
