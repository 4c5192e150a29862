"""A WebSocket connection's state moves only as app/api/ws/lifecycle.py allows, every frame
type has its handler, and its in-flight operations (app/api/ws/inflight.py) are bounded and
drained on close."""

from __future__ import annotations

import asyncio
import logging
from typing import get_args

import pytest

from app.api.ws import frames, handlers
from app.api.ws.inflight import InFlight
from app.api.ws.lifecycle import TRANSITIONS, Lifecycle, State


def test_a_connection_authenticates_opens_and_closes() -> None:
    life = Lifecycle()
    seen = [life.state]
    for state in (State.OPEN, State.CLOSING):
        assert life.move(state)
        seen.append(life.state)
    assert seen == [State.AUTHENTICATING, State.OPEN, State.CLOSING]


def test_a_connection_may_close_before_it_authenticates() -> None:
    life = Lifecycle()
    assert life.move(State.CLOSING)
    assert life.state is State.CLOSING


@pytest.mark.parametrize(
    ("path", "refused"),
    [
        ([State.OPEN], State.OPEN),  # opened twice
        ([State.OPEN], State.AUTHENTICATING),
        ([State.CLOSING], State.OPEN),  # reopened once closing
        ([State.OPEN, State.CLOSING], State.OPEN),
        ([State.OPEN, State.CLOSING], State.CLOSING),
    ],
)
def test_a_wrong_move_is_logged_and_refused_not_raised(
    path: list[State], refused: State, caplog: pytest.LogCaptureFixture
) -> None:
    life = Lifecycle()
    for state in path:
        assert life.move(state)
    with caplog.at_level(logging.ERROR, logger="messagex.ws"):
        assert not life.move(refused)
    assert life.state is path[-1]
    assert f"{path[-1].name} -> {refused.name}" in caplog.text


def test_every_state_has_its_moves_and_closing_is_final() -> None:
    assert set(TRANSITIONS) == set(State)
    assert TRANSITIONS[State.CLOSING] == frozenset()
    assert all(State.AUTHENTICATING not in to for to in TRANSITIONS.values())


def test_every_frame_type_has_a_handler_once_open() -> None:
    union, _field = get_args(frames.Frame)
    parsed = {*get_args(union), frames.PlainAck, frames.PlainAcks}
    assert set(handlers.HANDLERS) == parsed
    assert set(handlers.BEFORE_AUTH) == {frames.PingFrame, frames.AuthFrame}


async def test_in_flight_operations_are_bounded_and_make_room_as_they_finish() -> None:
    ops = InFlight(2)
    gates = [asyncio.Event() for _ in range(3)]
    ops.track(asyncio.ensure_future(gates[0].wait()))
    ops.track(asyncio.ensure_future(gates[1].wait()))
    assert len(ops) == 2
    waiting = asyncio.ensure_future(ops.wait_for_room())
    await asyncio.sleep(0)
    assert not waiting.done()
    gates[0].set()
    await asyncio.wait_for(waiting, timeout=5)
    assert len(ops) == 1


async def test_a_close_lets_operations_finish_within_the_grace_then_cancels_them() -> None:
    ops = InFlight(10)
    quick = asyncio.ensure_future(asyncio.sleep(0.01))
    stuck = asyncio.ensure_future(asyncio.Event().wait())
    ops.track(quick)
    ops.track(stuck)
    await asyncio.wait_for(ops.drain(0.2), timeout=5)
    assert quick.done()
    assert not quick.cancelled()
    assert stuck.cancelled()
    assert len(ops) == 0
