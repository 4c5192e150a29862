"""Cluster events: what one broker process tells the others over ``NOTIFY messagex_events``.

Events are coalesced while one waits to be sent (a background task on the listener's own
connection sends them, so a full notification queue can never fail a publish) and decoded
into the same typed ``ClusterEvent`` on the other side. NOTIFY is a hint: every receiver also
polls, reconciles and re-checks on its own clock, so a lost event costs latency, not a message.

Behind a transaction pooler (``MESSAGEX_DATABASE_POOL_MODE=transaction``) LISTEN goes over
``MESSAGEX_LISTEN_DATABASE_URL``, a direct connection. Without one the process does not
LISTEN at all (through the pooler it would hear nothing, silently): it ``polls`` — its
events still go out by NOTIFY (that works through the pooler, and other processes may
listen), and what it would have heard it finds on the clocks above, which cover every event
but a deleted queue; the delivery engine checks its subscribed queues for that
(broker/delivery.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from app.broker.tasks import TaskOwner
from app.storage import pooler
from app.storage.listener import MAX_PAYLOAD, Listener

CHANNEL = "messagex_events"


@dataclass(slots=True)
class ClusterEvent:
    """What one process tells the others; each field is what the receivers act on."""

    #: the sending process (a process ignores its own events)
    sender: str
    #: queues that got ready messages: wake their dispatchers and long polls
    queues: set[int] = field(default_factory=set)
    #: connections whose deliveries were settled elsewhere: reconcile their credit
    released_owners: set[str] = field(default_factory=set)
    #: deleted queues: cancel their subscriptions
    deleted_queues: set[str] = field(default_factory=set)
    #: users changed or deleted: re-check their sockets' permissions
    users: set[str] = field(default_factory=set)
    #: digests of revoked sessions: close their sockets
    sessions: set[bytes] = field(default_factory=set)
    #: the event was too big for one NOTIFY: wake every queue and reconcile all credit
    everything: bool = False
    #: WebSocket connections an administrator closed (contract §20): whoever holds one closes it
    closed_connections: set[str] = field(default_factory=set)

    def empty(self) -> bool:
        return not (
            self.queues
            or self.released_owners
            or self.deleted_queues
            or self.users
            or self.sessions
            or self.everything
            or self.closed_connections
        )


# The wire form is one JSON object with one-letter keys (a NOTIFY payload is capped just under
# 8000 bytes, and short keys leave the room to names): "p" sender, "q" queues, "r" released
# owners, "d" deleted queues, "u" users, "s" session digests in hex, "c" connections to
# close, "all" everything. Only
# ``encode`` and ``decode`` know it.


def encode(event: ClusterEvent) -> str:
    """The NOTIFY payload of ``event``; one that would not fit asks for everything instead
    (everyone re-polls and reconciles, and the periodic re-checks cover users and sessions)."""
    fields: dict[str, object] = {
        "p": event.sender,
        "q": sorted(event.queues),
        "r": sorted(event.released_owners),
        "d": sorted(event.deleted_queues),
        "u": sorted(event.users),
        "s": sorted(s.hex() for s in event.sessions),
    }
    if event.closed_connections:  # only then: the form older processes read stays as it was
        fields["c"] = sorted(event.closed_connections)
    body = orjson.dumps(fields)
    if len(body) <= MAX_PAYLOAD and not event.everything:
        return body.decode()
    return orjson.dumps({"p": event.sender, "all": True}).decode()


def sender_prefix(process_id: str) -> str:
    """How every payload ``process_id`` encodes begins: a process hears its own NOTIFYs too,
    and drops them on this test alone (one per publish at load) without decoding them."""
    return '{"p":' + orjson.dumps(process_id).decode() + ","


def decode(payload: str) -> ClusterEvent | None:
    """The event a payload carries, or None when it is not one (the hint is dropped)."""
    try:
        body = orjson.loads(payload)
        if not isinstance(body, dict):
            return None
        get = body.get
        return ClusterEvent(
            str(get("p")),
            set(map(int, get("q", ()))),
            set(map(str, get("r", ()))),
            set(map(str, get("d", ()))),
            set(map(str, get("u", ()))),
            set(map(bytes.fromhex, get("s", ()))),
            bool(get("all")),
            set(map(str, get("c", ()))),
        )
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return None


class ClusterBus:
    """This process's end of the channel: ``tell_*`` queues an event for the others (sent soon,
    coalesced), and events from the others go to ``receive``."""

    def __init__(
        self,
        database_url: str,
        process_id: str,
        receive: Callable[[ClusterEvent], None],
        on_listening: Callable[[], None],
        *,
        listen_url: str | None = None,
        pool_mode: pooler.PoolMode = pooler.SESSION,
    ) -> None:
        self.process_id = process_id
        self.receive = receive
        #: True: this process does not LISTEN (its only URL is transaction-pooled)
        self.polling = listen_url is None and pool_mode == pooler.TRANSACTION
        self.listener = Listener(
            listen_url or database_url,
            CHANNEL,
            self._on_notify,
            on_listening,
            listen=not self.polling,
            pool_mode=pool_mode if listen_url is None else pooler.SESSION,
        )
        self._outgoing = ClusterEvent(process_id)
        self._ready = asyncio.Event()
        self._mine = sender_prefix(process_id)

    def start(self, tasks: TaskOwner) -> None:
        tasks.spawn(self.listener.run(), name="listener")
        tasks.spawn(self._send(), name="notify")

    async def close(self) -> None:
        await self.listener.close()

    def tell_queues(self, queue_ids: set[int]) -> None:
        self._outgoing.queues |= queue_ids
        self._ready.set()

    def tell_released(self, owners: set[str]) -> None:
        self._outgoing.released_owners |= owners
        self._ready.set()

    def tell_queue_deleted(self, queue: str) -> None:
        self._outgoing.deleted_queues.add(queue)
        self._ready.set()

    def tell_user_changed(self, username: str) -> None:
        self._outgoing.users.add(username)
        self._ready.set()

    def tell_close_connection(self, connection_id: str) -> None:
        self._outgoing.closed_connections.add(connection_id)
        self._ready.set()

    def tell_session_revoked(self, digest: bytes) -> None:
        self._outgoing.sessions.add(digest)
        self._ready.set()

    def _on_notify(self, payload: str) -> None:
        if payload.startswith(self._mine):
            return
        event = decode(payload)
        if event is not None and event.sender != self.process_id:
            self.receive(event)

    async def _send(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            event, self._outgoing = self._outgoing, ClusterEvent(self.process_id)
            if not event.empty():
                await self.listener.notify(encode(event))
