"""app.broker.cluster: the NOTIFY payload of a cluster event, both ways, within its bound."""

from __future__ import annotations

import orjson
import pytest

from app.broker.cluster import ClusterEvent, decode, encode, sender_prefix
from app.storage.listener import MAX_PAYLOAD

SENDER = "3f1c2a7e-9b1d-4c55-8a0e-2f6d7c1b9e10"


def test_an_event_comes_back_as_it_was_sent() -> None:
    event = ClusterEvent(
        SENDER,
        queues={3, 1},
        released_owners={"c1"},
        deleted_queues={"orders", "é"},
        users={"alice"},
        sessions={b"\x00\xff" * 16},
    )
    assert decode(encode(event)) == event


def test_the_wire_form_is_the_one_older_processes_read() -> None:
    payload = encode(ClusterEvent(SENDER, queues={2, 1}, sessions={b"\xab"}))
    expected = {"p": SENDER, "q": [1, 2], "r": [], "d": [], "u": [], "s": ["ab"]}
    assert orjson.loads(payload) == expected


def test_connections_to_close_travel_under_their_own_key() -> None:
    event = ClusterEvent(SENDER, closed_connections={"c2", "c1"})
    assert orjson.loads(encode(event))["c"] == ["c1", "c2"]
    assert decode(encode(event)) == event


def test_an_event_too_big_for_one_notify_asks_for_everything() -> None:
    event = ClusterEvent(SENDER, deleted_queues={f"queue-{i:04}" for i in range(1000)})
    payload = encode(event)
    assert len(payload.encode()) <= MAX_PAYLOAD
    assert decode(payload) == ClusterEvent(SENDER, everything=True)


def test_the_bound_counts_bytes_not_characters() -> None:
    # 3 bytes per character in UTF-8: fewer characters than the bound, more bytes
    event = ClusterEvent(SENDER, deleted_queues={"€" * 3000})
    assert decode(encode(event)) == ClusterEvent(SENDER, everything=True)


def test_what_a_process_sends_starts_with_its_prefix_and_no_one_elses() -> None:
    payload = encode(ClusterEvent(SENDER, queues={1}))
    assert payload.startswith(sender_prefix(SENDER))
    assert not payload.startswith(sender_prefix(SENDER[:-1]))
    assert encode(ClusterEvent(SENDER, everything=True)).startswith(sender_prefix(SENDER))


@pytest.mark.parametrize(
    "payload",
    ["", "not json", "[1]", '{"p": "x", "q": ["a"]}', '{"p": "x", "s": ["zz"]}', '{"q": [[1]]}'],
)
def test_a_payload_that_is_not_an_event_is_dropped(payload: str) -> None:
    assert decode(payload) is None
