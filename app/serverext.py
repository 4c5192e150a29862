"""The ASGI extensions our server offers the app, declared once for both sides: the server
(app/server.py, ``BatchingWebSocketProtocol``) puts them in a WebSocket scope's
``extensions``, the app (app/api/ws/connection.py) uses one only when the scope names it and
otherwise falls back to plain ASGI messages, as under any other server.

Each extension's value is a dict of what the app may call on that connection, so the app
needs neither Starlette's private attributes nor the server object:

- ``SEND_MANY``: ``send_many(frames)`` sends several encoded text frames (UTF-8 bytes) with
  one socket write, after waiting while the transport is paused for writing; and when that
  write pauses it, waits again before it returns (so the caller's timeout covers it).
  ``send_now(frames)`` writes a few small ones at once, without waiting, and returns True;
  or False, writing nothing, when they must go through ``send_many`` (the socket is not
  open, is compressed, is paused for writing, or the protocol has bytes of its own to send).
- ``RECEIVE_MANY``: ``receive()`` is the connection's ASGI receive, on which the text frames
  of one socket read arrive as one ``{"type": RECEIVE_MANY, "texts": [str, ...]}`` (a single
  one as a plain ``websocket.receive``), in order with every other event.
- ``ABORT``: ``abort()`` drops the TCP connection at once, discarding unsent data (a peer
  that stopped reading never lets a graceful close finish).
- ``WRITE_BUFFER``: ``size()`` is the number of bytes written to the connection's transport
  and not yet sent (``asyncio.WriteTransport.get_write_buffer_size``): with what the app
  still holds, what waits for a peer that may have stopped reading.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypedDict, cast

SEND_MANY = "messagex.websocket.send_many"
RECEIVE_MANY = "messagex.websocket.receive_many"
ABORT = "messagex.websocket.abort"
WRITE_BUFFER = "messagex.websocket.write_buffer"


class SendMany(TypedDict):
    send_many: Callable[[list[bytes]], Awaitable[None]]
    send_now: Callable[[list[bytes]], bool]


class ReceiveMany(TypedDict):
    receive: Callable[[], Awaitable[Any]]


class Abort(TypedDict):
    abort: Callable[[], None]


class WriteBuffer(TypedDict):
    size: Callable[[], int]


def _get(scope: Mapping[str, Any], name: str) -> Any:
    extensions = scope.get("extensions") or {}
    return extensions.get(name)


def send_many(scope: Mapping[str, Any]) -> Callable[[list[bytes]], Awaitable[None]] | None:
    found = _get(scope, SEND_MANY)
    return None if found is None else cast(SendMany, found)["send_many"]


def send_now(scope: Mapping[str, Any]) -> Callable[[list[bytes]], bool] | None:
    found = _get(scope, SEND_MANY)
    return None if found is None else cast(SendMany, found).get("send_now")


def receive_many(scope: Mapping[str, Any]) -> Callable[[], Awaitable[Any]] | None:
    found = _get(scope, RECEIVE_MANY)
    return None if found is None else cast(ReceiveMany, found)["receive"]


def abort(scope: Mapping[str, Any]) -> Callable[[], None] | None:
    found = _get(scope, ABORT)
    return None if found is None else cast(Abort, found)["abort"]


def write_buffer_size(scope: Mapping[str, Any]) -> Callable[[], int] | None:
    found = _get(scope, WRITE_BUFFER)
    return None if found is None else cast(WriteBuffer, found)["size"]
