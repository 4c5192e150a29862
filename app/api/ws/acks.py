"""ACK batching for one WebSocket connection, and the reply each ACK frame is owed.

``ACK`` is the frame a busy consumer sends per message. The ACK frames read in one turn of
the event loop (a burst from one socket read) are settled together, by one call of the
delivery engine and a callback on the batched ack's future: no task, future and callbacks
per frame. Any other frame flushes them first (the connection calls ``flush``), so frames
still take effect in order.

Nothing here knows the socket or the server: the connection gives ``settle`` (the engine's
``ack_soon``), ``track`` (its in-flight operations, so a close waits for the batch) and
``send`` (its outbox), and tests/unit/test_ack_batching.py drives it with fakes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from app.api.problems import error_frame
from app.api.ws.frames import Ack
from app.errors import BrokerError, UnknownDeliveryTag

log = logging.getLogger("messagex.ws")

FrameId = str | int | None
#: ``done(queue_ids, None)`` once settled (``queue_ids[i]`` None where ``tags[i]`` was not a
#: delivery in flight to this connection), or ``done([], error)``
Done = Callable[[list[int | None], BaseException | None], None]
#: settle ``tags`` (each as if acked alone) and call ``done``; what to wait for
Settle = Callable[[Sequence[str], Done], "asyncio.Future[Any]"]


class AckBatcher:
    """The ACK frames read, not yet settling, and the replies once they are settled."""

    def __init__(
        self,
        settle: Settle,
        track: Callable[[asyncio.Future[Any]], None],
        send: Callable[[dict[str, Any]], None],
    ) -> None:
        self._settle = settle
        self._track = track
        self._send = send
        self._pending: list[tuple[Ack, FrameId]] = []

    def __len__(self) -> int:
        return len(self._pending)

    def detach(self) -> None:
        """The connection is gone: drop what refers to it (its bound methods), so that no
        reference cycle keeps it; later ACKs are ignored."""
        self._pending = []
        self._settle = _closed_settle
        self._track = _ignore
        self._send = _ignore

    def add(self, frame: Ack, frame_id: FrameId) -> None:
        """Settle ``frame`` with the others read in this turn of the event loop."""
        if not self._pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self._pending.append((frame, frame_id))

    def flush(self) -> None:
        """Start settling what was read (before any other frame, and on close)."""
        batch, self._pending = self._pending, []
        if not batch:
            return
        tags = [tag for frame, _ in batch for tag in frame.tags]
        self._track(self._settle(tags, partial(self._settled, batch)))

    def _settled(
        self,
        batch: list[tuple[Ack, FrameId]],
        queue_ids: list[int | None],
        exc: BaseException | None,
    ) -> None:
        if exc is None and None not in queue_ids:  # the busy consumer's case: all settled
            for frame, frame_id in batch:
                if frame_id is not None:
                    self._reply(frame, frame_id, [], None)
            return
        start = 0
        for frame, frame_id in batch:
            end = start + len(frame.tags)
            if exc is not None:
                self._reply(frame, frame_id, list(frame.tags), exc)
            else:
                found = queue_ids[start:end]
                unknown = [t for t, q in zip(frame.tags, found, strict=True) if q is None]
                self._reply(frame, frame_id, unknown, None)
            start = end

    def _reply(
        self, frame: Ack, frame_id: FrameId, unknown: list[str], exc: BaseException | None
    ) -> None:
        reply = ack_reply(frame, frame_id, unknown, exc)
        if reply is not None:
            self._send(reply)


def _ignore(_: Any) -> None:
    pass


def _closed_settle(tags: Sequence[str], done: Done) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future


def ack_reply(
    frame: Ack, frame_id: FrameId, unknown: list[str], exc: BaseException | None
) -> dict[str, Any] | None:
    """The reply to an ACK: ``ACKED`` (with an id; none without), or one ``ERROR`` naming the
    tags that were unknown (the frame's other tags are acknowledged) or that failed."""
    many = frame.delivery_tags is not None
    if exc is None and not unknown:
        if frame_id is None:
            return None
        if many:
            return {"type": "ACKED", "delivery_tags": frame.delivery_tags, "id": frame_id}
        return {"type": "ACKED", "delivery_tag": frame.delivery_tag, "id": frame_id}
    if exc is None:
        error: BrokerError = UnknownDeliveryTag()
        if many:
            error = UnknownDeliveryTag(
                f"{len(unknown)} of the {len(frame.tags)} delivery tags are not deliveries"
                " in flight to this connection; the others are acknowledged"
            )
    elif isinstance(exc, BrokerError):
        error = exc
    else:
        log.error("an ACK failed unexpectedly: %s", type(exc).__name__)
        error = BrokerError("an internal error occurred")
    if many:
        return error_frame(error, frame_id, delivery_tags=unknown)
    return error_frame(error, frame_id, delivery_tag=frame.delivery_tag)
