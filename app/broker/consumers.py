"""Live consumers of this process: the connected outlets, and their subscriptions per
(connection, queue) with prefetch as credit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from app.domain.model import User
from app.storage.deliveries import Claimed


class Outlet(Protocol):
    """A consumer connection as the broker sees it (the WebSocket layer implements it)."""

    id: str
    user: User
    #: the password hash the connection authenticated with (None: by a session token)
    password_hash: str | None
    #: how many more deliveries it may be handed now, by the bytes already waiting to be
    #: sent to it (contract §8: none once MESSAGEX_MAX_CONNECTION_BUFFER_BYTES wait)
    room: int

    def deliver(self, subscription: Subscription, items: Sequence[Claimed]) -> None:
        """Queue deliveries for sending; never blocks (credit bounds what is queued)."""

    def cancel(self, queue: str, reason: str) -> None:
        """Send SUBSCRIPTION_CANCELLED."""

    def activated(self, queue: str) -> None:
        """Send SUBSCRIPTION_ACTIVE (a waiting single-active subscription became active)."""

    def close(self, code: int, reason: str) -> None:
        """Close the connection (from another task)."""


@dataclass(eq=False)
class Subscription:
    outlet: Outlet
    queue_id: int
    queue_name: str
    prefetch: int
    lease_seconds: float
    unsettled: set[str] = field(default_factory=set)
    #: receives deliveries (set once SUBSCRIBED is queued, cleared when it ends)
    active: bool = True
    #: the queue has ``x-single-active-consumer`` (broker/single_active.py)
    single_active: bool = False
    #: the queue has ``x-message-groups``: claimed by the group claim, never handed off
    groups: bool = False
    #: a single-active subscription that is not (yet) the active one: no credit meanwhile
    waiting: bool = False
    #: unix time of its last settlement; the heartbeat writes it (``ConsumerRegistry.settled``)
    last_settled: float = 0.0

    @property
    def credit(self) -> int:
        if not self.active:
            return 0
        credit = self.prefetch - len(self.unsettled)
        room = self.outlet.room
        return credit if credit < room else room


class ConsumerRegistry:
    def __init__(self) -> None:
        self._by_queue: dict[int, list[Subscription]] = {}
        self._by_connection: dict[str, dict[int, Subscription]] = {}
        self._rotation: dict[int, int] = {}
        self.outlets: dict[str, Outlet] = {}
        #: the session each token-authenticated connection rides on (connection id → digest)
        self.token_digests: dict[str, bytes] = {}
        #: subscriptions that were handed a tag since they were last seen holding none: a
        #: superset of those with unsettled deliveries, so that the periodic round costs what
        #: is held, not what is subscribed (``holding_connections``)
        self._holders: set[Subscription] = set()
        #: the connections of each user (username → connection id → outlet)
        self.by_user: dict[str, dict[str, Outlet]] = {}
        #: connections whose credentials no periodic re-check has looked at yet
        #: (broker/credentials.py takes them)
        self.unchecked: set[str] = set()
        #: subscriptions that settled since the last heartbeat, which writes their
        #: ``last_settled`` (diagnosis, contract §19) and empties this
        self.settled: set[Subscription] = set()

    def add_outlet(self, outlet: Outlet, token_digest: bytes | None = None) -> None:
        self.outlets[outlet.id] = outlet
        self.by_user.setdefault(outlet.user.username, {})[outlet.id] = outlet
        self.unchecked.add(outlet.id)
        if token_digest is not None:
            self.token_digests[outlet.id] = token_digest

    def remove_outlet(self, connection_id: str) -> None:
        outlet = self.outlets.pop(connection_id, None)
        if outlet is not None:
            mine = self.by_user.get(outlet.user.username, {})
            mine.pop(connection_id, None)
            if not mine:
                self.by_user.pop(outlet.user.username, None)
        self.unchecked.discard(connection_id)
        self.token_digests.pop(connection_id, None)

    def add(self, sub: Subscription) -> None:
        self._by_queue.setdefault(sub.queue_id, []).append(sub)
        self._by_connection.setdefault(sub.outlet.id, {})[sub.queue_id] = sub
        if sub.unsettled:
            self._holders.add(sub)

    def holds(self, sub: Subscription) -> None:
        """``sub`` was given unsettled tags: every path that adds to ``sub.unsettled`` says so,
        or the periodic reconciliation would not see them."""
        self._holders.add(sub)

    def remove(self, sub: Subscription) -> None:
        sub.active = False
        self._holders.discard(sub)
        subs = self._by_queue.get(sub.queue_id, [])
        if sub in subs:
            subs.remove(sub)
        if not subs:
            self._by_queue.pop(sub.queue_id, None)
            self._rotation.pop(sub.queue_id, None)
        conn_subs = self._by_connection.get(sub.outlet.id, {})
        if conn_subs.get(sub.queue_id) is sub:
            del conn_subs[sub.queue_id]
        if not conn_subs:
            self._by_connection.pop(sub.outlet.id, None)

    def get(self, connection_id: str, queue_id: int) -> Subscription | None:
        return self._by_connection.get(connection_id, {}).get(queue_id)

    def of_connection(self, connection_id: str) -> list[Subscription]:
        return list(self._by_connection.get(connection_id, {}).values())

    def of_queue(self, queue_id: int) -> list[Subscription]:
        return list(self._by_queue.get(queue_id, ()))

    def has_queue(self, queue_id: int) -> bool:
        return bool(self._by_queue.get(queue_id))

    def groups(self, queue_id: int) -> bool:
        """The queue has ``x-message-groups`` (known from its subscriptions)."""
        return any(s.groups for s in self._by_queue.get(queue_id, ()))

    def plain(self, queue_id: int) -> bool:
        """The queue's claims may go with other queues' (``Dispatcher``): neither single
        active consumer nor message groups (known from its subscriptions)."""
        return not any(s.single_active or s.groups for s in self._by_queue.get(queue_id, ()))

    def has_credit(self, queue_id: int) -> bool:
        """Some subscriber of the queue has prefetch room."""
        return any(s.credit > 0 for s in self._by_queue.get(queue_id, ()))

    def holding_connections(self) -> list[str]:
        """Connections with unsettled deliveries on some subscription (in the order their
        subscriptions were first seen holding); forgets the subscriptions that hold none now."""
        owners: dict[str, None] = {}
        for sub in list(self._holders):
            if sub.unsettled and self.get(sub.outlet.id, sub.queue_id) is sub:
                owners[sub.outlet.id] = None
            else:
                self._holders.discard(sub)
        return list(owners)

    def queue_ids(self) -> list[int]:
        return list(self._by_queue)

    def connection_ids(self) -> list[str]:
        return list(self.outlets)

    def subscription_count(self) -> int:
        return sum(len(s) for s in self._by_queue.values())

    def find_by_tag(self, connection_id: str, tag: str) -> Subscription | None:
        for sub in self._by_connection.get(connection_id, {}).values():
            if tag in sub.unsettled:
                return sub
        return None

    def round_robin(self, queue_id: int, limit: int) -> list[Subscription]:
        """The order to hand out the next ``limit`` claims: one per subscriber with credit per
        round, starting after whoever was served first last time."""
        subs = [s for s in self._by_queue.get(queue_id, ()) if s.credit > 0]
        if not subs:
            return []
        start = self._rotation.get(queue_id, 0) % len(subs)
        subs = subs[start:] + subs[:start]
        credit = {id(s): s.credit for s in subs}
        order: list[Subscription] = []
        while len(order) < limit:
            progressed = False
            for s in subs:
                if credit[id(s)] > 0 and len(order) < limit:
                    order.append(s)
                    credit[id(s)] -= 1
                    progressed = True
            if not progressed:
                break
        return order

    def advance(self, queue_id: int, served: int) -> None:
        self._rotation[queue_id] = self._rotation.get(queue_id, 0) + served
