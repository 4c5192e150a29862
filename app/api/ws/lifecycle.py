"""Where a WebSocket connection is in its life, and the moves it may make.

As Starlette's ``WebSocketState`` guards a socket (CONNECTING → CONNECTED → DISCONNECTED),
an explicit state and table of allowed transitions guard a connection:

    AUTHENTICATING ──AUTH accepted (or header auth)──▶ OPEN
          │                                              │
          └────────────── close ──────▶ CLOSING ◀── close ┘

A move the table does not allow is a programming error. Unlike Starlette's ``RuntimeError``
it is logged and refused, never raised: the callers are the reader, the sender and the broker
(which closes connections from its own tasks), and an exception there would leak the
connection (its deliveries stranded, its sender never told to close).
"""

from __future__ import annotations

import logging
from enum import Enum

log = logging.getLogger("messagex.ws")


class State(Enum):
    AUTHENTICATING = 1
    OPEN = 2
    CLOSING = 3


#: state → the states it may move to
TRANSITIONS: dict[State, frozenset[State]] = {
    State.AUTHENTICATING: frozenset({State.OPEN, State.CLOSING}),
    State.OPEN: frozenset({State.CLOSING}),
    State.CLOSING: frozenset(),
}


class Lifecycle:
    """A connection's state; it changes only through ``move``."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state = State.AUTHENTICATING

    @property
    def state(self) -> State:
        return self._state

    def move(self, to: State) -> bool:
        """Move to ``to`` when TRANSITIONS allow it; else log the bug and stay (False)."""
        if to in TRANSITIONS[self._state]:
            self._state = to
            return True
        log.error(
            "refused a WebSocket connection state change: %s -> %s (a bug)",
            self._state.name,
            to.name,
        )
        return False
