"""Single active consumer (contract §13): which local subscriptions of queues declared with
``x-single-active-consumer: true`` wait, and when one becomes active.

Who may be active is decided in the database, across every broker process
(storage/single_active.py): the oldest live subscription row, once the previous holder's
deliveries of the queue are settled or released. Here a waiting subscription has no credit
(``Subscription.waiting``), so the dispatcher never claims for it, and it is checked again
(``promote``, one transaction for all the queues asked about) when something may have
changed:

- a wake-up of its queue (its hub watcher is ``watcher``): a publish, a release or a requeue,
  here or — through ``NOTIFY`` — on another process;
- a single-active subscription ended on any process (``ended`` wakes the queue here and tells
  the others), or a delivery of one that ended was settled (``settled_elsewhere``);
- and, as the safety net, once a second while any local subscription waits (``check_all``),
  which is what notices a dead process's release when nothing else does.

The dispatcher claims for an active one through the gate of ``single_active.claim``; should it
find it is no longer the active one (its process was taken for dead and came back), the
subscription waits again (``deposed``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable

from app.broker.consumers import ConsumerRegistry, Subscription
from app.broker.dispatcher import Dispatcher
from app.broker.tasks import TaskOwner
from app.broker.wakeups import WakeHub
from app.errors import Unavailable
from app.storage import single_active
from app.storage.database import Database

log = logging.getLogger("messagex.delivery")

#: how often waiting subscriptions are checked when no event says anything changed
CHECK_SECONDS = 1.0


class SingleActive:
    def __init__(
        self,
        db: Database,
        hub: WakeHub,
        registry: ConsumerRegistry,
        dispatcher: Dispatcher,
        tasks: TaskOwner,
        tell_others: Callable[[set[int]], None],
    ) -> None:
        self.db = db
        self.hub = hub
        self.registry = registry
        self.dispatcher = dispatcher
        self.tasks = tasks
        self.tell_others = tell_others
        #: local subscriptions that wait, by queue
        self._waiting: dict[int, set[Subscription]] = {}
        #: queues to check soon, and whether a task does
        self._due: set[int] = set()
        self._checking = False
        #: queues a local subscription of which ended: a settle of its deliveries tells
        self._left: set[int] = set()
        dispatcher.deposed = self.deposed

    # -- subscriptions come and go --------------------------------------------------------

    def added(self, sub: Subscription) -> None:
        """A local subscription was registered; it waits when ``sub.waiting``."""
        if sub.waiting:
            self._wait(sub)

    def _wait(self, sub: Subscription) -> None:
        self._waiting.setdefault(sub.queue_id, set()).add(sub)

    def _unwait(self, sub: Subscription) -> bool:
        """Whether ``sub`` waited (it no longer does)."""
        subs = self._waiting.get(sub.queue_id)
        if subs is None or sub not in subs:
            return False
        subs.discard(sub)
        if not subs:
            del self._waiting[sub.queue_id]
        return True

    def ended(self, sub: Subscription) -> None:
        """A local single-active subscription ended (UNSUBSCRIBE, close, cancel): the next
        oldest, here or elsewhere, may take over."""
        self._unwait(sub)
        sub.waiting = False
        if sub.unsettled:
            self._left.add(sub.queue_id)
        self.changed({sub.queue_id})

    def changed(self, queue_ids: set[int]) -> None:
        """Who may be active in these queues may have changed: check here and elsewhere."""
        self.hub.wake(queue_ids)
        self.tell_others(queue_ids)

    def settled_elsewhere(self, queue_id: int) -> None:
        """A delivery no local subscription holds was settled (one of a subscription that
        ended): if it was the last of the old holder, the next one may start."""
        if queue_id in self._left:
            self.changed({queue_id})

    def deposed(self, sub: Subscription) -> None:
        """The claim's gate said ``sub`` is not the active one (any more): it waits."""
        if self.registry.get(sub.outlet.id, sub.queue_id) is sub and not sub.waiting:
            log.warning("a single-active subscription was taken over; it waits again")
            sub.active = False
            sub.waiting = True
            self._wait(sub)

    # -- checks -----------------------------------------------------------------------------

    def watcher(self, queue_id: int) -> None:
        """The hub watcher of a single-active queue: check its waiting subscriptions, then
        what the dispatcher does for any queue."""
        if queue_id in self._waiting:
            self.check_soon([queue_id])
        self.dispatcher.poke(queue_id)

    def check_soon(self, queue_ids: Iterable[int]) -> None:
        self._due.update(queue_ids)
        if not self._checking:
            self._checking = True
            self.tasks.spawn(self._check_due(), name="single-active-check")

    async def _check_due(self) -> None:
        try:
            while self._due:
                due, self._due = self._due, set()
                with contextlib.suppress(Unavailable):  # check_all tries again
                    await self.promote(due)
        finally:
            self._checking = False

    async def check_all(self) -> None:
        """The periodic check: every queue with a local waiting subscription (no statement
        when none waits)."""
        if self._waiting:
            await self.promote(set(self._waiting))

    async def promote(self, queue_ids: set[int]) -> None:
        """Ask the database whether a local waiting subscription of these queues is now the
        active one; each that is gets SUBSCRIPTION_ACTIVE and its dispatcher is woken."""
        candidates = [
            (queue_id, sub.outlet.id)
            for queue_id in queue_ids
            for sub in self._waiting.get(queue_id, ())
        ]
        if not candidates:
            return
        async with self.db.transaction() as conn:
            promoted = await single_active.promote(conn, candidates)
        woken: set[int] = set()
        for queue_id, connection_id in promoted:
            sub = self.registry.get(connection_id, queue_id)
            if sub is None or not self._unwait(sub):
                continue  # ended meanwhile
            sub.waiting = False
            sub.active = True
            sub.outlet.activated(sub.queue_name)
            woken.add(queue_id)
        if woken:
            self.hub.wake(woken)
