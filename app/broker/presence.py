"""Presence: this process in ``broker_processes``, its heartbeat, and the reaping of dead ones.

Every process writes a heartbeat every ``HEARTBEAT_INTERVAL`` and, every
``TAKEOVER_CHECK_INTERVAL``, looks for dead ones (app/domain/presence.py): a process whose
LISTEN backend is gone from ``pg_stat_activity`` and whose heartbeat is older than
``LISTEN_GONE_STALE_AFTER`` (a kill -9: taken over within about 4 s), or whose heartbeat is
older than ``PROCESS_STALE_AFTER`` (the fallback: no LISTEN, a hung process, a pooler). The
others remove it (its subscription rows go with it) and release what its WebSockets held
through the retry path. Pull deliveries have no connection and wait for their ack timeout.
A process taken for dead that is alive after all finds its row gone at its next heartbeat
and registers again with its live subscriptions; the deliveries it held were released, and
its consumers' late ACKs of them are refused as for any released delivery.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable

from app.broker.consumers import ConsumerRegistry
from app.broker.settlement import Settlement
from app.domain.presence import HEARTBEAT_INTERVAL, TAKEOVER_CHECK_INTERVAL
from app.storage import presence
from app.storage.database import Database

log = logging.getLogger("messagex.delivery")

HEARTBEAT_SECONDS = HEARTBEAT_INTERVAL.total_seconds()
TAKEOVER_CHECK_SECONDS = TAKEOVER_CHECK_INTERVAL.total_seconds()
#: the close reason of a connection an administrator closed (contract §20)
CLOSED_BY_ADMIN = "closed by an administrator"


class Presence:
    def __init__(
        self,
        db: Database,
        registry: ConsumerRegistry,
        settlement: Settlement,
        process_id: str,
        listen_pid: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.db = db
        self.registry = registry
        self.settlement = settlement
        self.process_id = process_id
        #: the backend pid of the LISTEN connection, None while it is down (reported)
        self.listen_pid = listen_pid

    async def register(self) -> None:
        async with self.db.transaction() as conn:
            await presence.register_process(
                conn, self.process_id, socket.gethostname(), os.getpid()
            )

    async def leave(self) -> None:
        async with self.db.transaction() as conn:
            await presence.unregister_process(conn, self.process_id)

    async def beat(self) -> None:
        """Write the heartbeat (and register again if we were taken for dead)."""
        settled, self.registry.settled = self.registry.settled, set()
        in_use, size = self.db.pool_use()
        report = presence.Report(len(self.registry.outlets), self.listen_pid(), in_use, size)
        async with self.db.transaction() as conn:
            to_close = await presence.heartbeat(conn, self.process_id, report)
            alive = to_close is not None
            await presence.record_settled(
                conn, [(s.outlet.id, s.queue_id, s.last_settled) for s in settled if s.active]
            )
            if not alive:
                # We were taken for dead (a long pause): come back, with our subscriptions.
                await presence.rejoin(
                    conn,
                    self.process_id,
                    socket.gethostname(),
                    os.getpid(),
                    self._subscriptions(),
                    [(o.id, o.user.username) for o in self.registry.outlets.values()],
                )
        for connection_id in to_close or ():
            outlet = self.registry.outlets.get(connection_id)
            if outlet is not None:
                outlet.close(1008, CLOSED_BY_ADMIN)

    async def reap(self) -> None:
        """Remove the processes that are dead (either rule) and release what they held."""
        async with self.db.transaction() as conn:
            dead = await presence.reap_dead_processes(conn, self.process_id, self.listen_pid())
        if dead:
            log.warning("released the work of %d dead broker process(es)", len(dead))
            await self.settlement.release_processes(dead)

    async def report_listening(self) -> None:
        """Write the LISTEN connection's pid now (it is also written with every heartbeat)."""
        try:
            async with self.db.transaction() as conn:
                await presence.report_listen_pid(conn, self.process_id, self.listen_pid())
        except Exception as exc:  # the next heartbeat writes it
            log.warning("could not report the LISTEN connection (%s)", type(exc).__name__)

    def _subscriptions(self) -> list[tuple[str, int, int]]:
        return [
            (sub.outlet.id, queue_id, sub.prefetch)
            for queue_id in self.registry.queue_ids()
            for sub in self.registry.of_queue(queue_id)
        ]
