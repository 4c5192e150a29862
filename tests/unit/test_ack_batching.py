"""ACK batching (app/api/ws/acks.py) without a server: the frames read in one turn of the
event loop settle in one call, and each frame gets the reply it is owed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest

from app.api.ws.acks import AckBatcher, Done, ack_reply
from app.api.ws.frames import AckFrame, PlainAck
from app.errors import Unavailable


class FakeEngine:
    """Settles as told: ``known`` tags get a queue id, others None; or fails with ``error``."""

    def __init__(self, known: set[str], error: BaseException | None = None) -> None:
        self.known = known
        self.error = error
        self.calls: list[list[str]] = []

    def settle(self, tags: Sequence[str], done: Done) -> asyncio.Future[Any]:
        self.calls.append(list(tags))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def finish() -> None:
            if self.error is not None:
                done([], self.error)
            else:
                done([1 if t in self.known else None for t in tags], None)
            future.set_result(None)

        asyncio.get_running_loop().call_soon(finish)
        return future


def batcher(engine: FakeEngine) -> tuple[AckBatcher, list[dict[str, Any]], list[Any]]:
    sent: list[dict[str, Any]] = []
    tracked: list[Any] = []
    return AckBatcher(engine.settle, tracked.append, sent.append), sent, tracked


def ack(tag: str | None = None, tags: list[str] | None = None, id: Any = None) -> AckFrame:
    return AckFrame(type="ACK", delivery_tag=tag, delivery_tags=tags, id=id)


async def settled(tracked: list[Any]) -> None:
    await asyncio.wait_for(asyncio.gather(*tracked), timeout=5)


async def test_the_acks_of_one_turn_settle_in_one_call_in_order() -> None:
    engine = FakeEngine({"a", "b", "c", "d"})
    acks, sent, tracked = batcher(engine)
    acks.add(PlainAck("a"), None)
    acks.add(ack(tags=["b", "c"]), None)
    acks.add(PlainAck("d"), None)
    assert len(acks) == 3
    assert engine.calls == []  # nothing until the loop turns
    await asyncio.sleep(0)
    assert engine.calls == [["a", "b", "c", "d"]]
    assert len(acks) == 0
    await settled(tracked)
    assert sent == []  # no ids: nothing owed when every tag settled


async def test_a_flush_settles_at_once_and_the_next_turn_starts_a_new_batch() -> None:
    engine = FakeEngine({"a", "b"})
    acks, _, tracked = batcher(engine)
    acks.add(PlainAck("a"), None)
    acks.flush()  # another frame came: what was read settles first
    assert engine.calls == [["a"]]
    acks.flush()  # nothing pending: no call
    acks.add(PlainAck("b"), None)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert engine.calls == [["a"], ["b"]]
    await settled(tracked)
    assert len(tracked) == 2


async def test_frames_with_ids_get_acked_and_unknown_tags_get_one_error_per_frame() -> None:
    engine = FakeEngine({"a", "b"})
    acks, sent, tracked = batcher(engine)
    acks.add(ack("a", id=1), 1)
    acks.add(ack(tags=["b", "x", "y"], id="m"), "m")
    acks.add(PlainAck("z"), None)
    acks.add(ack(tags=["b"], id=3), 3)  # b twice: the engine acks it once, both are settled
    acks.flush()
    await settled(tracked)
    assert sent[0] == {"type": "ACKED", "delivery_tag": "a", "id": 1}
    assert sent[1]["type"] == "ERROR"
    assert sent[1]["code"] == "unknown_delivery_tag"
    assert sent[1]["id"] == "m"
    assert sent[1]["delivery_tags"] == ["x", "y"]
    assert sent[1]["message"].startswith("2 of the 3 delivery tags")
    assert sent[2] == {
        "type": "ERROR",
        "code": "unknown_delivery_tag",
        "message": sent[2]["message"],
        "delivery_tag": "z",
    }
    assert sent[3] == {"type": "ACKED", "delivery_tags": ["b"], "id": 3}


async def test_a_failed_settlement_answers_every_frame_with_its_error() -> None:
    engine = FakeEngine(set(), Unavailable("the database is unreachable"))
    acks, sent, tracked = batcher(engine)
    acks.add(PlainAck("a"), None)
    acks.add(ack(tags=["b", "c"], id=2), 2)
    acks.flush()
    await settled(tracked)
    assert [(f["code"], f.get("delivery_tag"), f.get("delivery_tags")) for f in sent] == [
        ("unavailable", "a", None),
        ("unavailable", None, ["b", "c"]),
    ]


def test_an_unexpected_failure_is_an_internal_error_without_details(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="messagex.ws"):
        reply = ack_reply(PlainAck("a"), 5, ["a"], RuntimeError("secret detail"))
    assert reply == {
        "type": "ERROR",
        "code": "internal_error",
        "message": "an internal error occurred",
        "id": 5,
        "delivery_tag": "a",
    }
    assert "secret detail" not in caplog.text
    assert "RuntimeError" in caplog.text
