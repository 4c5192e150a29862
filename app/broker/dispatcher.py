"""Claim up to each subscriber's credit, in one statement per queue, and push.

A queue has a claim task only while it has work: a wake-up (publish, ACK, release, NOTIFY from
another process) starts one, and it ends once credit or due messages run out. An idle queue
costs no task and no statement. What a lost wake-up would leave waiting, one poll per process
finds (``_poll``, every ``poll_interval``): one statement lists the queues with ready messages
(``storage.deliveries.ready_queues``), and the ones whose first delayed message falls due
before the next poll go on the process's one timer (``_timer``), which wakes each at its due
time (measured on the database clock). The due queues the poll finds, and those the timer
finds due together, are claimed together, with each one's next due time, in one statement
(``_claim_due``): delayed messages falling due over many queues cost a statement per timer
turn, not a claim and a look-up per message, and a poll that finds many queues due after a
lost notification costs one claim, not one per queue.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence

from app.broker.consumers import ConsumerRegistry, Subscription
from app.broker.tasks import TaskOwner
from app.broker.wakeups import WakeHub, wait_event
from app.errors import Unavailable
from app.metrics import Metrics
from app.storage import deliveries, single_active
from app.storage.database import Database
from app.storage.messages import HandedOff

log = logging.getLogger("messagex.dispatch")

#: at most this many rows per claim statement
MAX_CLAIM = 1000
#: when several queues' delayed messages fall due within this long of each other, the timer
#: waits for the last of them and claims them together: at most this late, never early
DUE_TOGETHER = 0.02
#: at most this many owner slots (rows it may claim) in one ``CLAIM_DUE``: the queues due
#: beyond them go in the next statement of the same turn
MAX_DUE_SLOTS = 5000
#: a process with at most this many subscribed queues polls them one by one (one index probe
#: each) rather than listing every queue with ready messages
PROBE_MAX = 100


class Dispatcher:
    def __init__(
        self,
        db: Database,
        hub: WakeHub,
        registry: ConsumerRegistry,
        tasks: TaskOwner,
        metrics: Metrics,
        process_id: str,
        *,
        poll_interval: float = 1.0,
        claim_slots: int = 8,
    ) -> None:
        self.db = db
        self.hub = hub
        self.registry = registry
        self.tasks = tasks
        self.metrics = metrics
        self.process_id = process_id
        self.poll_interval = poll_interval
        self._workers: dict[int, asyncio.Task[None]] = {}
        #: claims (and their next-due look-ups) on the database at once, fewer than the
        #: hot path's pool holds: a publish that wakes a thousand queues starts a thousand
        #: claim tasks, and without a bound they would queue for every connection of the
        #: pool ahead of the next publish and ACK (which then wait out the pool's timeout:
        #: 503). The tasks beyond it wait here, off the pool.
        self._claim_slots = asyncio.Semaphore(max(1, claim_slots))
        #: next-due look-ups waiting for the one in flight (``_seconds_until_due``)
        self._due_wanted: dict[int, list[asyncio.Future[float | None]]] = {}
        self._due_looking = False
        #: queues woken while their task was claiming: it claims again before it ends
        self._again: set[int] = set()
        self._locks: dict[int, asyncio.Lock] = {}
        #: the timer: (loop time, queue id) in a heap, and each queue's earliest entry
        self._due: list[tuple[float, int]] = []
        self._due_at: dict[int, float] = {}
        self._timer_changed = asyncio.Event()
        self._poll_now = asyncio.Event()
        #: rows of the last full poll (queues with ready messages anywhere), and polls since
        self._ready_seen = 0
        self._since_full = 0
        hub.on_wake_all = self._poll_now.set
        #: told when a single-active subscription's claim finds it is not the active one
        #: (broker/single_active.py sets it)
        self.deposed: Callable[[Subscription], None] = lambda sub: None

    def start(self) -> None:
        self.tasks.spawn(self._poll(), name="dispatch-poll")
        self.tasks.spawn(self._timer(), name="dispatch-timer")

    def lock(self, queue_id: int) -> asyncio.Lock:
        """Held while claiming and handing out for a queue, and while its subscriptions change,
        so an UNSUBSCRIBED or a close is never followed by a delivery from that queue."""
        lock = self._locks.get(queue_id)
        if lock is None:
            lock = self._locks[queue_id] = asyncio.Lock()
        return lock

    def watch(self, queue_id: int, watcher: Callable[[int], None] | None = None) -> None:
        """The queue has (or may now have) local subscribers: claim when it is woken (through
        ``watcher``, which calls ``poke``, when given)."""
        if not self.hub.is_watched(queue_id):
            self.hub.watch(queue_id, watcher or self.poke)

    def forget(self, queue_id: int) -> None:
        """The queue may have lost its last local subscriber."""
        if self.registry.has_queue(queue_id):
            return
        self.hub.unwatch(queue_id)
        lock = self._locks.get(queue_id)
        if lock is not None and not lock.locked() and queue_id not in self._workers:
            del self._locks[queue_id]

    def poke(self, queue_id: int) -> None:
        """Messages may be due in the queue, or a subscriber got credit: claim, unless its
        subscribers have no room (an ACK brings them back here)."""
        if queue_id in self._workers:
            self._again.add(queue_id)
        elif self.registry.has_credit(queue_id):
            self._workers[queue_id] = self.tasks.spawn(
                self._run(queue_id), name=f"dispatch-{queue_id}"
            )

    async def _run(self, queue_id: int) -> None:
        try:
            while self.registry.has_queue(queue_id):
                try:
                    async with self._claim_slots:
                        # Wake-ups while it waited for a slot are answered by this claim.
                        self._again.discard(queue_id)
                        drained = await self._dispatch(queue_id)
                    # off the claim slot: look-ups of many queues share one statement
                    due = await self._seconds_until_due(queue_id) if drained else None
                except Unavailable:
                    due = None  # the poll tries again
                except Exception:
                    log.exception("dispatch for queue %s failed", queue_id)
                    due = None
                if queue_id in self._again:
                    continue
                if due is None:
                    break
                if due > 0:
                    self._wake_at(queue_id, due)
                    break
                if self.registry.groups(queue_id):
                    # due copies left behind are held back by their groups' heads: the
                    # settlement of a head wakes the queue (and the poll covers a lost one)
                    break
                # due now but not claimed: rows locked by another claimer; go again
        finally:
            if self._workers.get(queue_id) is asyncio.current_task():
                del self._workers[queue_id]
                self._again.discard(queue_id)
                if not self.registry.has_queue(queue_id):
                    self.forget(queue_id)

    # -- the poll and the timer: what no wake-up announced -------------------------------------

    async def _poll(self) -> None:
        while True:
            await wait_event(self._poll_now, self.poll_interval)
            self._poll_now.clear()
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Unavailable:
                pass
            except Exception:
                log.exception("dispatch poll failed")

    async def poll_once(self) -> None:
        """Wake this process's queues that have due messages; put the ones due before the next
        poll on the timer. One statement, whatever the number of subscribed queues."""
        mine = self.hub.watched()
        if not mine:
            return
        # Listing every queue with ready messages costs a probe per such queue, anywhere;
        # probing ours costs one per queue of ours. Few queues of ours, or (seen by the last
        # full listing) many more busy queues elsewhere: probe ours, and list again now and then.
        probe = len(mine) <= PROBE_MAX or (
            self._ready_seen > 2 * len(mine) and self._since_full < 30
        )
        if probe:
            self._since_full += 1
            rows = await deliveries.ready_queues(self.db.hot, mine)
        else:
            rows = await deliveries.ready_queues(self.db.hot)
            self._ready_seen = len(rows)
            self._since_full = 0
        due_now: list[int] = []
        for queue_id, seconds in rows:
            if not self.hub.is_watched(queue_id):
                continue
            if seconds <= 0:
                due_now.append(queue_id)
            elif seconds < self.poll_interval:
                self._wake_at(queue_id, seconds)
        if due_now:
            # as the timer's due queues: plain ones claimed together in one statement
            self._fire(due_now)

    def wake_later(self, delays: Mapping[int, float]) -> None:
        """Delayed messages were stored: wake each watched queue of ``delays`` (queue id →
        seconds) when its first falls due. Early is harmless (the claim finds nothing and
        reads the due time); not being woken is covered by the poll."""
        for queue_id, seconds in delays.items():
            if self.hub.is_watched(queue_id):
                self._wake_at(queue_id, seconds)

    def _wake_at(self, queue_id: int, seconds: float) -> None:
        when = asyncio.get_running_loop().time() + seconds
        current = self._due_at.get(queue_id)
        if current is not None and current <= when:
            return  # woken before then anyway; that claim looks again
        self._due_at[queue_id] = when
        heapq.heappush(self._due, (when, queue_id))
        if self._due[0] == (when, queue_id):
            self._timer_changed.set()

    async def _timer(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._timer_changed.clear()
            now = loop.time()
            fire: list[int] = []
            if self._due and self._fire_at() <= now:
                while self._due and self._due[0][0] <= now:
                    when, queue_id = heapq.heappop(self._due)
                    if self._due_at.get(queue_id) == when:
                        del self._due_at[queue_id]
                        fire.append(queue_id)
            if fire:
                self._fire(fire)
            wait = self._fire_at() - now if self._due else 3600.0
            await wait_event(self._timer_changed, wait)

    def _fire_at(self) -> float:
        """When the timer turns next: at the first due time, or ``DUE_TOGETHER`` after it when
        another queue falls due within that window (then both go in one claim)."""
        first = self._due[0][0]
        following = self._due[1:3]
        if following and min(following)[0] <= first + DUE_TOGETHER:
            return first + DUE_TOGETHER
        return first

    def _fire(self, queue_ids: list[int]) -> None:
        """The timer's due queues: pulls waiting on them wake; those with local subscribers
        are claimed together (``_claim_due``)."""
        self.hub.wake_waiters(queue_ids)
        watched = [q for q in queue_ids if self.hub.is_watched(q)]
        if watched:
            self.tasks.spawn(self._claim_due(watched), name="dispatch-due-claim")

    async def _claim_due(self, queue_ids: list[int]) -> None:
        """Claim for every queue of ``queue_ids`` that is plain (neither single-active nor
        grouped), has credit and no claim running, in ONE statement (``CLAIM_DUE``) that also
        tells when each has a copy due next; every other queue is woken as a publish wakes
        it. Each claimed queue's lock is held from before the statement until its copies
        are handed out, and it counts as claiming (``_workers``), as its claim task would."""
        me = asyncio.current_task()
        assert me is not None
        taken = await self._take_for_due(queue_ids, me)
        if not taken:
            return
        again: list[int] = []
        try:
            for batch in due_batches({q: len(order) for q, (order, _) in taken.items()}):
                wants = [_want(q, taken[q][0]) for q in batch]
                try:
                    async with self._claim_slots:
                        found = await deliveries.claim_due(self.db.hot, wants, self.process_id)
                except Unavailable:
                    continue  # the poll tries again
                except Exception:
                    log.exception("claim of %d due queues failed", len(wants))
                    again.extend(batch)  # each claims on its own
                    continue
                self.metrics.claims.labels(via="websocket").inc()
                again.extend(self._hand_out_due(taken, found))
        finally:
            again.extend(self._untake(taken, me))
        for queue_id in dict.fromkeys(again):
            self.poke(queue_id)

    def _hand_out_due(
        self,
        taken: Mapping[int, tuple[list[Subscription], int]],
        found: Mapping[int, deliveries.DueClaim],
    ) -> list[int]:
        """Hand out what ``CLAIM_DUE`` found and put each queue back on the timer; returns
        the queues whose claim took all it could (more may wait)."""
        again: list[int] = []
        for queue_id, due in found.items():
            order, wakes = taken[queue_id]
            self._hand_out(queue_id, order, due.claimed)
            if len(due.claimed) < len(order):
                self.hub.drained(queue_id, wakes)
                if due.next_due is not None:
                    self._wake_at(queue_id, due.next_due)
            else:  # it took all it could: more may wait
                self.hub.drained(queue_id, None)
                again.append(queue_id)
        return again

    async def _take_for_due(
        self, queue_ids: list[int], me: asyncio.Task[None]
    ) -> dict[int, tuple[list[Subscription], int]]:
        """``_claim_due``'s queues: locked and marked as claiming by ``me``, each with its
        round-robin order and its wake-up count; the others are woken."""
        taken: dict[int, tuple[list[Subscription], int]] = {}
        others: list[int] = []
        try:
            for queue_id in queue_ids:
                lock = self.lock(queue_id)
                if queue_id in self._workers or lock.locked():
                    others.append(queue_id)  # claiming now: it claims again when it is done
                    continue
                # counts as claiming first, so a wake-up meanwhile waits for this claim
                self._workers[queue_id] = me
                try:
                    # free: taken at once (behind a waiter of a lock just released, if any)
                    await lock.acquire()
                except BaseException:
                    del self._workers[queue_id]
                    raise
                order = self.registry.round_robin(queue_id, MAX_CLAIM)
                if not order or order[0].single_active or order[0].groups:
                    self._untake([queue_id], me)  # woken below, like every other
                    others.append(queue_id)
                    continue
                taken[queue_id] = (order, self.hub.wakes(queue_id))
        except BaseException:
            self._untake(taken, me)
            raise
        if others:
            self.hub.wake(others)
        return taken

    def _untake(self, taken: Iterable[int], me: asyncio.Task[None]) -> list[int]:
        """Unlock what ``_take_for_due`` took; returns those woken meanwhile."""
        again: list[int] = []
        for queue_id in taken:
            self.lock(queue_id).release()
            if self._workers.get(queue_id) is me:
                del self._workers[queue_id]
            if queue_id in self._again:
                self._again.discard(queue_id)
                again.append(queue_id)
            if not self.registry.has_queue(queue_id):
                self.forget(queue_id)
        return again

    async def _dispatch(self, queue_id: int) -> bool:
        """Hand out until credit or ready messages run out.

        Returns True when due messages ran out (the next due time is worth looking up),
        False when credit did (nothing to wait for but a wake-up).
        """
        while True:
            async with self.lock(queue_id):
                order = self.registry.round_robin(queue_id, MAX_CLAIM)
                if not order:
                    self.hub.drained(queue_id, None)
                    return False
                wakes = self.hub.wakes(queue_id)
                if order[0].single_active:
                    found = await self._claim_single(queue_id, order)
                    if found is None:  # not the active one: only a wake-up can change that
                        self.hub.drained(queue_id, None)
                        return False
                    order, claimed = found
                else:
                    claim = deliveries.claim_grouped if order[0].groups else deliveries.claim
                    claimed = await claim(
                        self.db.hot,
                        queue_id=queue_id,
                        n=len(order),
                        lease_seconds=order[0].lease_seconds,
                        process_id=self.process_id,
                        owners=[s.outlet.id for s in order],
                        owner_user=None,
                    )
                self._hand_out(queue_id, order, claimed)
            self.metrics.claims.labels(via="websocket").inc()
            if len(claimed) < len(order):
                self.hub.drained(queue_id, wakes)
                return True
            self.hub.drained(queue_id, None)  # it took all it could: more may wait

    async def _claim_single(
        self, queue_id: int, order: list[Subscription]
    ) -> tuple[list[Subscription], list[deliveries.Claimed]] | None:
        """The claim of a single-active queue, for its one active subscription, through the
        gate (storage/single_active.py); None when the gate says it is not the active one."""
        sub = order[0]
        order = [s for s in order if s is sub]
        claimed = await single_active.claim(
            self.db.hot,
            queue_id=queue_id,
            n=len(order),
            lease_seconds=sub.lease_seconds,
            process_id=self.process_id,
            connection=sub.outlet.id,
            groups=sub.groups,
        )
        if claimed is None:
            self.deposed(sub)
            return None
        return order, claimed

    async def _seconds_until_due(self, queue_id: int) -> float | None:
        """Seconds until the queue's first ready message is due (<= 0: one is), None when it
        has none. The look-ups asked for while one is in flight go together in the next
        (one ``READY_QUEUES_OF`` for all of them): at 1,000 queues with messages falling
        due, one statement per claim instead of two."""
        future: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
        self._due_wanted.setdefault(queue_id, []).append(future)
        if not self._due_looking:
            self._due_looking = True
            self.tasks.spawn(self._look_up_due(), name="dispatch-due")
        return await future

    async def _look_up_due(self) -> None:
        try:
            while self._due_wanted:
                wanted, self._due_wanted = self._due_wanted, {}
                try:
                    rows = await deliveries.ready_queues(self.db.hot, list(wanted))
                except Exception as exc:
                    for futures in wanted.values():
                        for future in futures:
                            if not future.done():
                                future.set_exception(exc)
                    continue
                found = dict(rows)
                for queue_id, futures in wanted.items():
                    for future in futures:
                        if not future.done():
                            future.set_result(found.get(queue_id))
        finally:
            self._due_looking = False

    async def reserve(self, wanted: Mapping[int, int]) -> HandOff | None:
        """Prefetch room for a publish's direct hand-off: for each queue of ``wanted`` (queue
        id → copies) whose dispatcher is idle, who would get its next copies, in round-robin
        order, as a claim would hand them out. Holds those queues' locks (so no claim, and no
        unsubscribe or close, runs in between) until the HandOff is closed; None when no
        queue has room. A busy queue is skipped, not waited for, and so are single-active and
        group queues."""
        orders: dict[int, list[Subscription]] = {}
        locks: list[asyncio.Lock] = []
        for queue_id, n in wanted.items():
            lock = self._locks.get(queue_id)
            if lock is None or lock.locked() or not self.registry.has_queue(queue_id):
                continue
            await lock.acquire()
            locks.append(lock)
            order = self.registry.round_robin(queue_id, min(n, MAX_CLAIM))
            # a single-active queue's copies go through the gate of its claim, never straight,
            # and a group queue's through the group claim (contract §16)
            if order and not order[0].single_active and not order[0].groups:
                orders[queue_id] = order
        if not orders:
            for lock in locks:
                lock.release()
            return None
        return HandOff(self, self.process_id, orders, locks)

    def _hand_out(
        self, queue_id: int, order: list[Subscription], claimed: list[deliveries.Claimed]
    ) -> None:
        batches: dict[int, tuple[Subscription, list[deliveries.Claimed]]] = {}
        grouped: defaultdict[int, list[deliveries.Claimed]] = defaultdict(list)
        for item in claimed:
            sub = order[item.slot]
            sub.unsettled.add(item.delivery_tag)
            grouped[id(sub)].append(item)
            batches[id(sub)] = (sub, grouped[id(sub)])
        for sub, items in batches.values():
            self.registry.holds(sub)
            sub.outlet.deliver(sub, items)
        self.registry.advance(queue_id, len(claimed))
        if claimed:
            self.metrics.delivered.labels(via="websocket").inc(len(claimed))
            activity = self.metrics.activity
            activity.add(activity.delivered, queue_id, len(claimed))


def _want(queue_id: int, order: list[Subscription]) -> deliveries.ClaimWant:
    """A claim of ``queue_id`` for its round-robin ``order`` of subscriptions."""
    return deliveries.ClaimWant(queue_id, [s.outlet.id for s in order], order[0].lease_seconds)


def due_batches(slots: Mapping[int, int], limit: int = MAX_DUE_SLOTS) -> list[list[int]]:
    """The queues of ``slots`` (queue id → owner slots) in batches of at most ``limit`` slots
    each, in order; a queue with more than ``limit`` goes alone."""
    batches: list[list[int]] = []
    batch: list[int] = []
    size = 0
    for queue_id, n in slots.items():
        if batch and size + n > limit:
            batches.append(batch)
            batch, size = [], 0
        batch.append(queue_id)
        size += n
    if batch:
        batches.append(batch)
    return batches


class HandOff:
    """Prefetch room held for one publish write (``Dispatcher.reserve``): which copies may go
    straight to a subscriber, and, once the write has committed, handing them out."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        process_id: str,
        orders: dict[int, list[Subscription]],
        locks: list[asyncio.Lock],
    ) -> None:
        self.process_id = process_id
        self._dispatcher = dispatcher
        self._orders = orders
        self._locks = locks
        self._slots: dict[int, tuple[int, int]] = {}  # copy index -> (queue id, slot)

    def owners(
        self, copies: Sequence[tuple[int, int]], eligible: Callable[[int], bool]
    ) -> list[tuple[str, float] | None]:
        """Per copy ``(message index, queue id)``: (connection, lease) to hand it to, or None.
        Each reserved queue's first eligible copies take its slots in order."""
        used = dict.fromkeys(self._orders, 0)
        owners: list[tuple[str, float] | None] = []
        for index, (message, queue_id) in enumerate(copies):
            order = self._orders.get(queue_id)
            slot = used.get(queue_id, 0)
            if order is None or slot >= len(order) or not eligible(message):
                owners.append(None)
                continue
            used[queue_id] = slot + 1
            self._slots[index] = (queue_id, slot)
            sub = order[slot]
            owners.append((sub.outlet.id, sub.lease_seconds))
        return owners

    def deliver(
        self,
        handed: Sequence[HandedOff],
        build: Callable[[HandedOff, int], deliveries.Claimed],
    ) -> set[int]:
        """After the commit: hand out what was stored in flight, ``build(row, slot)`` making
        each delivery. Returns the queues that got deliveries."""
        per_queue: dict[int, list[deliveries.Claimed]] = {}
        for row in handed:
            queue_id, slot = self._slots[row.copy]
            per_queue.setdefault(queue_id, []).append(build(row, slot))
        for queue_id, items in per_queue.items():
            self._dispatcher._hand_out(queue_id, self._orders[queue_id], items)
        self._dispatcher.metrics.handed_off.inc(len(handed))
        return set(per_queue)

    def close(self) -> None:
        for lock in self._locks:
            lock.release()
        self._locks = []
